// `tessel demo` and `tessel bench`: run registered suites, print a table, write JSON.
//
// Exit status: 0 all checks OK; 1 a correctness check failed (or ours threw);
// 2 no CUDA GPU, an unknown suite, or an error that stopped the run.
#include "bench_main.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "harness.hpp"

namespace tessel::cli {
namespace {

using bench::Peaks;
using bench::Record;
namespace fs = std::filesystem;

struct Options {
  std::vector<std::string> suites;
  std::string json;     // one file (one suite) or FILE.<suite>.json per suite
  std::string out_dir;  // DIR/<gpu-slug>/<suite>.json
  bool list = false;
  bool verbose = false;
  std::string filter;
  int iters = 20;
  int warmup = 3;
};

struct SuiteResult {
  std::string suite;
  std::vector<Record> records;
  std::string error;  // non-empty if the suite stopped early
};

constexpr const char* kNoGpu = "no CUDA GPU found";

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"
std::string gpu_slug(const std::string& name) {
  std::string s;
  for (char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c)) {
      s += static_cast<char>(std::tolower(c));
    } else if (!s.empty() && s.back() != '-') {
      s += '-';
    }
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  if (s.rfind("nvidia-", 0) == 0) s = s.substr(7);
  return s.empty() ? "unknown-gpu" : s;
}

nlohmann::ordered_json to_json(const SuiteResult& r, const Peaks& peaks, const std::string& gpu,
                               const std::string& commit, const std::string& date) {
  nlohmann::ordered_json j;
  j["gpu"] = gpu;
  j["commit"] = commit;
  j["date"] = date;
  j["suite"] = r.suite;
  j["peaks"] = {{"copy_GBps", peaks.copy_GBps}, {"bf16_TFLOPs", peaks.bf16_TFLOPs}};
  auto recs = nlohmann::ordered_json::array();
  for (const Record& rec : r.records) {
    nlohmann::ordered_json shape = nlohmann::ordered_json::object();
    for (const auto& [k, v] : rec.shape) shape[k] = v;
    nlohmann::ordered_json o;
    o["op"] = rec.op;
    o["case"] = rec.case_;
    o["shape"] = shape;
    o["dtype"] = rec.dtype;
    o["metric"] = rec.metric;
    for (const auto& [k, v] : rec.flags) o[k] = v;
    o["ours"] = rec.ours;
    o["baseline"] = rec.baseline;
    o["baseline_value"] = rec.baseline_value;
    o["ratio"] = rec.ratio;
    o["peak_fraction"] = rec.peak_fraction;
    // Additions to the base schema (readers may ignore them).
    o["ours_ms"] = rec.ours_ms;
    o["baseline_ms"] = rec.baseline_ms;
    o["target"] = rec.target;
    o["target_met"] = rec.target_met;
    o["check"] = rec.check;
    o["check_detail"] = rec.check_detail;
    recs.push_back(std::move(o));
  }
  j["records"] = std::move(recs);
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

void write_json(const fs::path& path, const nlohmann::ordered_json& j) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path.string());
  f << j.dump(2) << "\n";
  if (!f) throw std::runtime_error("error writing " + path.string());
  std::cout << "wrote " << path.string() << "\n";
}

std::string fit(std::string s, size_t width) {
  if (s.size() > width) s = s.substr(0, width - 3) + "...";
  return s;
}

