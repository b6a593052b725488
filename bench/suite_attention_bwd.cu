// Bench suite "attention_bwd": the attention backward (op attention_bwd), bf16, B=4, H=32,
// S=4096, head dims 128 and 64 (and 256 with 16 heads), causal and not, plus a GQA case. The
// default mode runs the WGMMA dk/dv kernel; check_detail also gives the default mode forced onto
// the mma.sync kernels (TESSEL_ATTENTION_BWD_PATH=mma).
//
// TFLOP/s counts 2.5 x the forward's 4 * B * Hq * Sq * Skv * D flops (the FlashAttention
// convention: five matmuls of the forward's two's size), halved for causal.
// Baseline: tessel's own deterministic mode (a separate dq kernel that recomputes S and dP
// instead of f32 atomics) — the ratio says what the default's dq atomics buy. The real
// competitors (torch SDPA backward, flash and cuDNN) are measured by
// bench/vs_torch_attention_bwd.py. Target: ratio >= 1.0.
// Check, once before timing: the default mode's dq/dk/dv against the deterministic mode's on
// the same inputs (dk/dv come from the same kernel; dq from two different ones), bf16
// tolerance; both are tested against float64 in tests/test_attention_bwd_gpu.cpp.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

#include "bench_util.cuh"
#include "harness.hpp"
#include "runtime/scoped_env.hpp"
#include "tessel/attention.hpp"
#include "tessel/attention_backward.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

using bf16 = __nv_bfloat16;
constexpr const char* kBaseline = "tessel attention_backward deterministic";

