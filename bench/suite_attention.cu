// Bench suite "attention": the attention forward (op attention_fwd), bf16, B=4, H=32,
// S=4096, head dims 128 and 64, causal and not (the issue's target shapes), plus a GQA case.
//
// TFLOP/s counts 4 * B * Hq * Sq * Skv * D flops (QK^T and PV), halved for causal.
// Baseline: unfused tessel kernels per batch: S = scale * Q K^T (tessel::bmm, bf16 out),
// P = softmax(S) (tessel::softmax), O = P V (tessel::bmm) — the path attention takes without
// a fused kernel. It computes every (query, key) pair, causal or not, so its causal figure is
// the full work timed against the halved flop count. The real competitors (cuDNN and flash
// SDPA) are measured by bench/vs_torch_attention.py. Target: ratio >= 1.0 (vs this baseline).
// Check, once before timing: the fused kernel on (batch 0, heads 0..3) against the SIMT path
// (TESSEL_ATTENTION_PATH=simt, fp32 CUDA cores, tested against float64 in
// tests/test_attention_gpu.cpp) on the same view, bf16 tolerance.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "bench_util.cuh"
#include "harness.hpp"
#include "runtime/scoped_env.hpp"
#include "tessel/attention.hpp"
#include "tessel/gemm.hpp"
#include "tessel/ops.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

using bf16 = __nv_bfloat16;
constexpr const char* kBaseline = "unfused tessel bmm+softmax+bmm";

Tensor view(void* p, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  Tensor t = Tensor::contiguous(p, DType::bf16, shape);
  int d = 0;
  for (int64_t s : strides) t.strides[d++] = s;
  return t;
}