void print_table(const std::vector<SuiteResult>& results, const Peaks& peaks, bool with_check) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"op", "case", "dtype", "ours", "baseline", "baseline value", "ratio",
                  "% copy peak", "target"});
  if (with_check) rows.front().push_back("check");
  for (const auto& r : results) {
    for (const Record& rec : r.records) {
      const bool ran = rec.ours_ms > 0;
      std::vector<std::string> row = {
          rec.op,
          fit(rec.case_, 64),
          rec.dtype,
          ran ? fmt("%.1f ", rec.ours) + rec.metric : "-",
          fit(rec.baseline, 40),
          fmt("%.1f ", rec.baseline_value) + rec.metric,
          ran ? fmt("%.3f", rec.ratio) : "-",
          ran ? fmt("%.1f%%", 100.0 * rec.ours / (peaks.copy_GBps > 0 ? peaks.copy_GBps : 1)) : "-",
          rec.target.empty() ? "-" : rec.target + (rec.target_met ? " met" : " MISSED")};
      if (rec.metric != "GB/s") row[7] = "-";
      if (with_check) row.push_back(rec.check == "OK" ? "OK" : "FAIL");
      rows.push_back(std::move(row));
    }
  }
  std::vector<size_t> w(rows.front().size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  auto line = [&](const std::vector<std::string>& row) {
    std::string s;
    for (size_t i = 0; i < row.size(); ++i) {
      const bool numeric = i == 3 || i == 5 || i == 6 || i == 7;
      const std::string pad(w[i] - row[i].size(), ' ');
      s += numeric ? pad + row[i] : row[i] + pad;
      if (i + 1 < row.size()) s += "  ";
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::cout << s << "\n";
  };
  line(rows.front());
  size_t total = 0;
  for (size_t x : w) total += x + 2;
  std::cout << std::string(total - 2, '-') << "\n";
  for (size_t i = 1; i < rows.size(); ++i) line(rows[i]);
  // Details of failed checks after the table.
  for (const auto& r : results) {
    for (const Record& rec : r.records)
      if (rec.check != "OK")
        std::cout << rec.check << ": " << rec.op << " " << rec.dtype << " " << rec.case_ << ": "
                  << rec.check_detail << "\n";
    if (!r.error.empty()) std::cout << "suite " << r.suite << " stopped: " << r.error << "\n";
  }
}

// Runs the suites; returns the exit status.
int run(const Options& opt, bool demo) {
  if (opt.list) {
    for (const auto& s : bench::suites()) std::cout << s.name << "\t" << s.description << "\n";
    return 0;
  }
  std::vector<const bench::Suite*> todo;
  if (opt.suites.empty()) {
    for (const auto& s : bench::suites()) todo.push_back(&s);
  } else {
    for (const auto& name : opt.suites) {
      const bench::Suite* s = bench::find_suite(name);
      if (!s) {
        std::cerr << "tessel: unknown suite '" << name << "' (see `tessel bench --list`)\n";
        return 2;
      }
      todo.push_back(s);
    }
  }
  if (bench::gpu_count() == 0) {
    std::cerr << "tessel " << (demo ? "demo" : "bench") << ": " << kNoGpu << "\n";
    return 2;
  }
  if (opt.iters < 1 || opt.warmup < 0) {
    std::cerr << "tessel: --iters must be >= 1 and --warmup >= 0\n";
    return 2;
  }

  const std::string gpu = bench::gpu_name();
  const std::string commit = bench::commit();
  const std::string date = bench::iso_date_utc();
  cudaStream_t stream = nullptr;
  Peaks peaks;
  try {
    TESSEL_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::cout << "tessel " << (demo ? "demo" : "bench") << " on " << gpu << " (commit " << commit
              << ", " << date << ", median of " << opt.iters << " after " << opt.warmup
              << " warm-up, L2 flushed"
              << (std::getenv("TESSEL_BENCH_HOLD") && std::string(std::getenv("TESSEL_BENCH_HOLD")) == "0"
                      ? ""
                      : ", stream held while enqueuing")
              << ")\n";
    bench::MeasureOptions mo;
    mo.iters = opt.iters;
    mo.warmup = opt.warmup;
    peaks = bench::measure_peaks(stream, mo);
    std::cout << "peaks: copy " << fmt("%.1f", peaks.copy_GBps) << " GB/s (cudaMemcpy D2D 1 GiB), "
              << "bf16 GEMM " << fmt("%.1f", peaks.bf16_TFLOPs) << " TFLOP/s (cuBLAS 8192^3)\n\n";
  } catch (const std::exception& e) {
    std::cerr << "tessel: " << e.what() << "\n";
    return 2;
  }

  bench::RunOptions ro;
  ro.iters = opt.iters;
  ro.warmup = opt.warmup;
  ro.verbose = opt.verbose;
  ro.filter = opt.filter;
  std::vector<SuiteResult> results;
  bool fatal = false;
  for (const bench::Suite* s : todo) {
    SuiteResult res;
    res.suite = s->name;
    if (opt.verbose) std::cerr << "suite " << s->name << "\n";
    try {
      bench::SuiteContext ctx(ro, peaks, stream);
      try {
        s->fn(ctx);
      } catch (const std::exception& e) {
        res.error = e.what();
      }
      res.records = std::move(ctx.records());
    } catch (const std::exception& e) {
      res.error = e.what();
    }
    if (res.error.rfind("CUDA context lost", 0) == 0) fatal = true;
    results.push_back(std::move(res));
    if (fatal) break;
  }

  print_table(results, peaks, true);

  int rc = 0;
  for (const auto& r : results) {
    if (!r.error.empty()) rc = 2;
    for (const Record& rec : r.records)
      if (rec.check != "OK" && rc == 0) rc = 1;
  }
  try {
    for (const auto& r : results) {
      const auto j = to_json(r, peaks, gpu, commit, date);
      if (!opt.json.empty()) {
        fs::path p = opt.json;
        if (results.size() > 1 || fs::is_directory(p) || opt.json.back() == '/') {
          if (fs::is_directory(p) || opt.json.back() == '/') {
            p /= r.suite + ".json";
          } else {
            p = p.parent_path() / (p.stem().string() + "." + r.suite + p.extension().string());
          }
        }
        write_json(p, j);
      }
      if (!opt.out_dir.empty())
        write_json(fs::path(opt.out_dir) / gpu_slug(gpu) / (r.suite + ".json"), j);
    }
  } catch (const std::exception& e) {
    std::cerr << "tessel: " << e.what() << "\n";
    rc = 2;
  }
  if (stream) cudaStreamDestroy(stream);
  if (demo) std::cout << (rc == 0 ? "demo: all checks OK\n" : "demo: FAILED\n");
  return rc;
}

void add_common(CLI::App* cmd, Options& o) {
  cmd->add_option("--iters", o.iters,
                  "timed iterations per measurement (median; >= 20 for reports)")
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed warm-up iterations")->capture_default_str();
  cmd->add_option(
      "--filter", o.filter,
      "only these ops, comma-separated (add,copy,transpose,reduce_sum,softmax_fwd,...)");
  cmd->add_flag("-v,--verbose", o.verbose, "print each record as it is measured");
}

}  // namespace

void add_demo_command(CLI::App& app, int& rc) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "check every kernel against its baseline and time both (exit 1 if a check fails)");
  add_common(cmd, *opt);
  cmd->callback([opt, &rc] { rc = run(*opt, true); });
}

void add_bench_command(CLI::App& app, int& rc) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench", "benchmark suites against their baselines");
  cmd->add_option("suites", opt->suites, "suites to run (default: all; see --list)");
  cmd->add_option("--json", opt->json,
                  "write results to FILE (several suites: FILE.<suite>.json, or DIR/<suite>.json)");
  cmd->add_option("--out-dir", opt->out_dir,
                  "also write DIR/<gpu>/<suite>.json (e.g. bench/results)");
  cmd->add_flag("--list", opt->list, "list the registered suites and exit");
  add_common(cmd, *opt);
  cmd->callback([opt, &rc] { rc = run(*opt, false); });
}

}  // namespace tessel::cli
