// Benchmark harness shared by every `tessel bench` suite.
//
// Timing: each timed iteration is bracketed by its own pair of CUDA events on the bench
// stream; the result is the median over `iters` iterations after `warmup` untimed ones.
// Cache policy: before every iteration (warm-up and timed) the harness reads a scratch
// buffer of 2x the device's L2 size with a kernel, outside the event pair, so no timed
// iteration starts with its inputs resident in L2 ("L2 flushed", not rotated inputs) and
// L2 holds no dirty lines whose write-back would land inside the timed kernel.
//
// Suites register themselves with TESSEL_BENCH_SUITE (static registration) and append one
// Record per (op, case) to the SuiteContext. This header is plain C++ (no CUDA kernels,
// no JSON library) so it can be included from .cpp and .cu files alike.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tessel::bench {

// Throws std::runtime_error naming the failed call.
void cuda_check(cudaError_t err, const char* what, const char* file, int line);
#define TESSEL_BENCH_CUDA(expr) ::tessel::bench::cuda_check((expr), #expr, __FILE__, __LINE__)

struct Peaks {
  double copy_GBps = 0.0;    // cudaMemcpyAsync D2D of 1 GiB, bytes read + written
  double bf16_TFLOPs = 0.0;  // cublasGemmEx 8192^3, bf16 in/out, fp32 compute
};

struct MeasureOptions {
  int warmup = 3;
  int iters = 20;
  bool flush_l2 = true;
  // Hold the stream with a kernel that waits on a host flag while every timed iteration is
  // enqueued (as nvbench's blocking kernel does), so the host's launch cost (validation,
  // TMA descriptors, cudaLaunchKernelEx) never leaves the GPU idle between a pair of events.
  // On by default; TESSEL_BENCH_HOLD=0 turns it off.
  bool hold = true;
};

// One row of the results table and of the JSON file.
struct Record {
  std::string op;     // add, copy, transpose, reduce_sum, softmax_fwd, softmax_bwd, ...
  std::string case_;  // free text, e.g. "16384x8192 same-shape"
  std::vector<std::pair<std::string, int64_t>> shape;  // e.g. {{"rows", 16384}, {"cols", 4096}}
  // Boolean properties written as top-level JSON booleans, e.g. {{"causal", true}}.
  std::vector<std::pair<std::string, bool>> flags;
  std::string dtype;            // "bf16", "f32", "bf16->f32"
  std::string metric;           // "GB/s" or "TFLOP/s"
  double ours = 0.0;            // achieved, in metric units
  std::string baseline;         // baseline's name
  double baseline_value = 0.0;  // baseline's achieved value
  double ratio = 0.0;           // ours / baseline_value
  double peak_fraction = 0.0;   // ours / peaks.copy_GBps (GB/s) or bf16_TFLOPs (TFLOP/s)
  double ours_ms = 0.0;         // median times, for the console table
  double baseline_ms = 0.0;
  // Target made visible in tables and JSON: "peak_fraction>=0.90" or "ratio>=0.95".
  std::string target;
  bool target_met = false;
  // Correctness of ours, checked once before timing: "OK", "FAIL" or "ERROR".
  std::string check = "OK";
  std::string check_detail;  // max error / mismatch count / exception text
};

// Median time in milliseconds of fn() enqueued on `stream`.
class Timer {
 public:
  explicit Timer(cudaStream_t stream);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  double measure(const std::function<void()>& fn, const MeasureOptions& opt);
  // Median times of two bodies timed alternately (a, b, a, b, ...): clock and power drift
  // during the run shifts both alike, so their ratio is steadier than that of two
  // back-to-back measure() calls.
  std::pair<double, double> measure_pair(const std::function<void()>& a,
                                         const std::function<void()>& b, const MeasureOptions& opt);
  // Medians of several bodies, alternating within each iteration.
  std::vector<double> measure_interleaved(const std::vector<std::function<void()>>& fns,
                                          const MeasureOptions& opt);
  cudaStream_t stream() const { return stream_; }

 private:
  void flush();
  cudaStream_t stream_;
  volatile int* hold_flag_ = nullptr;  // mapped pinned memory: 0 = wait, 1 = release
  int* hold_timed_out_ = nullptr;      // set by the hold kernel if the host never released it
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

struct RunOptions {
  int iters = 20;
  int warmup = 3;
  bool verbose = false;
  std::string filter;  // comma-separated op names; empty = all
  bool hold = true;    // MeasureOptions::hold
};

class SuiteContext {
 public:
  SuiteContext(const RunOptions& run, const Peaks& peaks, cudaStream_t stream);

  const RunOptions& run() const { return run_; }
  const Peaks& peaks() const { return peaks_; }
  cudaStream_t stream() const { return stream_; }
  Timer& timer() { return timer_; }
  MeasureOptions measure_options() const;
  // False if --filter is set and does not name `op` (suites skip such cases).
  bool wants(const std::string& op) const;

  // Fills in ratio, peak_fraction and target_met from ours / baseline_value, then keeps it.
  void add(Record r);
  std::vector<Record>& records() { return records_; }

 private:
  RunOptions run_;
  Peaks peaks_;
  cudaStream_t stream_;
  Timer timer_;
  std::vector<Record> records_;
};

using SuiteFn = std::function<void(SuiteContext&)>;
struct Suite {
  std::string name;
  std::string description;
  SuiteFn fn;
};

void register_suite(std::string name, std::string description, SuiteFn fn);
const std::vector<Suite>& suites();  // in registration order, sorted by name
const Suite* find_suite(const std::string& name);

struct SuiteRegistrar {
  SuiteRegistrar(const char* name, const char* description, void (*fn)(SuiteContext&)) {
    register_suite(name, description, fn);
  }
};
#define TESSEL_BENCH_SUITE(name, description, fn) \
  static ::tessel::bench::SuiteRegistrar tessel_bench_registrar_##fn(name, description, fn)

// Device peaks; measured once per process at the start of `bench` and `demo`.
Peaks measure_peaks(cudaStream_t stream, const MeasureOptions& opt);

// Metadata for the JSON header.
std::string gpu_name();      // cudaGetDeviceProperties().name
std::string commit();        // $TESSEL_COMMIT, else `git rev-parse --short HEAD`, else "unknown"
std::string iso_date_utc();  // 2025-01-31T12:34:56Z

// CUDA devices visible; 0 on a machine without driver or GPU (never throws).
int gpu_count();

// GB/s for `bytes` moved in `ms`.
inline double gbps(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0; }

}  // namespace tessel::bench
