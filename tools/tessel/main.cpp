// tessel command-line tool. Each subcommand lives in its own add_*_command function
// (bench/bench_main.hpp for demo and bench); a new one is one more line below.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "bench_main.hpp"
#include "llm_commands.hpp"
#include "runtime/autotune.hpp"
#include "tessel/ops.hpp"

#ifndef TESSEL_VERSION_STRING
#define TESSEL_VERSION_STRING "unknown"
#endif

namespace {

void add_version_command(CLI::App& app, int& rc) {
  CLI::App* cmd = app.add_subcommand("version", "print the tessel and CUDA versions");
  cmd->callback([&rc] {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    std::cout << "tessel " << TESSEL_VERSION_STRING << " (libtessel " << tessel::version()
              << ", CUDA runtime " << runtime / 1000 << "." << (runtime % 1000) / 10
              << ", built for sm_90a)\n";
    rc = 0;
  });
}

// `tessel tune [--family F] [--shapes MxNxK,...]`: fill the autotuner cache ahead of time
// (default family gemm_small_m with its default shapes; see src/runtime/autotune.hpp).
void add_tune_command(CLI::App& app, int& rc) {
  CLI::App* cmd = app.add_subcommand("tune", "fill the autotuner cache ahead of time");
  auto family = std::make_shared<std::string>("gemm_small_m");
  auto shapes = std::make_shared<std::string>();
  cmd->add_option("--family", *family, "kernel family to tune")->capture_default_str();
  cmd->add_option("--shapes", *shapes, "comma-separated MxNxK list (default: the family's own)");
  cmd->callback([&rc, family, shapes] {
    try {
      if (tessel::cuda_device_count() == 0) {
        std::cerr << "tessel tune: no CUDA GPU found\n";
        rc = 2;
        return;
      }
      std::cout << "tessel tune: cache " << tessel::autotune::global_cache().path() << "\n";
      for (const std::string& line :
           tessel::autotune::pretune(*family, tessel::autotune::parse_shapes(*shapes)))
        std::cout << "  " << line << "\n";
      rc = 0;
    } catch (const std::exception& e) {
      std::cerr << "tessel tune: " << e.what() << "\n";
      rc = 2;
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel: tile-programmed GPU kernels for NVIDIA Hopper (sm_90a)", "tessel"};
  app.require_subcommand(1);
  int rc = 0;
  add_version_command(app, rc);
  tessel::cli::add_demo_command(app, rc);
  tessel::cli::add_bench_command(app, rc);
  add_tune_command(app, rc);
  tessel::cli::add_llm_commands(app, rc);
  CLI11_PARSE(app, argc, argv);
  return rc;
}
