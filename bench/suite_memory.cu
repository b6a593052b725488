// Bench suite "memory": the bandwidth-bound ops against their vendor baselines.
//
//   add          vs cub::DeviceTransform::Transform (same functor: fp32 math, one rounding)
//   copy         vs cudaMemcpyAsync (device to device)
//   transpose    vs cublasLtMatrixTransform (op(A) = Aᵀ)
//   reduce_sum   vs cub::DeviceReduce (temp storage allocated once, outside timing)
//   softmax_fwd  vs cudnnSoftmaxForward  (dlopen'ed; CUDNN_SOFTMAX_ACCURATE, the faster of
//   softmax_bwd  vs cudnnSoftmaxBackward  modes CHANNEL and INSTANCE, NCHW n=rows c=cols h=w=1)
// A baseline that cannot run (cuDNN missing, a type it refuses) is replaced by
// "cudaMemcpy (roofline)": a device-to-device copy moving the same byte count; the case text
// says so. Bytes = each input read once + each output written once. Every case checks ours
// once before timing: against the baseline's output and, for softmax and reduce_sum, against
// a float64 reference (sampled rows / the whole tensor on the GPU).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_transform.cuh>
#include <cuda/std/tuple>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_util.cuh"
#include "cudnn_dl.hpp"
#include "harness.hpp"
#include "tessel/ops.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

template <class T>
struct TypeInfo;
template <>
struct TypeInfo<float> {
  static constexpr DType dtype = DType::f32;
  static constexpr cudaDataType_t cuda = CUDA_R_32F;
  static constexpr cudnnDataType_t cudnn = CUDNN_DATA_FLOAT;
  static constexpr const char* name = "f32";
  static constexpr float rtol = 1e-5f;  // one fp32 op chain vs another
};
template <>
struct TypeInfo<__nv_bfloat16> {
  static constexpr DType dtype = DType::bf16;
  static constexpr cudaDataType_t cuda = CUDA_R_16BF;
  static constexpr cudnnDataType_t cudnn = CUDNN_DATA_BFLOAT16;
  static constexpr const char* name = "bf16";
  static constexpr float rtol = 1.6e-2f;  // two bf16 ulps
};

template <class T>
Tensor view2d(void* p, int64_t rows, int64_t cols) {
  return Tensor::contiguous(p, TypeInfo<T>::dtype, {rows, cols});
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB moved", bytes / kMiB);
  return buf;
}

// ---- case runner ---------------------------------------------------------------------

struct Case {
  Record rec;                            // op, case_, shape, dtype, baseline, target
  double bytes = 0;                      // algorithmic bytes moved
  std::function<void()> ours;            // enqueue ours on the suite stream
  std::function<void()> baseline;        // enqueue the baseline
  std::function<CompareResult()> check;  // after one run of each
};

// A d2d memcpy moving `bytes` (read + written): the roofline baseline.
struct Roofline {
  explicit Roofline(double bytes)
      : half(static_cast<size_t>(bytes / 2) & ~size_t{255}), src(half), dst(half) {}
  void run(cudaStream_t s) const {
    TESSEL_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), half, cudaMemcpyDeviceToDevice, s));
  }
  size_t half;
  DeviceMem src, dst;
};
constexpr const char* kRooflineName = "cudaMemcpy (roofline)";

void sync_or_throw(cudaStream_t s) {
  TESSEL_BENCH_CUDA(cudaStreamSynchronize(s));
  TESSEL_BENCH_CUDA(cudaGetLastError());
}

// A failed device call that leaves the context unusable ends the run.
void throw_if_context_lost() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA context lost: ") + cudaGetErrorString(e));
}

