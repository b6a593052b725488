// Benchmark harness: timer with L2 flush, device peaks, suite registry, run metadata.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "harness.hpp"
#include "runtime/l2_flush.hpp"

namespace tessel::bench {

void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err) + " (" + file +
                           ":" + std::to_string(line) + ")");
}

// ---- Timer ---------------------------------------------------------------------------

Timer::Timer(cudaStream_t stream) : stream_(stream) {
  int dev = 0;
  TESSEL_BENCH_CUDA(cudaGetDevice(&dev));
  int l2 = 0;
  TESSEL_BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  scratch_bytes_ = std::max<size_t>(size_t{2} * static_cast<size_t>(l2), size_t{64} << 20);
  TESSEL_BENCH_CUDA(cudaMalloc(&scratch_, scratch_bytes_));
  // Defined contents for the read-only flush; its first pass evicts these dirty lines.
  TESSEL_BENCH_CUDA(cudaMemset(scratch_, 0, scratch_bytes_));
}

Timer::~Timer() {
  cudaFree(scratch_);
  if (hold_flag_) cudaFreeHost(const_cast<int*>(hold_flag_));
}

static bool hold_enabled() {
  const char* v = std::getenv("TESSEL_BENCH_HOLD");
  return !(v && v[0] == '0' && v[1] == 0);
}

namespace {
// Spins until the host sets *flag (mapped pinned memory) or `timeout_ns` of GPU time pass;
// the timeout turns a benchmark body that synchronizes on the host (which would deadlock
// behind the hold) into an unheld measurement instead of a hang.
__global__ void hold_until_released(const volatile int* flag, int* timed_out,
                                    unsigned long long timeout_ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*flag == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(1000);
  }
}
}  // namespace

// Reads the zero-filled scratch (2x L2): L2 then holds only clean lines (a memset's dirty
// lines would be written back inside the timed kernel).
void Timer::flush() { detail::l2_flush_read(scratch_, scratch_bytes_, stream_); }

double Timer::measure(const std::function<void()>& fn, const MeasureOptions& opt) {
  return measure_interleaved({fn}, opt)[0];
}

std::pair<double, double> Timer::measure_pair(const std::function<void()>& a,
                                              const std::function<void()>& b,
                                              const MeasureOptions& opt) {
  const std::vector<double> ms = measure_interleaved({a, b}, opt);
  return {ms[0], ms[1]};
}

