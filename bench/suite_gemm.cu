// Bench suite "gemm": tessel::gemm / tessel::bmm against cuBLAS in the same run, bf16 in /
// bf16 out unless the case says otherwise.
//
//   gemm              square 8192^3 (both B layouts, and f16), 4096^3; Llama-3-8B linears:
//                     M in {128, 512, 4096, 16384} x (N, K) in {(6144,4096) qkv, (4096,4096) o,
//                     (28672,4096) gate+up, (4096,14336) down, (128256,4096) lm_head}, B in
//                     the nn.Linear (N, K) layout — vs cublasGemmEx (fp32 compute, default algo)
//                     weight gradients dYᵀ·X with A stored (K, M) (ALayout::km) vs cuBLAS's
//                     transposed A
//   gemm_bias_gelu    bias (N,) + GELU(tanh)      vs cublasLtMatmul CUBLASLT_EPILOGUE_GELU_BIAS
//   gemm_bias         bias                        vs cublasLtMatmul CUBLASLT_EPILOGUE_BIAS
//   gemm_bias_residual bias + residual C (beta 1) vs cublasLtMatmul CUBLASLT_EPILOGUE_BIAS, beta 1
//   bmm               strided batched (attention-like and expert-like) vs
//                     cublasGemmStridedBatchedEx
//   gemm_splitk       small M·N, long K (tessel's automatic split-K) vs cublasGemmEx
//   summary           geomean of ours/cuBLAS over the Llama cases (target >= 1.00)
// ours and the baseline are timed alternately (Timer::measure_pair).
// Targets: 8192^3 ratio >= 1.00; every other case ratio >= 0.90. Each case is checked once
// before timing against cuBLAS's output (|diff| <= 1e-2 + 1.6e-2 |ref| for bf16).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.cuh"
#include "harness.hpp"
#include "tessel/gemm.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

enum class Epi { none, bias, bias_gelu, bias_residual };

