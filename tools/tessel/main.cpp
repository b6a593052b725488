// tessel command-line tool. Each subcommand lives in its own add_*_command function
// (bench/bench_main.hpp for demo and bench); a new one is one more line below.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "bench_main.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel: tile-programmed GPU kernels for NVIDIA Hopper (sm_90a)", "tessel"};
  app.require_subcommand(1);
  int rc = 0;
  add_version_command(app, rc);
  tessel::cli::add_demo_command(app, rc);
  tessel::cli::add_bench_command(app, rc);
  CLI11_PARSE(app, argc, argv);
  return rc;
}