void run_case(SuiteContext& ctx, Case c) {
  Record r = std::move(c.rec);
  r.metric = "GB/s";
  const cudaStream_t s = ctx.stream();
  // A baseline that fails leaves nothing to compare with: the record says ERROR, ours is
  // still timed, the suite goes on.
  bool baseline_ran = false;
  try {
    c.baseline();
    sync_or_throw(s);
    baseline_ran = true;
  } catch (const std::exception& e) {
    r.check = "ERROR";
    r.check_detail = "baseline " + r.baseline + " failed: " + e.what();
    throw_if_context_lost();
  }
  bool ours_ran = false;
  try {
    c.ours();
    sync_or_throw(s);
    ours_ran = true;
  } catch (const std::exception& e) {
    r.check = "ERROR";
    r.check_detail = e.what();
    throw_if_context_lost();
  }
  if (ours_ran && baseline_ran) {
    const CompareResult cr = c.check();
    r.check = cr.ok ? "OK" : "FAIL";
    r.check_detail = cr.detail();
  }
  const MeasureOptions mo = ctx.measure_options();
  if (ours_ran) {
    r.ours_ms = ctx.timer().measure(c.ours, mo);
    r.ours = gbps(c.bytes, r.ours_ms);
  }
  if (baseline_ran) {
    r.baseline_ms = ctx.timer().measure(c.baseline, mo);
    r.baseline_value = gbps(c.bytes, r.baseline_ms);
  }
  ctx.add(std::move(r));
}

CompareResult merge(const CompareResult& a, const CompareResult& b) {
  CompareResult m = a;
  m.ok = a.ok && b.ok;
  m.bad = a.bad + b.bad;
  m.max_err = std::max(a.max_err, b.max_err);
  m.first_bad = std::min(a.first_bad, b.first_bad);
  m.note = a.note + b.note;
  return m;
}

// ---- add -----------------------------------------------------------------------------

template <class T>
struct AddOp {
  __device__ T operator()(T a, T b) const { return from_f32<T>(to_f32(a) + to_f32(b)); }
};
template <class T>
struct AddRowOp {
  const T* row;
  long long cols;
  __device__ T operator()(T a, long long i) const {
    return from_f32<T>(to_f32(a) + to_f32(row[i % cols]));
  }
};

template <class T>
void add_case(SuiteContext& ctx, int64_t rows, int64_t cols, bool row_broadcast) {
  if (!ctx.wants("add")) return;
  const size_t n = static_cast<size_t>(rows * cols);
  const int64_t b_numel = row_broadcast ? cols : rows * cols;
  DeviceMem a(n * sizeof(T)), b(b_numel * sizeof(T)), out(n * sizeof(T)), ref(n * sizeof(T));
  const cudaStream_t s = ctx.stream();
  fill_uniform(a.as<T>(), n, 101u, -1.f, 1.f, s);
  fill_uniform(b.as<T>(), static_cast<size_t>(b_numel), 102u, -1.f, 1.f, s);
  auto ta = view2d<T>(a.get(), rows, cols);
  auto tb = row_broadcast ? Tensor::contiguous(b.get(), TypeInfo<T>::dtype, {cols})
                          : view2d<T>(b.get(), rows, cols);
  auto tout = view2d<T>(out.get(), rows, cols);

  Case c;
  c.rec.op = "add";
  c.rec.shape = {{"rows", rows}, {"cols", cols}};
  c.rec.dtype = TypeInfo<T>::name;
  c.rec.target = "peak_fraction>=0.90";
  c.bytes = double(n + n) * sizeof(T) + double(b_numel) * sizeof(T);
  c.rec.case_ = std::to_string(rows) + "x" + std::to_string(cols) +
                (row_broadcast ? " + row vector (" + std::to_string(cols) + ")" : " same-shape") +
                ", " + mib(c.bytes);
  c.rec.baseline = "cub::DeviceTransform";
  c.ours = [&, s] { tessel::add(ta, tb, tout, s); };
  if (row_broadcast) {
    c.baseline = [&, s] {
      TESSEL_BENCH_CUDA(cub::DeviceTransform::Transform(
          cuda::std::make_tuple(a.as<T>(), thrust::counting_iterator<long long>(0)), ref.as<T>(),
          static_cast<int64_t>(n), AddRowOp<T>{b.as<T>(), cols}, s));
    };
  } else {
    c.baseline = [&, s] {
      TESSEL_BENCH_CUDA(cub::DeviceTransform::Transform(cuda::std::make_tuple(a.as<T>(), b.as<T>()),
                                                        ref.as<T>(), static_cast<int64_t>(n),
                                                        AddOp<T>{}, s));
    };
  }
  c.check = [&, s] {
    return compare_device(out.as<T>(), ref.as<T>(), n, 1e-6f, TypeInfo<T>::rtol * 0.5f, s);
  };
  run_case(ctx, std::move(c));
}