void attention_case(SuiteContext& ctx, int64_t b, int64_t hq, int64_t hkv, int64_t s, int64_t d,
                    bool causal) {
  if (!ctx.wants("attention_fwd")) return;
  const cudaStream_t st = ctx.stream();
  const size_t nq = size_t(b * s * hq * d), nk = size_t(b * s * hkv * d);
  DeviceMem q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), lse(size_t(b * hq * s) * 4);
  fill_uniform(q.as<bf16>(), nq, 1, -2.f, 2.f, st);
  fill_uniform(k.as<bf16>(), nk, 2, -1.f, 1.f, st);
  fill_uniform(v.as<bf16>(), nk, 3, -1.f, 1.f, st);
  Tensor tq = Tensor::contiguous(q.get(), DType::bf16, {b, s, hq, d});
  Tensor tk = Tensor::contiguous(k.get(), DType::bf16, {b, s, hkv, d});
  Tensor tv = Tensor::contiguous(v.get(), DType::bf16, {b, s, hkv, d});
  Tensor to = Tensor::contiguous(o.get(), DType::bf16, {b, s, hq, d});
  Tensor tl = Tensor::contiguous(lse.get(), DType::f32, {b, hq, s});
  AttentionParams p;
  p.causal = causal;
  auto fused = [&] { attention_forward(tq, tk, tv, to, &tl, p, st); };

  Record rec;
  rec.op = "attention_fwd";
  rec.dtype = "bf16";
  rec.metric = "TFLOP/s";
  rec.baseline = kBaseline;
  rec.target = "ratio>=1.0";
  rec.shape = {{"B", b}, {"Hq", hq}, {"Hkv", hkv}, {"Sq", s}, {"Skv", s}, {"D", d}};
  rec.flags = {{"causal", causal}};
  char buf[160];
  std::snprintf(buf, sizeof buf, "B%lld H%lld/%lld S%lld D%lld %s", (long long)b, (long long)hq,
                (long long)hkv, (long long)s, (long long)d, causal ? "causal" : "non-causal");
  rec.case_ = buf;
  const double flops = 4.0 * b * hq * s * s * d * (causal ? 0.5 : 1.0);
  try {
    // Check on (batch 0, heads 0..3): fused vs the SIMT path.
    const int64_t hc = 4, hkc = hkv == hq ? 4 : std::max<int64_t>(1, 4 / (hq / hkv));
    DeviceMem o1(size_t(s * hc * d) * 2), o2(size_t(s * hc * d) * 2);
    Tensor cq = view(q.get(), {1, s, hc, d}, {s * hq * d, hq * d, d, 1});
    Tensor ck = view(k.get(), {1, s, hkc, d}, {s * hkv * d, hkv * d, d, 1});
    Tensor cv = view(v.get(), {1, s, hkc, d}, {s * hkv * d, hkv * d, d, 1});
    Tensor c1 = Tensor::contiguous(o1.get(), DType::bf16, {1, s, hc, d});
    Tensor c2 = Tensor::contiguous(o2.get(), DType::bf16, {1, s, hc, d});
    attention_forward(cq, ck, cv, c1, nullptr, p, st);
    {
      const detail::ScopedEnv simt("TESSEL_ATTENTION_PATH", "simt");
      attention_forward(cq, ck, cv, c2, nullptr, p, st);
    }
    const CompareResult cr =
        compare_device(o1.as<bf16>(), o2.as<bf16>(), size_t(s * hc * d), 1.6e-2f, 1.6e-2f, st);
    rec.check = cr.ok ? "OK" : "FAIL";
    rec.check_detail = cr.detail();
    fused();
    TESSEL_BENCH_CUDA(cudaStreamSynchronize(st));
    rec.ours_ms = ctx.timer().measure(fused, ctx.measure_options());
    rec.ours = flops / (rec.ours_ms * 1e-3) / 1e12;
  } catch (const std::exception& e) {
    rec.check = "ERROR";
    rec.check_detail = e.what();
    const cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess)
      throw std::runtime_error(std::string("CUDA context lost: ") + cudaGetErrorString(ce));
  }
  try {
    // Unfused, one batch at a time: (H, S, S) logits and probabilities in bf16.
    DeviceMem sc(size_t(hq * s * s) * 2), pr(size_t(hq * s * s) * 2);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    auto unfused = [&] {
      for (int64_t bi = 0; bi < b; ++bi) {
        char* qb = static_cast<char*>(q.get()) + bi * s * hq * d * 2;
        char* kb = static_cast<char*>(k.get()) + bi * s * hkv * d * 2;
        char* vb = static_cast<char*>(v.get()) + bi * s * hkv * d * 2;
        char* ob = static_cast<char*>(o.get()) + bi * s * hq * d * 2;
        Tensor a = view(qb, {hq, s, d}, {d, hq * d, 1});
        // GQA: q head h reads kv head h / (hq / hkv); batch stride d over kv heads only
        // works for MHA, so GQA cases run one bmm per group of q heads.
        Tensor ss = Tensor::contiguous(sc.get(), DType::bf16, {hq, s, s});
        Tensor pp = Tensor::contiguous(pr.get(), DType::bf16, {hq, s, s});
        GemmOptions scaled;
        scaled.alpha = scale;
        if (hkv == hq) {
          Tensor kk = view(kb, {hkv, s, d}, {d, hkv * d, 1});
          bmm(a, kk, ss, st, scaled);
        } else {
          const int64_t grp = hq / hkv;
          for (int64_t hk = 0; hk < hkv; ++hk) {
            Tensor aa = view(qb + hk * grp * d * 2, {grp, s, d}, {d, hq * d, 1});
            Tensor kk = view(kb + hk * d * 2, {s, d}, {hkv * d, 1});
            Tensor sg = Tensor::contiguous(static_cast<char*>(sc.get()) + hk * grp * s * s * 2,
                                           DType::bf16, {grp, s, s});
            bmm(aa, kk, sg, st, scaled);
          }
        }
        softmax(ss, pp, st);
        GemmOptions kn;
        kn.b_layout = BLayout::kn;
        if (hkv == hq) {
          Tensor vv = view(vb, {hkv, s, d}, {d, hkv * d, 1});
          Tensor oo = view(ob, {hq, s, d}, {d, hq * d, 1});
          bmm(pp, vv, oo, st, kn);
        } else {
          const int64_t grp = hq / hkv;
          for (int64_t hk = 0; hk < hkv; ++hk) {
            Tensor pg = Tensor::contiguous(static_cast<char*>(pr.get()) + hk * grp * s * s * 2,
                                           DType::bf16, {grp, s, s});
            Tensor vv = view(vb + hk * d * 2, {s, d}, {hkv * d, 1});
            Tensor oo = view(ob + hk * grp * d * 2, {grp, s, d}, {d, hq * d, 1});
            bmm(pg, vv, oo, st, kn);
          }
        }
      }
    };
    unfused();
    TESSEL_BENCH_CUDA(cudaStreamSynchronize(st));
    rec.baseline_ms = ctx.timer().measure(unfused, ctx.measure_options());
    rec.baseline_value = flops / (rec.baseline_ms * 1e-3) / 1e12;
  } catch (const std::exception& e) {
    rec.check_detail += std::string(" (baseline failed: ") + e.what() + ")";
    const cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess)
      throw std::runtime_error(std::string("CUDA context lost: ") + cudaGetErrorString(ce));
  }
  ctx.add(std::move(rec));
}

void run_attention_suite(SuiteContext& ctx) {
  for (int64_t d : {128, 64})
    for (bool causal : {false, true}) attention_case(ctx, 4, 32, 32, 4096, d, causal);
  attention_case(ctx, 4, 32, 8, 4096, 128, true);  // GQA 4
}

}  // namespace

TESSEL_BENCH_SUITE("attention",
                   "attention forward (TMA + WGMMA FlashAttention), bf16, B4 H32 S4096 D128/64, "
                   "causal and not, vs unfused tessel bmm + softmax + bmm",
                   run_attention_suite);

}  // namespace tessel::bench
