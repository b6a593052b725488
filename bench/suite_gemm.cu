// Bench suite "gemm": tessel::gemm against cuBLAS (cublasGemmEx, fp32 compute, default
// algorithm selection) in the same run, bf16 in / bf16 out unless the case says otherwise.
//
//   square   : 8192^3 (both B layouts, and f16), 4096^3
//   llama3-8b: M in {128, 4096, 16384} x (N, K) in the Llama-3-8B linear layers
//              {(6144,4096) qkv, (4096,4096) o, (28672,4096) gate+up, (4096,14336) down,
//              (128256,4096) lm_head}, B in the nn.Linear (N, K) layout
//   summary  : geomean of ours/cuBLAS over the llama cases (target >= 1.00)
// Targets: 8192^3 ratio >= 1.00; every other case ratio >= 0.90. Each case is checked once
// before timing against cuBLAS's output (|diff| <= 1e-2 + 1.6e-2 |ref|).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "harness.hpp"
#include "tessel/gemm.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

struct GemmCase {
  int64_t m, n, k;
  BLayout layout;
  DType dtype;  // input and output
  const char* group;
  const char* target;
};

void cublas_ok(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " +
                             std::to_string(int(st)));
}

// Row-major D(M,N) = A(M,K) · op(B) is column-major Dᵀ(N,M) = op(B)ᵀ · Aᵀ.
void cublas_gemm(cublasHandle_t h, const GemmCase& c, const void* a, const void* b, void* d) {
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t t = c.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const bool nk = c.layout == BLayout::nk;
  cublas_ok(cublasGemmEx(h, nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(c.n), int(c.m),
                         int(c.k), &alpha, b, t, nk ? int(c.k) : int(c.n), a, t, int(c.k), &beta, d,
                         t, int(c.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
}

std::string case_name(const GemmCase& c) {
  return std::string(c.group) + " " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
         std::to_string(c.k) + (c.layout == BLayout::nk ? " B(N,K)" : " B(K,N)");
}

void run_case(SuiteContext& ctx, cublasHandle_t h, const GemmCase& c, Record& r) {
  cudaStream_t s = ctx.stream();
  const size_t es = dtype_size(c.dtype);
  DeviceMem a(size_t(c.m * c.k) * es), b(size_t(c.n * c.k) * es), d(size_t(c.m * c.n) * es),
      d_ref(size_t(c.m * c.n) * es);
  if (c.dtype == DType::bf16) {
    fill_uniform(a.as<__nv_bfloat16>(), size_t(c.m * c.k), 1, -1.f, 1.f, s);
    fill_uniform(b.as<__nv_bfloat16>(), size_t(c.n * c.k), 2, -1.f, 1.f, s);
  } else {
    fill_uniform(a.as<__half>(), size_t(c.m * c.k), 1, -1.f, 1.f, s);
    fill_uniform(b.as<__half>(), size_t(c.n * c.k), 2, -1.f, 1.f, s);
  }
  const Tensor ta = Tensor::contiguous(a.get(), c.dtype, {c.m, c.k});
  const Tensor tb = c.layout == BLayout::nk ? Tensor::contiguous(b.get(), c.dtype, {c.n, c.k})
                                            : Tensor::contiguous(b.get(), c.dtype, {c.k, c.n});
  Tensor td = Tensor::contiguous(d.get(), c.dtype, {c.m, c.n});
  GemmOptions opt;
  opt.b_layout = c.layout;
  auto ours = [&] { gemm(ta, tb, td, s, opt); };
  auto base = [&] { cublas_gemm(h, c, a.get(), b.get(), d_ref.get()); };

  ours();
  base();
  const size_t n = size_t(c.m * c.n);
  const CompareResult cmp =
      c.dtype == DType::bf16
          ? compare_device(d.as<__nv_bfloat16>(), d_ref.as<__nv_bfloat16>(), n, 1e-2f, 1.6e-2f, s)
          : compare_device(d.as<__half>(), d_ref.as<__half>(), n, 1e-2f, 4e-3f, s);
  r.check = cmp.ok ? "OK" : "FAIL";
  r.check_detail = cmp.detail();

  const double flop = 2.0 * double(c.m) * double(c.n) * double(c.k);
  r.ours_ms = ctx.timer().measure(ours, ctx.measure_options());
  r.baseline_ms = ctx.timer().measure(base, ctx.measure_options());
  r.ours = flop / (r.ours_ms * 1e-3) / 1e12;
  r.baseline_value = flop / (r.baseline_ms * 1e-3) / 1e12;
}

void suite_gemm(SuiteContext& ctx) {
  cublasHandle_t h = nullptr;
  cublas_ok(cublasCreate(&h), "cublasCreate");
  struct Guard {
    cublasHandle_t h;
    ~Guard() { cublasDestroy(h); }
  } guard{h};
  cublas_ok(cublasSetStream(h, ctx.stream()), "cublasSetStream");

  std::vector<GemmCase> cases = {
      {8192, 8192, 8192, BLayout::nk, DType::bf16, "square", "ratio>=1.00"},
      {8192, 8192, 8192, BLayout::kn, DType::bf16, "square", "ratio>=1.00"},
      {8192, 8192, 8192, BLayout::nk, DType::f16, "square", "ratio>=1.00"},
      {4096, 4096, 4096, BLayout::nk, DType::bf16, "square", "ratio>=0.90"},
  };
  const int64_t llama_nk[][2] = {
      {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
  for (int64_t m : {128, 4096, 16384})
    for (const auto& nk : llama_nk)
      cases.push_back({m, nk[0], nk[1], BLayout::nk, DType::bf16, "llama3-8b", "ratio>=0.90"});

  double log_sum = 0.0;
  int llama = 0;
  for (const GemmCase& c : cases) {
    Record r;
    r.op = "gemm";
    r.case_ = case_name(c);
    r.shape = {{"M", c.m}, {"N", c.n}, {"K", c.k}};
    r.dtype = dtype_name(c.dtype);
    r.metric = "TFLOP/s";
    r.baseline = "cublasGemmEx";
    r.target = c.target;
    try {
      run_case(ctx, h, c, r);
    } catch (const std::exception& e) {
      r.check = "ERROR";
      r.check_detail = e.what();
      cudaGetLastError();
    }
    if (std::string(c.group) == "llama3-8b" && r.baseline_value > 0 && r.ours > 0) {
      log_sum += std::log(r.ours / r.baseline_value);
      ++llama;
    }
    ctx.add(std::move(r));
  }
  Record g;
  g.op = "gemm";
  g.case_ = "llama3-8b geomean ours/cuBLAS";
  g.dtype = "bf16";
  g.metric = "ratio";
  g.ours = llama ? std::exp(log_sum / llama) : 0.0;
  g.baseline = "cublasGemmEx";
  g.baseline_value = 1.0;
  g.target = "ratio>=1.00";
  ctx.add(std::move(g));
}

}  // namespace

TESSEL_BENCH_SUITE("gemm", "tessel::gemm vs cublasGemmEx: 8192^3, 4096^3, Llama-3-8B linears",
                   suite_gemm);

}  // namespace tessel::bench