// ---- copy ----------------------------------------------------------------------------

void copy_case(SuiteContext& ctx) {
  if (!ctx.wants("copy")) return;
  using T = __nv_bfloat16;
  const int64_t rows = 32768, cols = 16384;  // 1 GiB of bf16
  const size_t n = static_cast<size_t>(rows * cols), bytes = n * sizeof(T);
  DeviceMem src(bytes), dst(bytes), ref(bytes);
  const cudaStream_t s = ctx.stream();
  fill_uniform(src.as<T>(), n, 201u, -4.f, 4.f, s);
  auto tsrc = view2d<T>(src.get(), rows, cols);
  auto tdst = view2d<T>(dst.get(), rows, cols);
  Case c;
  c.rec.op = "copy";
  c.rec.shape = {{"rows", rows}, {"cols", cols}};
  c.rec.dtype = "bf16";
  c.rec.target = "peak_fraction>=0.90";
  c.bytes = 2.0 * double(bytes);
  c.rec.case_ = "1 GiB contiguous, " + mib(c.bytes);
  c.rec.baseline = "cudaMemcpyAsync D2D";
  c.ours = [&, s] { tessel::copy(tsrc, tdst, s); };
  c.baseline = [&, s] {
    TESSEL_BENCH_CUDA(cudaMemcpyAsync(ref.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
  };
  c.check = [&, s] { return compare_device(dst.as<T>(), src.as<T>(), n, 0.f, 0.f, s); };
  run_case(ctx, std::move(c));
}

// ---- transpose -----------------------------------------------------------------------

void lt_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " +
                             std::to_string(static_cast<int>(st)));
}

// dst (C, R) row-major = src (R, C) row-major transposed, via cublasLtMatrixTransform.
// In column-major terms src is a C x R matrix (ld C) and dst an R x C matrix (ld R):
// dst = op(src) with op = transpose.
class LtTranspose {
 public:
  LtTranspose(cudaDataType_t type, int64_t rows, int64_t cols) {
    lt_check(cublasLtCreate(&handle_), "cublasLtCreate");
    lt_check(cublasLtMatrixTransformDescCreate(&desc_, CUDA_R_32F),
             "cublasLtMatrixTransformDescCreate");
    const cublasOperation_t op = CUBLAS_OP_T;
    lt_check(cublasLtMatrixTransformDescSetAttribute(desc_, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA,
                                                     &op, sizeof op),
             "cublasLtMatrixTransformDescSetAttribute");
    lt_check(cublasLtMatrixLayoutCreate(&a_, type, cols, rows, cols), "cublasLtMatrixLayoutCreate");
    lt_check(cublasLtMatrixLayoutCreate(&c_, type, rows, cols, rows), "cublasLtMatrixLayoutCreate");
  }
  ~LtTranspose() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (desc_) cublasLtMatrixTransformDescDestroy(desc_);
    if (handle_) cublasLtDestroy(handle_);
  }
  LtTranspose(const LtTranspose&) = delete;
  LtTranspose& operator=(const LtTranspose&) = delete;

  void run(const void* src, void* dst, cudaStream_t s) const {
    const float alpha = 1.f, beta = 0.f;
    lt_check(cublasLtMatrixTransform(handle_, desc_, &alpha, src, a_, &beta, nullptr, nullptr, dst,
                                     c_, s),
             "cublasLtMatrixTransform");
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatrixTransformDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, c_ = nullptr;
};