std::vector<double> Timer::measure_interleaved(const std::vector<std::function<void()>>& fns,
                                               const MeasureOptions& opt) {
  const int iters = std::max(1, opt.iters);
  const int nf = static_cast<int>(fns.size());
  for (int i = 0; i < opt.warmup; ++i)
    for (const auto& fn : fns) {
      if (opt.flush_l2) flush();
      fn();
    }
  // Events [i * nf + f]: iteration i of body f; the bodies alternate within each iteration.
  const int n = iters * nf;
  std::vector<cudaEvent_t> start(n), stop(n);
  for (int i = 0; i < n; ++i) {
    TESSEL_BENCH_CUDA(cudaEventCreate(&start[i]));
    TESSEL_BENCH_CUDA(cudaEventCreate(&stop[i]));
  }
  std::vector<double> ms(n);
  const bool hold = opt.hold && hold_enabled();
  if (hold && !hold_flag_) {
    int* p = nullptr;
    TESSEL_BENCH_CUDA(cudaHostAlloc(&p, 2 * sizeof(int), cudaHostAllocMapped));
    hold_flag_ = p;
    hold_timed_out_ = p + 1;
  }
  try {
    int* flag_dev = nullptr;
    int* timed_out_dev = nullptr;
    if (hold) {
      *hold_flag_ = 0;
      *hold_timed_out_ = 0;
      TESSEL_BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev),
                                                 const_cast<int*>(hold_flag_), 0));
      timed_out_dev = flag_dev + 1;
      hold_until_released<<<1, 1, 0, stream_>>>(flag_dev, timed_out_dev, 2000000000ull);
      TESSEL_BENCH_CUDA(cudaGetLastError());
    }
    std::vector<double> host_us(n);
    for (int i = 0; i < iters; ++i)
      for (int f = 0; f < nf; ++f) {
        const int e = i * nf + f;
        if (opt.flush_l2) flush();
        TESSEL_BENCH_CUDA(cudaEventRecord(start[e], stream_));
        const auto t0 = std::chrono::steady_clock::now();
        fns[f]();
        host_us[e] =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count();
        TESSEL_BENCH_CUDA(cudaEventRecord(stop[e], stream_));
      }
    if (const char* v = std::getenv("TESSEL_BENCH_HOST_TIMES"); v && v[0] == '1') {
      std::sort(host_us.begin(), host_us.end());
      std::fprintf(stderr, "tessel bench: host enqueue of one body: median %.1f us, max %.1f us\n",
                   host_us[n / 2], host_us.back());
    }
    if (hold) {
      __atomic_store_n(const_cast<int*>(hold_flag_), 1, __ATOMIC_SEQ_CST);
    }
    TESSEL_BENCH_CUDA(cudaStreamSynchronize(stream_));
    if (hold && *hold_timed_out_) {
      std::fprintf(stderr,
                   "tessel bench: the measured body waited on the host; timed unheld instead\n");
    }
    TESSEL_BENCH_CUDA(cudaGetLastError());
    for (int i = 0; i < n; ++i) {
      float t = 0.f;
      TESSEL_BENCH_CUDA(cudaEventElapsedTime(&t, start[i], stop[i]));
      ms[i] = t;
    }
  } catch (...) {
    if (hold) __atomic_store_n(const_cast<int*>(hold_flag_), 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < n; ++i) {
      cudaEventDestroy(start[i]);
      cudaEventDestroy(stop[i]);
    }
    throw;
  }
  for (int i = 0; i < n; ++i) {
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
  }
  std::vector<double> medians(nf);
  for (int f = 0; f < nf; ++f) {
    std::vector<double> v(iters);
    for (int i = 0; i < iters; ++i) v[i] = ms[i * nf + f];
    std::sort(v.begin(), v.end());
    medians[f] = iters % 2 ? v[iters / 2] : 0.5 * (v[iters / 2 - 1] + v[iters / 2]);
  }
  return medians;
}

// ---- SuiteContext --------------------------------------------------------------------

SuiteContext::SuiteContext(const RunOptions& run, const Peaks& peaks, cudaStream_t stream)
    : run_(run), peaks_(peaks), stream_(stream), timer_(stream) {}

MeasureOptions SuiteContext::measure_options() const {
  MeasureOptions m;
  m.iters = run_.iters;
  m.warmup = run_.warmup;
  return m;
}

bool SuiteContext::wants(const std::string& op) const {
  if (run_.filter.empty()) return true;
  size_t pos = 0;
  while (pos <= run_.filter.size()) {
    const size_t end = std::min(run_.filter.find(',', pos), run_.filter.size());
    if (run_.filter.compare(pos, end - pos, op) == 0 && end - pos == op.size()) return true;
    pos = end + 1;
  }
  return false;
}

void SuiteContext::add(Record r) {
  r.ratio = r.baseline_value > 0 ? r.ours / r.baseline_value : 0.0;
  const double peak = r.metric == "TFLOP/s" ? peaks_.bf16_TFLOPs : peaks_.copy_GBps;
  r.peak_fraction = peak > 0 ? r.ours / peak : 0.0;
  // Targets are "<ratio|peak_fraction>>=<threshold>"; a record without one has none to miss.
  r.target_met = true;
  const size_t ge = r.target.find(">=");
  if (ge != std::string::npos) {
    const std::string key = r.target.substr(0, ge);
    const double threshold = std::stod(r.target.substr(ge + 2));
    if (key == "ratio")
      r.target_met = r.ratio >= threshold;
    else if (key == "peak_fraction")
      r.target_met = r.peak_fraction >= threshold;
    else
      throw std::runtime_error("bench: unknown target '" + r.target + "'");
  }
  if (r.check != "OK") r.target_met = false;
  if (run_.verbose) {
    std::fprintf(stderr, "  %-12s %-40s %-10s ours %9.2f %s  %s %9.2f  check %s %s\n", r.op.c_str(),
                 r.case_.c_str(), r.dtype.c_str(), r.ours, r.metric.c_str(), r.baseline.c_str(),
                 r.baseline_value, r.check.c_str(), r.check_detail.c_str());
  }
  records_.push_back(std::move(r));
}

