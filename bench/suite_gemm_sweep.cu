// Bench suite "gemm_sweep": tessel::gemm with forced tile configs / K splits / raster groups /
// epilogues (gemm_detail::set_tuning, not public API) on the shapes where the automatic plan
// is in question (docs/gemm.md, optimization log), each against cublasGemmEx on the same
// plain problem in the same run. Tuning data, not acceptance: record op "gemm_sweep", case
// "<M>x<N>x<K> B(..) cfg=<c> s=<splits> g=<group> <epilogue>", no target.
//   cfg: -1 automatic, 0 128x256 cluster 2x1, 1 128x128, 2 128x64, 3 128x64 cluster 1x2,
//   4 64x128, 5 128x192, 6 64x64 cluster 2x1, 7 64x64, 8 128x128 cluster 2x1, 9 64x96 cluster
//   2x1 (3..9: B (N,K));
//   s 0 / g 0: the plan's choice.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "harness.hpp"
#include "tessel/gemm.hpp"
#include "tessel/tensor.hpp"

namespace tessel::gemm_detail {
void set_tuning(int cfg, int splits, int group);  // src/ops/gemm/gemm.cu
}

namespace tessel::bench {
namespace {

enum class SweepEpi { none, bias, bias_relu, bias_gelu, bias_silu, bias_residual };

const char* epi_name(SweepEpi e) {
  switch (e) {
    case SweepEpi::bias: return "bias";
    case SweepEpi::bias_relu: return "bias+relu";
    case SweepEpi::bias_gelu: return "bias+gelu_tanh";
    case SweepEpi::bias_silu: return "bias+silu";
    case SweepEpi::bias_residual: return "bias+residual";
    default: return "none";
  }
}

struct Variant {
  int cfg, splits, group;
  SweepEpi epi = SweepEpi::none;
};

struct Shape {
  int64_t m, n, k;
  BLayout layout;
  std::vector<Variant> variants;
};

void check_cublas(cublasStatus_t st) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cuBLAS status " + std::to_string(int(st)));
}

struct TuningReset {
  ~TuningReset() { gemm_detail::set_tuning(-1, 0, 0); }
};

void sweep_shape(SuiteContext& ctx, cublasHandle_t h, const Shape& sh) {
  cudaStream_t s = ctx.stream();
  const size_t na = size_t(sh.m * sh.k), nb = size_t(sh.n * sh.k), nd = size_t(sh.m * sh.n);
  DeviceMem a(na * 2), b(nb * 2), d(nd * 2), d_ref(nd * 2), bias(size_t(sh.n) * 2), resid(nd * 2);
  fill_uniform(a.as<__nv_bfloat16>(), na, 1, -1.f, 1.f, s);
  fill_uniform(b.as<__nv_bfloat16>(), nb, 2, -1.f, 1.f, s);
  fill_uniform(bias.as<__nv_bfloat16>(), size_t(sh.n), 3, -4.f, 4.f, s);
  fill_uniform(resid.as<__nv_bfloat16>(), nd, 4, -1.f, 1.f, s);
  const bool nk = sh.layout == BLayout::nk;
  Tensor ta = Tensor::contiguous(a.get(), DType::bf16, {sh.m, sh.k});
  Tensor tb = nk ? Tensor::contiguous(b.get(), DType::bf16, {sh.n, sh.k})
                 : Tensor::contiguous(b.get(), DType::bf16, {sh.k, sh.n});
  Tensor td = Tensor::contiguous(d.get(), DType::bf16, {sh.m, sh.n});
  Tensor tbias = Tensor::contiguous(bias.get(), DType::bf16, {sh.n});
  Tensor tres = Tensor::contiguous(resid.get(), DType::bf16, {sh.m, sh.n});

  const float one = 1.f, zero = 0.f;
  auto base = [&] {
    check_cublas(cublasGemmEx(h, nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(sh.n), int(sh.m),
                              int(sh.k), &one, b.get(), CUDA_R_16BF, nk ? int(sh.k) : int(sh.n),
                              a.get(), CUDA_R_16BF, int(sh.k), &zero, d_ref.get(), CUDA_R_16BF,
                              int(sh.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  base();
  const double base_ms = ctx.timer().measure(base, ctx.measure_options());
  const double flop = 2.0 * double(sh.m) * double(sh.n) * double(sh.k);
  const std::string shape_name = std::to_string(sh.m) + "x" + std::to_string(sh.n) + "x" +
                                 std::to_string(sh.k) + (nk ? " B(N,K)" : " B(K,N)");
  for (const Variant& v : sh.variants) {
    Record r;
    r.op = "gemm_sweep";
    r.case_ = shape_name + " cfg=" + std::to_string(v.cfg) + " s=" + std::to_string(v.splits) +
              " g=" + std::to_string(v.group) + " " + epi_name(v.epi);
    r.shape = {{"M", sh.m}, {"N", sh.n}, {"K", sh.k}};
    r.dtype = "bf16";
    r.metric = "TFLOP/s";
    r.baseline = "cublasGemmEx (plain)";
    GemmOptions opt;
    opt.b_layout = sh.layout;
    if (v.epi != SweepEpi::none) opt.bias = &tbias;
    if (v.epi == SweepEpi::bias_relu) opt.activation = GemmActivation::relu;
    if (v.epi == SweepEpi::bias_gelu) opt.activation = GemmActivation::gelu_tanh;
    if (v.epi == SweepEpi::bias_silu) opt.activation = GemmActivation::silu;
    if (v.epi == SweepEpi::bias_residual) {
      opt.beta = 1.f;
      opt.c = &tres;
    }
    try {
      TuningReset reset;
      gemm_detail::set_tuning(v.cfg, v.splits, v.group);
      auto ours = [&] { gemm(ta, tb, td, s, opt); };
      ours();
      if (v.epi == SweepEpi::none) {
        const CompareResult cmp =
            compare_device(d.as<__nv_bfloat16>(), d_ref.as<__nv_bfloat16>(), nd, 1e-2f, 1.6e-2f, s);
        r.check = cmp.ok ? "OK" : "FAIL";
        r.check_detail = cmp.detail();
      }
      r.ours_ms = ctx.timer().measure(ours, ctx.measure_options());
      r.ours = flop / (r.ours_ms * 1e-3) / 1e12;
    } catch (const std::exception& e) {
      r.check = "ERROR";
      r.check_detail = e.what();
      cudaGetLastError();
    }
    r.baseline_ms = base_ms;
    r.baseline_value = flop / (base_ms * 1e-3) / 1e12;
    ctx.add(std::move(r));
  }
}

void suite_gemm_sweep(SuiteContext& ctx) {
  if (!ctx.wants("gemm_sweep")) return;
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h));
  struct Guard {
    cublasHandle_t h;
    ~Guard() { cublasDestroy(h); }
  } guard{h};
  check_cublas(cublasSetStream(h, ctx.stream()));

  auto splits_of = [](std::vector<int> cfgs, std::vector<int> ss) {
    std::vector<Variant> v{{-1, 0, 0}};
    for (int c : cfgs)
      for (int s : ss) v.push_back({c, s, 0});
    return v;
  };
  std::vector<Shape> shapes = {
      // small M: tile shape x K split (cfg 3: A multicast along N; cfg 4: 64x128)
      {128, 4096, 4096, BLayout::nk, splits_of({2, 4}, {1, 2})},
      {128, 6144, 4096, BLayout::nk, splits_of({2, 4}, {1})},
      {128, 4096, 14336, BLayout::nk, splits_of({2, 4}, {2})},
      {128, 28672, 4096, BLayout::nk, splits_of({1, 4}, {1})},
      {128, 128256, 4096, BLayout::nk, splits_of({1, 4}, {1})},
      {64, 4096, 4096, BLayout::nk, splits_of({2, 4}, {2})},
      {128, 1024, 16384, BLayout::nk, splits_of({2, 4}, {8})},
      {256, 2048, 8192, BLayout::nk, splits_of({2, 3}, {2})},
      {512, 512, 32768, BLayout::nk, splits_of({1, 3}, {4, 8})},
      // epilogue cost: plain / bias / GELU(tanh) (bias staged in shared memory)
      {4096,
       16384,
       4096,
       BLayout::nk,
       {{-1, 0, 0},
        {-1, 0, 0, SweepEpi::bias},
        {-1, 0, 0, SweepEpi::bias_gelu},
        {-1, 0, 0, SweepEpi::bias_silu},
        {-1, 0, 0},
        {-1, 0, 0, SweepEpi::bias_gelu}}},
      {128,
       16384,
       4096,
       BLayout::nk,
       {{-1, 0, 0, SweepEpi::bias_gelu},
        {1, 1, 0, SweepEpi::bias_gelu},
        {2, 1, 0, SweepEpi::bias_gelu},
        {4, 1, 0, SweepEpi::bias_gelu}}},
      {4096, 4096, 4096, BLayout::nk, {{-1, 0, 0}, {-1, 0, 0, SweepEpi::bias_residual}}},
  };
  // TESSEL_GEMM_SWEEP_SHAPES="MxNxK,..." (B (N,K)) replaces the list above: every tile config
  // with 1, 2, 4 and 8 K splits (e.g. a model's prefill shapes; configs without split-K run
  // their one split).
  if (const char* env = std::getenv("TESSEL_GEMM_SWEEP_SHAPES")) {
    shapes.clear();
    std::string list = env;
    for (size_t at = 0; at < list.size();) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      long long m = 0, n = 0, k = 0;
      if (std::sscanf(list.substr(at, end - at).c_str(), "%lldx%lldx%lld", &m, &n, &k) == 3) {
        // 128x256 (0), 128x192 (5) and the 2x1 clusters of 64x64 (6), 128x128 (8) and 64x96
        // (9) have no split-K.
        std::vector<Variant> vs = splits_of({0, 5, 6, 8, 9}, {1});
        for (const Variant& v : splits_of({1, 2, 3, 4, 7}, {1, 2, 4, 8})) vs.push_back(v);
        // TESSEL_GEMM_SWEEP_VARIANTS="cfg:splits,..." keeps only those (e.g. for a profiler).
        if (const char* only = std::getenv("TESSEL_GEMM_SWEEP_VARIANTS")) {
          std::vector<Variant> keep;
          std::string sel = only;
          for (size_t p = 0; p < sel.size();) {
            size_t e = sel.find(',', p);
            if (e == std::string::npos) e = sel.size();
            int c = 0, s = 0;
            if (std::sscanf(sel.substr(p, e - p).c_str(), "%d:%d", &c, &s) == 2)
              keep.push_back({c, s, 0});
            p = e + 1;
          }
          vs = keep;
        }
        shapes.push_back({m, n, k, BLayout::nk, vs});
      }
      at = end + 1;
    }
  }
  for (const Shape& sh : shapes) sweep_shape(ctx, h, sh);
}

}  // namespace

TESSEL_BENCH_SUITE("gemm_sweep",
                   "tessel::gemm tuning sweep: forced tile config / K splits / raster group / "
                   "epilogue per shape vs cublasGemmEx (plain)",
                   suite_gemm_sweep);

}  // namespace tessel::bench