template <class T>
void transpose_case(SuiteContext& ctx, int64_t rows, int64_t cols) {
  if (!ctx.wants("transpose")) return;
  const size_t n = static_cast<size_t>(rows * cols), bytes = n * sizeof(T);
  DeviceMem src(bytes), dst(bytes), ref(bytes);
  const cudaStream_t s = ctx.stream();
  fill_uniform(src.as<T>(), n, 301u, -4.f, 4.f, s);
  auto tsrc = view2d<T>(src.get(), rows, cols);
  auto tdst = view2d<T>(dst.get(), cols, rows);
  Case c;
  c.rec.op = "transpose";
  c.rec.shape = {{"rows", rows}, {"cols", cols}};
  c.rec.dtype = TypeInfo<T>::name;
  c.rec.target = "peak_fraction>=0.90";
  c.bytes = 2.0 * double(bytes);
  c.rec.case_ = std::to_string(rows) + "x" + std::to_string(cols) + " -> " + std::to_string(cols) +
                "x" + std::to_string(rows) + ", " + mib(c.bytes);
  std::unique_ptr<LtTranspose> lt;
  std::unique_ptr<Roofline> roof;
  try {
    lt = std::make_unique<LtTranspose>(TypeInfo<T>::cuda, rows, cols);
    lt->run(src.get(), ref.get(), s);
    sync_or_throw(s);
    c.rec.baseline = "cublasLtMatrixTransform";
    c.baseline = [&, s] { lt->run(src.get(), ref.get(), s); };
    c.check = [&, s] { return compare_device(dst.as<T>(), ref.as<T>(), n, 0.f, 0.f, s); };
  } catch (const std::exception& e) {
    throw_if_context_lost();
    lt.reset();
    roof = std::make_unique<Roofline>(c.bytes);
    c.rec.baseline = kRooflineName;
    c.rec.case_ += " [baseline: roofline, cublasLt failed: " + std::string(e.what()) + "]";
    c.baseline = [&, s] { roof->run(s); };
    // Without a vendor result, check against a host transpose of a sample of rows.
    c.check = [&, s] {
      CompareResult r;
      std::vector<T> row(static_cast<size_t>(cols)), col(static_cast<size_t>(cols));
      for (int64_t i = 0; i < rows; i += std::max<int64_t>(1, rows / 61)) {
        TESSEL_BENCH_CUDA(cudaMemcpy(row.data(), src.as<T>() + i * cols, cols * sizeof(T),
                                     cudaMemcpyDeviceToHost));
        TESSEL_BENCH_CUDA(cudaMemcpy2D(col.data(), sizeof(T), dst.as<T>() + i, rows * sizeof(T),
                                       sizeof(T), static_cast<size_t>(cols),
                                       cudaMemcpyDeviceToHost));
        for (int64_t j = 0; j < cols; ++j)
          if (to_f32(row[j]) != to_f32(col[j])) {
            if (!r.bad) r.first_bad = static_cast<unsigned long long>(i * cols + j);
            ++r.bad;
          }
      }
      r.ok = r.bad == 0;
      return r;
    };
  }
  c.ours = [&, s] { tessel::transpose(tsrc, tdst, s); };
  run_case(ctx, std::move(c));
}

// ---- reduce_sum ----------------------------------------------------------------------