// ---- registry ------------------------------------------------------------------------

namespace {
std::vector<Suite>& registry() {
  static std::vector<Suite> r;
  return r;
}
}  // namespace

void register_suite(std::string name, std::string description, SuiteFn fn) {
  auto& r = registry();
  r.push_back(Suite{std::move(name), std::move(description), std::move(fn)});
  std::sort(r.begin(), r.end(), [](const Suite& a, const Suite& b) { return a.name < b.name; });
}

const std::vector<Suite>& suites() { return registry(); }

const Suite* find_suite(const std::string& name) {
  for (const auto& s : registry())
    if (s.name == name) return &s;
  return nullptr;
}

// ---- peaks ---------------------------------------------------------------------------

namespace {

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " +
                             std::to_string(static_cast<int>(st)));
}

}  // namespace

Peaks measure_peaks(cudaStream_t stream, const MeasureOptions& opt) {
  Peaks p;
  Timer timer(stream);
  {  // copy bandwidth: 1 GiB device-to-device, bytes = read + written
    const size_t bytes = size_t{1} << 30;
    DeviceMem src(bytes), dst(bytes);
    fill_bits(src.get(), bytes, 1u, stream);
    const double ms = timer.measure(
        [&] {
          TESSEL_BENCH_CUDA(
              cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
        },
        opt);
    p.copy_GBps = gbps(2.0 * static_cast<double>(bytes), ms);
  }
  {  // bf16 GEMM rate: C = A B, 8192^3, bf16 in/out, fp32 compute, random data
    const int n = 8192;
    const size_t elems = size_t{n} * n;
    DeviceMem a(elems * 2), b(elems * 2), c(elems * 2);
    fill_uniform(static_cast<__nv_bfloat16*>(a.get()), elems, 11u, -1.f, 1.f, stream);
    fill_uniform(static_cast<__nv_bfloat16*>(b.get()), elems, 12u, -1.f, 1.f, stream);
    cublasHandle_t h = nullptr;
    cublas_check(cublasCreate(&h), "cublasCreate");
    std::unique_ptr<cublasContext, void (*)(cublasHandle_t)> guard(
        h, [](cublasHandle_t x) { cublasDestroy(x); });
    cublas_check(cublasSetStream(h, stream), "cublasSetStream");
    const float alpha = 1.f, beta = 0.f;
    MeasureOptions gemm_opt = opt;
    gemm_opt.flush_l2 = false;  // compute bound; 3 x 128 MiB operands exceed L2 anyway
    const double ms = timer.measure(
        [&] {
          cublas_check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(),
                                    CUDA_R_16BF, n, b.get(), CUDA_R_16BF, n, &beta, c.get(),
                                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
        },
        gemm_opt);
    p.bf16_TFLOPs = ms > 0 ? 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12 : 0.0;
  }
  return p;
}

// ---- metadata ------------------------------------------------------------------------

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

std::string gpu_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return "unknown";
  return prop.name;
}

namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string run_git(const std::string& dir) {
  const std::string cmd = "git -C '" + dir + "' rev-parse --short HEAD 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return {};
  std::array<char, 128> buf{};
  std::string out;
  while (fgets(buf.data(), static_cast<int>(buf.size()), f)) out += buf.data();
  const int rc = pclose(f);
  out = trim(out);
  if (rc != 0 || out.empty() || out.find_first_not_of("0123456789abcdef") != std::string::npos)
    return {};
  return out;
}

}  // namespace

std::string commit() {
  if (const char* env = std::getenv("TESSEL_COMMIT"); env && *env) return env;
  // The repository of the executable (build dirs live inside the checkout), then the cwd.
  std::array<char, 4096> exe{};
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (n > 0) {
    std::string dir(exe.data(), static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    if (auto c = run_git(dir); !c.empty()) return c;
  }
  if (auto c = run_git("."); !c.empty()) return c;
  return "unknown";
}

std::string iso_date_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace tessel::bench