void attention_bwd_case(SuiteContext& ctx, int64_t b, int64_t hq, int64_t hkv, int64_t s, int64_t d,
                        bool causal, float softcap = 0.f) {
  if (!ctx.wants("attention_bwd")) return;
  const cudaStream_t st = ctx.stream();
  const size_t nq = size_t(b * s * hq * d), nk = size_t(b * s * hkv * d);
  DeviceMem q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), g(nq * 2), lse(size_t(b * hq * s) * 4);
  DeviceMem dq(nq * 2), dk(nk * 2), dv(nk * 2), dq2(nq * 2), dk2(nk * 2), dv2(nk * 2);
  fill_uniform(q.as<bf16>(), nq, 1, -2.f, 2.f, st);
  fill_uniform(k.as<bf16>(), nk, 2, -1.f, 1.f, st);
  fill_uniform(v.as<bf16>(), nk, 3, -1.f, 1.f, st);
  fill_uniform(g.as<bf16>(), nq, 4, -1.f, 1.f, st);
  // TESSEL_BENCH_HEADS_MAJOR=1: (B, S, H, D) views of (B, H, S, D) memory, as
  // bench/vs_torch_attention_bwd.py passes torch's SDPA tensors (a dev knob; records use the
  // default dense (B, S, H, D)).
  const char* hm = std::getenv("TESSEL_BENCH_HEADS_MAJOR");
  const bool heads_major = hm && hm[0] == '1';
  auto view = [&](void* p, int64_t h) {
    Tensor t = Tensor::contiguous(p, DType::bf16, {b, s, h, d});
    if (heads_major) t.strides[1] = d, t.strides[2] = s * d;
    return t;
  };
  auto qt = [&](void* p) { return view(p, hq); };
  auto kt = [&](void* p) { return view(p, hkv); };
  Tensor tq = qt(q.get()), tk = kt(k.get()), tv = kt(v.get()), to = qt(o.get()), tg = qt(g.get());
  Tensor tdq = qt(dq.get()), tdk = kt(dk.get()), tdv = kt(dv.get());
  Tensor tdq2 = qt(dq2.get()), tdk2 = kt(dk2.get()), tdv2 = kt(dv2.get());
  Tensor tl = Tensor::contiguous(lse.get(), DType::f32, {b, hq, s});
  AttentionBackwardParams p;
  p.causal = causal;
  p.softcap = softcap;
  AttentionBackwardParams pd = p;
  pd.deterministic = true;
  auto ours = [&] { attention_backward(tq, tk, tv, to, tg, tl, tdq, tdk, tdv, p, st); };
  auto det = [&] { attention_backward(tq, tk, tv, to, tg, tl, tdq2, tdk2, tdv2, pd, st); };

  Record rec;
  rec.op = "attention_bwd";
  rec.dtype = "bf16";
  rec.metric = "TFLOP/s";
  rec.baseline = kBaseline;
  rec.target = "ratio>=1.0";
  rec.shape = {{"B", b}, {"Hq", hq}, {"Hkv", hkv}, {"Sq", s}, {"Skv", s}, {"D", d}};
  rec.flags = {{"causal", causal}, {"softcap", softcap > 0.f}};
  char buf[160];
  std::snprintf(buf, sizeof buf, "B%lld H%lld/%lld S%lld D%lld %s", (long long)b, (long long)hq,
                (long long)hkv, (long long)s, (long long)d, causal ? "causal" : "non-causal");
  if (softcap > 0.f)
    std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), " soft-cap %g",
                  static_cast<double>(softcap));
  rec.case_ = buf;
  const double flops = 2.5 * 4.0 * b * hq * s * s * d * (causal ? 0.5 : 1.0);
  try {
    attention_forward(tq, tk, tv, to, &tl, p, st);
    ours();
    det();
    std::string detail;
    bool ok = true;
    for (auto [x, y, n, name] : {std::tuple{&dq, &dq2, nq, "dq"}, std::tuple{&dk, &dk2, nk, "dk"},
                                 std::tuple{&dv, &dv2, nk, "dv"}}) {
      const CompareResult cr =
          compare_device(x->as<bf16>(), y->as<bf16>(), n, 1.6e-2f, 1.6e-2f, st);
      ok = ok && cr.ok;
      detail += std::string(detail.empty() ? "" : "; ") + name + ": " + cr.detail();
    }
    rec.check = ok ? "OK" : "FAIL";
    rec.check_detail = detail;
    TESSEL_BENCH_CUDA(cudaStreamSynchronize(st));
    rec.ours_ms = ctx.timer().measure(ours, ctx.measure_options());
    rec.ours = flops / (rec.ours_ms * 1e-3) / 1e12;
    rec.baseline_ms = ctx.timer().measure(det, ctx.measure_options());
    rec.baseline_value = flops / (rec.baseline_ms * 1e-3) / 1e12;
    // The default mode on the mma.sync kernels (what the WGMMA kernel replaced), for the
    // record: TESSEL_ATTENTION_BWD_PATH=mma.
    double mma_ms;
    {
      const detail::ScopedEnv mma("TESSEL_ATTENTION_BWD_PATH", "mma");
      mma_ms = ctx.timer().measure(ours, ctx.measure_options());
    }
    char note[96];
    std::snprintf(note, sizeof note, "; default mode on mma.sync: %.1f TFLOP/s (%.3f ms)",
                  flops / (mma_ms * 1e-3) / 1e12, mma_ms);
    rec.check_detail += note;
  } catch (const std::exception& e) {
    rec.check = "ERROR";
    rec.check_detail = e.what();
    const cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess)
      throw std::runtime_error(std::string("CUDA context lost: ") + cudaGetErrorString(ce));
  }
  ctx.add(std::move(rec));
}

void run_attention_bwd_suite(SuiteContext& ctx) {
  for (int64_t d : {128, 64})
    for (bool causal : {false, true}) attention_bwd_case(ctx, 4, 32, 32, 4096, d, causal);
  attention_bwd_case(ctx, 4, 32, 8, 4096, 128, true);  // GQA 4
  // Head dim 256 (Gemma-style): half the heads, the same flops as D128.
  for (bool causal : {false, true}) attention_bwd_case(ctx, 4, 16, 16, 4096, 256, causal);
  // Gemma-2-9B-like: GQA 2, logit soft-cap 50.
  attention_bwd_case(ctx, 4, 16, 8, 4096, 256, true, 50.f);
}

}  // namespace

TESSEL_BENCH_SUITE(
    "attention_bwd",
    "attention backward (WGMMA dk/dv kernel; mma.sync in check_detail), bf16, B4 H32 S4096 "
    "D128/64 (H16 at D256), causal and not, vs tessel's deterministic mode",
    run_attention_bwd_suite);

}  // namespace tessel::bench