struct AddF32 {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <class T>
__global__ void sum_f64_kernel(const T* x, size_t n, double* out) {
  double acc = 0.0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += static_cast<double>(to_f32(x[i]));
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

template <class T>
void reduce_case(SuiteContext& ctx, size_t n) {
  if (!ctx.wants("reduce_sum")) return;
  const cudaStream_t s = ctx.stream();
  DeviceMem x(n * sizeof(T)), out(sizeof(float)), ref(sizeof(float)), ref64(sizeof(double));
  // Positive data: a dropped or doubled block changes the sum by far more than the tolerance.
  fill_uniform(x.as<T>(), n, 401u, 0.f, 1.f, s);
  auto tx = Tensor::contiguous(x.get(), TypeInfo<T>::dtype, {static_cast<int64_t>(n)});
  auto tout = Tensor::contiguous(out.get(), DType::f32, {1});

  size_t temp_bytes = 0;
  if constexpr (std::is_same_v<T, float>) {
    TESSEL_BENCH_CUDA(cub::DeviceReduce::Sum(nullptr, temp_bytes, x.as<T>(), ref.as<float>(),
                                             static_cast<int64_t>(n), s));
  } else {
    TESSEL_BENCH_CUDA(cub::DeviceReduce::Reduce(nullptr, temp_bytes, x.as<T>(), ref.as<float>(),
                                                static_cast<int64_t>(n), AddF32{}, 0.f, s));
  }
  DeviceMem temp(std::max<size_t>(temp_bytes, 1));

  Case c;
  c.rec.op = "reduce_sum";
  c.rec.shape = {{"numel", static_cast<int64_t>(n)}};
  c.rec.dtype = std::string(TypeInfo<T>::name) + "->f32";
  c.rec.target = "ratio>=0.95";
  c.bytes = double(n) * sizeof(T) + sizeof(float);
  c.rec.case_ = "2^" + std::to_string(static_cast<int>(std::log2(double(n)))) +
                " elements, whole tensor, " + mib(c.bytes);
  c.rec.baseline = std::is_same_v<T, float> ? "cub::DeviceReduce::Sum"
                                            : "cub::DeviceReduce::Reduce (f32 accumulate)";
  c.ours = [&, s] { tessel::reduce_sum(tx, tout, s); };
  c.baseline = [&, s] {
    size_t tb = temp_bytes;
    if constexpr (std::is_same_v<T, float>) {
      TESSEL_BENCH_CUDA(cub::DeviceReduce::Sum(temp.get(), tb, x.as<T>(), ref.as<float>(),
                                               static_cast<int64_t>(n), s));
    } else {
      TESSEL_BENCH_CUDA(cub::DeviceReduce::Reduce(temp.get(), tb, x.as<T>(), ref.as<float>(),
                                                  static_cast<int64_t>(n), AddF32{}, 0.f, s));
    }
  };
  c.check = [&, s] {
    TESSEL_BENCH_CUDA(cudaMemsetAsync(ref64.get(), 0, sizeof(double), s));
    sum_f64_kernel<T><<<1024, 256, 0, s>>>(x.as<T>(), n, ref64.as<double>());
    TESSEL_BENCH_CUDA(cudaGetLastError());
    double exact = 0;
    float ours = 0, vendor = 0;
    TESSEL_BENCH_CUDA(
        cudaMemcpyAsync(&exact, ref64.get(), sizeof exact, cudaMemcpyDeviceToHost, s));
    TESSEL_BENCH_CUDA(cudaMemcpyAsync(&ours, out.get(), sizeof ours, cudaMemcpyDeviceToHost, s));
    TESSEL_BENCH_CUDA(
        cudaMemcpyAsync(&vendor, ref.get(), sizeof vendor, cudaMemcpyDeviceToHost, s));
    sync_or_throw(s);
    CompareResult r;
    const double tol = 1e-5 * std::fabs(exact) + 1e-3;
    r.max_err = static_cast<float>(std::fabs(double(ours) - exact));
    r.ok = std::isfinite(ours) && r.max_err <= tol;
    r.bad = r.ok ? 0 : 1;
    r.first_bad = 0;
    char note[160];
    std::snprintf(note, sizeof note, "; float64=%.6e ours=%.6e cub=%.6e", exact, double(ours),
                  double(vendor));
    r.note = note;
    return r;
  };
  run_case(ctx, std::move(c));
}

// ---- softmax -------------------------------------------------------------------------

// Rows sampled for the float64 checks: first, last and evenly spaced ones.
std::vector<int64_t> sample_rows(int64_t rows, int count = 64) {
  std::vector<int64_t> out;
  for (int i = 0; i < count; ++i) out.push_back(rows <= 1 ? 0 : i * (rows - 1) / (count - 1));
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

template <class T>
std::vector<float> fetch_row(const T* base, int64_t row, int64_t cols) {
  std::vector<T> h(static_cast<size_t>(cols));
  TESSEL_BENCH_CUDA(
      cudaMemcpy(h.data(), base + row * cols, cols * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = to_f32(h[i]);
  return f;
}

void accumulate(CompareResult& r, double got, double want, double atol, double rtol,
                unsigned long long index) {
  const double err = std::fabs(got - want);
  if (!(err <= atol + rtol * std::fabs(want))) {
    if (!r.bad) r.first_bad = index;
    ++r.bad;
    r.ok = false;
  }
  if (std::isfinite(err)) r.max_err = std::max(r.max_err, static_cast<float>(err));
}

// float64 softmax of x on sampled rows vs y.
template <class T>
CompareResult check_softmax_fwd_f64(const T* x, const T* y, int64_t rows, int64_t cols) {
  CompareResult r;
  const double rtol = TypeInfo<T>::rtol * 0.5, atol = 1e-7;
  for (int64_t row : sample_rows(rows)) {
    const auto hx = fetch_row(x, row, cols), hy = fetch_row(y, row, cols);
    double mx = -INFINITY, sum = 0;
    for (float v : hx) mx = std::max(mx, double(v));
    for (float v : hx) sum += std::exp(double(v) - mx);
    for (int64_t j = 0; j < cols; ++j)
      accumulate(r, hy[j], std::exp(double(hx[j]) - mx) / sum, atol, rtol, row * cols + j);
  }
  return r;
}

// float64 dx = y * (dy - sum(dy * y)) on sampled rows vs dx.
template <class T>
CompareResult check_softmax_bwd_f64(const T* y, const T* dy, const T* dx, int64_t rows,
                                    int64_t cols) {
  CompareResult r;
  const double rtol = TypeInfo<T>::rtol * 0.5, atol = 1e-7;
  for (int64_t row : sample_rows(rows)) {
    const auto hy = fetch_row(y, row, cols), hdy = fetch_row(dy, row, cols),
               hdx = fetch_row(dx, row, cols);
    double dot = 0;
    for (int64_t j = 0; j < cols; ++j) dot += double(hy[j]) * double(hdy[j]);
    for (int64_t j = 0; j < cols; ++j)
      accumulate(r, hdx[j], double(hy[j]) * (double(hdy[j]) - dot), atol, rtol, row * cols + j);
  }
  return r;
}

template <class T>
void softmax_case(SuiteContext& ctx, CudnnSoftmax& dnn, int64_t rows, int64_t cols, bool backward) {
  const size_t n = static_cast<size_t>(rows * cols), bytes = n * sizeof(T);
  const cudaStream_t s = ctx.stream();
  // fwd: a = x, c = y (ours), ref = y (baseline). bwd: a = y, b = dy, c = dx, ref = dx.
  DeviceMem a(bytes), b(backward ? bytes : 0), out(bytes), ref(bytes);
  if (backward) {
    fill_uniform(a.as<T>(), n, 601u, 0.f, 2.f / float(cols), s);  // y: softmax-like scale
    fill_uniform(b.as<T>(), n, 602u, -1.f, 1.f, s);               // dy
  } else {
    fill_uniform(a.as<T>(), n, 501u, -8.f, 8.f, s);  // x
  }
  auto ta = view2d<T>(a.get(), rows, cols);
  auto tb = view2d<T>(b.get(), rows, cols);
  auto tout = view2d<T>(out.get(), rows, cols);

  Case c;
  c.rec.op = backward ? "softmax_bwd" : "softmax_fwd";
  c.rec.shape = {{"rows", rows}, {"cols", cols}};
  c.rec.dtype = TypeInfo<T>::name;
  c.rec.target = "peak_fraction>=0.90";
  c.bytes = double(bytes) * (backward ? 3 : 2);
  c.rec.case_ = std::to_string(rows) + "x" + std::to_string(cols) + ", " + mib(c.bytes);
  const int irows = static_cast<int>(rows), icols = static_cast<int>(cols);
  auto run_dnn = [&, s](cudnnSoftmaxMode_t mode) -> std::string {
    return backward ? dnn.backward(mode, TypeInfo<T>::cudnn, irows, icols, a.get(), b.get(),
                                   ref.get(), s)
                    : dnn.forward(mode, TypeInfo<T>::cudnn, irows, icols, a.get(), ref.get(), s);
  };
  // With h = w = 1 both softmax modes compute the same thing; cuDNN's kernels for them differ
  // a lot in speed, so the baseline is the faster mode (picked with a short timing).
  std::unique_ptr<Roofline> roof;
  std::string dnn_error;
  std::optional<cudnnSoftmaxMode_t> best_mode;
  double best_ms = 0;
  for (cudnnSoftmaxMode_t mode : {CUDNN_SOFTMAX_MODE_CHANNEL, CUDNN_SOFTMAX_MODE_INSTANCE}) {
    std::string e = run_dnn(mode);
    if (e.empty()) {
      if (cudaError_t ce = cudaStreamSynchronize(s); ce != cudaSuccess)
        e = std::string("cuDNN launch: ") + cudaGetErrorString(ce);
    }
    throw_if_context_lost();
    if (!e.empty()) {
      if (dnn_error.empty()) dnn_error = e;
      continue;
    }
    MeasureOptions quick;
    quick.warmup = 1;
    quick.iters = 3;
    const double ms = ctx.timer().measure([&, mode] { run_dnn(mode); }, quick);
    if (!best_mode || ms < best_ms) {
      best_mode = mode;
      best_ms = ms;
    }
  }
  const bool have_dnn = best_mode.has_value();
  if (have_dnn) {
    const cudnnSoftmaxMode_t mode = *best_mode;
    run_dnn(mode);  // ref holds the chosen mode's output for the check
    c.rec.baseline = std::string(backward ? "cudnnSoftmaxBackward" : "cudnnSoftmaxForward") +
                     (mode == CUDNN_SOFTMAX_MODE_CHANNEL ? " (CHANNEL)" : " (INSTANCE)");
    c.baseline = [&, run_dnn, mode] {
      if (std::string e = run_dnn(mode); !e.empty()) throw std::runtime_error(e);
    };
  } else {
    roof = std::make_unique<Roofline>(c.bytes);
    c.rec.baseline = kRooflineName;
    c.rec.case_ += " [baseline: cudaMemcpy roofline of the same bytes; cuDNN: " + dnn_error + "]";
    c.baseline = [&, s] { roof->run(s); };
  }
  if (backward) {
    c.ours = [&, s] { tessel::softmax_backward(ta, tb, tout, s); };
  } else {
    c.ours = [&, s] { tessel::softmax(ta, tout, s); };
  }
  c.check = [&, s, have_dnn] {
    CompareResult f64 = backward
                            ? check_softmax_bwd_f64(a.as<T>(), b.as<T>(), out.as<T>(), rows, cols)
                            : check_softmax_fwd_f64(a.as<T>(), out.as<T>(), rows, cols);
    if (!have_dnn) return f64;
    const CompareResult vs =
        compare_device(out.as<T>(), ref.as<T>(), n, 1e-6f, TypeInfo<T>::rtol, s);
    CompareResult m = merge(f64, vs);
    m.note = " (float64 rows: " + f64.detail() + "; vs cuDNN: " + vs.detail() + ")";
    return m;
  };
  run_case(ctx, std::move(c));
}

// ---- the suite -----------------------------------------------------------------------

void run_memory_suite(SuiteContext& ctx) {
  using bf16 = __nv_bfloat16;
  add_case<bf16>(ctx, 16384, 8192, false);
  add_case<bf16>(ctx, 16384, 8192, true);
  add_case<float>(ctx, 16384, 8192, false);
  copy_case(ctx);
  transpose_case<bf16>(ctx, 16384, 8192);
  transpose_case<float>(ctx, 16384, 8192);
  reduce_case<float>(ctx, size_t{1} << 28);
  reduce_case<bf16>(ctx, size_t{1} << 29);
  if (!ctx.wants("softmax_fwd") && !ctx.wants("softmax_bwd")) return;
  CudnnSoftmax dnn;
  if (!dnn.ok() && ctx.run().verbose)
    std::fprintf(stderr,
                 "memory: cuDNN unavailable (%s); softmax baselines fall back to the "
                 "copy roofline\n",
                 dnn.error().c_str());
  for (bool bwd : {false, true}) {
    softmax_case<bf16>(ctx, dnn, 32768, 4096, bwd);
    softmax_case<bf16>(ctx, dnn, 65536, 1024, bwd);
    softmax_case<float>(ctx, dnn, 32768, 4096, bwd);
  }
}

}  // namespace

TESSEL_BENCH_SUITE("memory",
                   "bandwidth-bound ops (add, copy, transpose, reduce_sum, softmax fwd/bwd) vs "
                   "cub / cudaMemcpy / cuBLASLt / cuDNN",
                   run_memory_suite);

}  // namespace tessel::bench