struct GemmCase {
  const char* op;  // record op
  int64_t m, n, k;
  BLayout layout;
  DType dtype;  // input and output
  const char* group;
  const char* target;
  Epi epi = Epi::none;
  int64_t batch = 0;  // bmm when > 0
  bool a_km = false;  // A stored (K, M) (ALayout::km; cuBLAS: the transposed operand)
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
  if (c.batch > 0) {
    cublas_ok(cublasGemmStridedBatchedEx(h, nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(c.n),
                                         int(c.m), int(c.k), &alpha, b, t, nk ? int(c.k) : int(c.n),
                                         c.n * c.k, a, t, int(c.k), c.m * c.k, &beta, d, t,
                                         int(c.n), c.m * c.n, int(c.batch), CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
    return;
  }
  // A (K, M) row-major is column-major (M, K): cuBLAS transposes it.
  cublas_ok(cublasGemmEx(h, nk ? CUBLAS_OP_T : CUBLAS_OP_N, c.a_km ? CUBLAS_OP_T : CUBLAS_OP_N,
                         int(c.n), int(c.m), int(c.k), &alpha, b, t, nk ? int(c.k) : int(c.n), a, t,
                         c.a_km ? int(c.m) : int(c.k), &beta, d, t, int(c.n), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
}

// cublasLt matmul with a bias / GELU+bias epilogue (row-major trick as above: the bias runs
// along the rows of the column-major Dᵀ, i.e. along N). Best heuristic algorithm, 64 MiB
// workspace.
class LtGemm {
 public:
  LtGemm(const GemmCase& c, const void* bias, float beta) : beta_(beta) {
    const cudaDataType_t t = c.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const bool nk = c.layout == BLayout::nk;
    cublas_ok(cublasLtCreate(&lt_), "cublasLtCreate");
    cublas_ok(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublas_ok(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
              "TRANSA");
    cublas_ok(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
              "TRANSB");
    const cublasLtEpilogue_t epi =
        c.epi == Epi::bias_gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    cublas_ok(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
        "EPILOGUE");
    cublas_ok(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                             sizeof bias),
              "BIAS");
    // op(B)ᵀ: (N, K) stored as K x N col-major when nk, else (K, N) row-major = N x K col-major.
    cublas_ok(cublasLtMatrixLayoutCreate(&la_, t, nk ? c.k : c.n, nk ? c.n : c.k, nk ? c.k : c.n),
              "layout A");
    cublas_ok(cublasLtMatrixLayoutCreate(&lb_, t, c.k, c.m, c.k), "layout B");
    cublas_ok(cublasLtMatrixLayoutCreate(&ld_, t, c.n, c.m, c.n), "layout D");
    cublas_ok(cublasLtMatmulPreferenceCreate(&pref_), "pref");
    const size_t ws = kWorkspace;
    cublas_ok(cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof ws),
              "pref ws");
    int found = 0;
    cublas_ok(
        cublasLtMatmulAlgoGetHeuristic(lt_, desc_, la_, lb_, ld_, ld_, pref_, 1, &heur_, &found),
        "heuristic");
    if (found == 0) throw std::runtime_error("cublasLt: no algorithm for this epilogue");
    TESSEL_BENCH_CUDA(cudaMalloc(&ws_, kWorkspace));
  }
  ~LtGemm() {
    if (ws_) cudaFree(ws_);
    cublasLtMatmulPreferenceDestroy(pref_);
    cublasLtMatrixLayoutDestroy(ld_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(lt_);
  }
  void run(const void* a, const void* b, const void* c, void* d, cudaStream_t s) {
    const float alpha = 1.f;
    cublas_ok(cublasLtMatmul(lt_, desc_, &alpha, b, la_, a, lb_, &beta_, c ? c : d, ld_, d, ld_,
                             &heur_.algo, ws_, kWorkspace, s),
              "cublasLtMatmul");
  }

 private:
  static constexpr size_t kWorkspace = size_t{64} << 20;
  float beta_;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, ld_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t heur_{};
  void* ws_ = nullptr;
};

std::string case_name(const GemmCase& c) {
  std::string s = std::string(c.group) + " ";
  if (c.batch) s += std::to_string(c.batch) + "x";
  return s + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
         (c.layout == BLayout::nk ? " B(N,K)" : " B(K,N)") + (c.a_km ? " A(K,M)" : "");
}

template <class T>
void fill(const DeviceMem& m, size_t n, uint32_t seed, float lo, float hi, cudaStream_t s) {
  fill_uniform(m.as<T>(), n, seed, lo, hi, s);
}

void run_case(SuiteContext& ctx, cublasHandle_t h, const GemmCase& c, Record& r) {
  cudaStream_t s = ctx.stream();
  const size_t es = dtype_size(c.dtype);
  const int64_t L = c.batch ? c.batch : 1;
  const size_t na = size_t(L * c.m * c.k), nb = size_t(L * c.n * c.k), nd = size_t(L * c.m * c.n);
  DeviceMem a(na * es), b(nb * es), d(nd * es), d_ref(nd * es);
  DeviceMem bias, resid;
  auto fill_any = [&](const DeviceMem& m, size_t n, uint32_t seed, float lo, float hi) {
    if (c.dtype == DType::bf16)
      fill<__nv_bfloat16>(m, n, seed, lo, hi, s);
    else
      fill<__half>(m, n, seed, lo, hi, s);
  };
  fill_any(a, na, 1, -1.f, 1.f);
  fill_any(b, nb, 2, -1.f, 1.f);
  GemmOptions opt;
  opt.b_layout = c.layout;
  opt.a_layout = c.a_km ? ALayout::km : ALayout::mk;
  const Tensor tbias = Tensor::contiguous(nullptr, c.dtype, {c.n});
  Tensor tb_v, tr_v;
  std::unique_ptr<LtGemm> lt;
  if (c.epi != Epi::none) {
    bias = DeviceMem(size_t(c.n) * es);
    fill_any(bias, size_t(c.n), 3, -4.f, 4.f);
    tb_v = Tensor::contiguous(bias.get(), c.dtype, {c.n});
    opt.bias = &tb_v;
    if (c.epi == Epi::bias_gelu) opt.activation = GemmActivation::gelu_tanh;
    if (c.epi == Epi::bias_residual) {
      resid = DeviceMem(nd * es);
      fill_any(resid, nd, 4, -1.f, 1.f);
      tr_v = Tensor::contiguous(resid.get(), c.dtype, {c.m, c.n});
      opt.beta = 1.f;
      opt.c = &tr_v;
    }
    lt = std::make_unique<LtGemm>(c, bias.get(), opt.beta);
  }
  (void)tbias;
  Tensor ta, tb, td;
  if (c.batch) {
    ta = Tensor::contiguous(a.get(), c.dtype, {L, c.m, c.k});
    tb = c.layout == BLayout::nk ? Tensor::contiguous(b.get(), c.dtype, {L, c.n, c.k})
                                 : Tensor::contiguous(b.get(), c.dtype, {L, c.k, c.n});
    td = Tensor::contiguous(d.get(), c.dtype, {L, c.m, c.n});
  } else {
    ta = c.a_km ? Tensor::contiguous(a.get(), c.dtype, {c.k, c.m})
                : Tensor::contiguous(a.get(), c.dtype, {c.m, c.k});
    tb = c.layout == BLayout::nk ? Tensor::contiguous(b.get(), c.dtype, {c.n, c.k})
                                 : Tensor::contiguous(b.get(), c.dtype, {c.k, c.n});
    td = Tensor::contiguous(d.get(), c.dtype, {c.m, c.n});
  }
  auto ours = [&] {
    if (c.batch)
      bmm(ta, tb, td, s, opt);
    else
      gemm(ta, tb, td, s, opt);
  };
  auto base = [&] {
    if (lt)
      lt->run(a.get(), b.get(), resid.get(), d_ref.get(), s);
    else
      cublas_gemm(h, c, a.get(), b.get(), d_ref.get());
  };

  ours();
  base();
  const CompareResult cmp =
      c.dtype == DType::bf16
          ? compare_device(d.as<__nv_bfloat16>(), d_ref.as<__nv_bfloat16>(), nd, 1e-2f, 1.6e-2f, s)
          : compare_device(d.as<__half>(), d_ref.as<__half>(), nd, 1e-2f, 4e-3f, s);
  r.check = cmp.ok ? "OK" : "FAIL";
  r.check_detail = cmp.detail();

  const double flop = 2.0 * double(L) * double(c.m) * double(c.n) * double(c.k);
  // Alternating iterations: the GPU's clock and power state move both alike.
  std::tie(r.ours_ms, r.baseline_ms) = ctx.timer().measure_pair(ours, base, ctx.measure_options());
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
      {"gemm", 8192, 8192, 8192, BLayout::nk, DType::bf16, "square", "ratio>=1.00"},
      {"gemm", 8192, 8192, 8192, BLayout::kn, DType::bf16, "square", "ratio>=1.00"},
      {"gemm", 8192, 8192, 8192, BLayout::nk, DType::f16, "square", "ratio>=1.00"},
      {"gemm", 4096, 4096, 4096, BLayout::nk, DType::bf16, "square", "ratio>=0.90"},
  };
  // Weight gradients dW = dYᵀ·X read with A transposed (ALayout::km, B (K,N)): K = tokens;
  // the Llama-3-8B MLP and o projections at 8192 tokens, the lm head at 4096 (the FLCE's).
  for (const auto& mnk : {std::array<int64_t, 3>{8192, 8192, 8192},
                          {14336, 4096, 8192},
                          {4096, 4096, 8192},
                          {128256, 4096, 4096}})
    cases.push_back({"gemm", mnk[0], mnk[1], mnk[2], BLayout::kn, DType::bf16, "weight-grad",
                     "ratio>=0.90", Epi::none, 0, /*a_km=*/true});
  const int64_t llama_nk[][2] = {
      {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
  for (int64_t m : {128, 512, 4096, 16384})  // 512: a prompt's prefill
    for (const auto& nk : llama_nk)
      cases.push_back(
          {"gemm", m, nk[0], nk[1], BLayout::nk, DType::bf16, "llama3-8b", "ratio>=0.90"});
  // fused epilogues (GPT-style MLP up with bias + GELU, projections with bias + residual)
  cases.push_back({"gemm_bias_gelu", 4096, 16384, 4096, BLayout::nk, DType::bf16, "mlp-up",
                   "ratio>=0.90", Epi::bias_gelu});
  cases.push_back({"gemm_bias_gelu", 128, 16384, 4096, BLayout::nk, DType::bf16, "mlp-up",
                   "ratio>=0.90", Epi::bias_gelu});
  cases.push_back(
      {"gemm_bias", 4096, 4096, 4096, BLayout::nk, DType::bf16, "proj", "ratio>=0.90", Epi::bias});
  cases.push_back({"gemm_bias_residual", 4096, 4096, 16384, BLayout::nk, DType::bf16, "mlp-down",
                   "ratio>=0.90", Epi::bias_residual});
  cases.push_back({"gemm_bias_residual", 4096, 4096, 4096, BLayout::nk, DType::bf16, "attn-out",
                   "ratio>=0.90", Epi::bias_residual});
  // strided batched
  cases.push_back(
      {"bmm", 2048, 2048, 128, BLayout::nk, DType::bf16, "attn-qk", "ratio>=0.90", Epi::none, 64});
  cases.push_back(
      {"bmm", 2048, 128, 2048, BLayout::kn, DType::bf16, "attn-pv", "ratio>=0.90", Epi::none, 64});
  cases.push_back(
      {"bmm", 2048, 4096, 1024, BLayout::nk, DType::bf16, "experts", "ratio>=0.90", Epi::none, 8});
  // split-K territory: few output tiles, long K
  cases.push_back(
      {"gemm_splitk", 128, 1024, 16384, BLayout::nk, DType::bf16, "splitk", "ratio>=0.90"});
  cases.push_back(
      {"gemm_splitk", 256, 2048, 8192, BLayout::nk, DType::bf16, "splitk", "ratio>=0.90"});
  cases.push_back(
      {"gemm_splitk", 512, 512, 32768, BLayout::nk, DType::bf16, "splitk", "ratio>=0.90"});

  double log_sum = 0.0;
  int llama = 0;
  for (const GemmCase& c : cases) {
    if (!ctx.wants(c.op)) continue;
    Record r;
    r.op = c.op;
    r.case_ = case_name(c);
    if (c.batch)
      r.shape = {{"batch", c.batch}, {"M", c.m}, {"N", c.n}, {"K", c.k}};
    else
      r.shape = {{"M", c.m}, {"N", c.n}, {"K", c.k}};
    r.dtype = dtype_name(c.dtype);
    r.metric = "TFLOP/s";
    r.baseline = c.epi == Epi::none ? (c.batch ? "cublasGemmStridedBatchedEx" : "cublasGemmEx")
                 : c.epi == Epi::bias_gelu ? "cublasLtMatmul GELU_BIAS"
                                           : "cublasLtMatmul BIAS";
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
  if (llama > 0) {
    Record g;
    g.op = "gemm";
    g.case_ = "llama3-8b geomean ours/cuBLAS";
    g.dtype = "bf16";
    g.metric = "ratio";
    g.ours = std::exp(log_sum / llama);
    g.baseline = "cublasGemmEx";
    g.baseline_value = 1.0;
    g.target = "ratio>=1.00";
    ctx.add(std::move(g));
  }
}

}  // namespace

TESSEL_BENCH_SUITE("gemm",
                   "tessel::gemm / bmm vs cuBLAS(Lt): 8192^3, 4096^3, Llama-3-8B linears, fused "
                   "bias/GELU/residual epilogues, strided batched, split-K",
                   suite_gemm);

}  // namespace tessel::bench
