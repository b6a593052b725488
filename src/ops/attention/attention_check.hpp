// Argument checks shared by attention_forward (attention_fwd.cu) and attention_backward
// (attention_bwd.cu): the q / k / v geometry (padded or varlen), the optional lse and sinks, and
// the scalar parameters. Each op adds the checks of its own outputs / gradients.
#pragma once

#include <cmath>
#include <initializer_list>
#include <string>

#include "runtime/check.hpp"
#include "tessel/attention.hpp"

namespace tessel::attention_detail {

inline constexpr std::initializer_list<DType> kAttnTypes = {DType::bf16, DType::f16};

inline void check_last_contiguous(const detail::OpCheck& chk, const char* arg, const Tensor& t) {
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1)
    chk.fail(arg, "a contiguous last axis (stride 1)",
             "stride " + std::to_string(t.strides[t.ndim - 1]));
  for (int d = 0; d < t.ndim; ++d)
    if (t.strides[d] < 0)
      chk.fail(arg, "non-negative strides", "stride " + std::to_string(t.strides[d]));
}

inline void check_dims(const detail::OpCheck& chk, const char* arg, const Tensor& t,
                       std::initializer_list<int64_t> want) {
  bool same = t.ndim == static_cast<int>(want.size());
  int d = 0;
  for (int64_t w : want) same = same && t.shape[d++] == w;
  if (!same) {
    std::string s = "(";
    d = 0;
    for (int64_t w : want) s += (d++ ? ", " : "") + std::to_string(w);
    chk.fail(arg, "shape " + s + (want.size() == 1 ? ",)" : ")"), "shape " + t.shape_string());
  }
}

// The problem q, k, v describe (padded: B, Sq, Skv; varlen: B = offsets - 1, Sq/Skv = Tq/Tk).
struct AttnShape {
  bool varlen = false;
  int64_t batches = 0, sq = 0, skv = 0, d = 0, hq = 0, hkv = 0;
};

// Checks q, k, v (one dtype of kAttnTypes, ranks, layouts, head dim, GQA ratio, v like k,
// last axes contiguous), the varlen offsets, lse (f32, (B, Hq, Sq) or (Hq, Tq), contiguous;
// nullptr: none), sinks and the scalar parameters; returns the problem's shape.
inline AttnShape check_qkv(const detail::OpCheck& chk, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor* lse, const AttentionParams& params) {
  chk.dtype_in("q", q, kAttnTypes);
  chk.same_dtype("k", k, "q", q);
  chk.same_dtype("v", v, "q", q);
  if (lse) chk.dtype_in("lse", *lse, {DType::f32});
  if (params.sinks) chk.dtype_in("sinks", *params.sinks, {DType::f32});
  AttnShape g;
  g.varlen = params.cu_seqlens_q != nullptr || params.cu_seqlens_k != nullptr;
  if (g.varlen) {
    if (!params.cu_seqlens_q || !params.cu_seqlens_k)
      chk.fail(params.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
               "both cu_seqlens_q and cu_seqlens_k (varlen) or neither", "only one");
    chk.dtype_in("cu_seqlens_q", *params.cu_seqlens_q, {DType::i32});
    chk.dtype_in("cu_seqlens_k", *params.cu_seqlens_k, {DType::i32});
  }
  const int rank = g.varlen ? 3 : 4;
  chk.rank_in("q", q, rank, rank);
  chk.rank_in("k", k, rank, rank);
  chk.rank_in("v", v, rank, rank);
  chk.valid_layout("q", q);
  chk.valid_layout("k", k);
  chk.valid_layout("v", v);
  g.d = q.size(-1), g.hq = q.size(-2), g.hkv = k.size(-2);
  if (g.d != 64 && g.d != 128 && g.d != 256)
    chk.fail("q", "head dim (last axis) in {64, 128, 256}", "head dim " + std::to_string(g.d));
  if (k.size(-1) != g.d)
    chk.fail("k", "head dim " + std::to_string(g.d) + " (q's)", "shape " + k.shape_string());
  if (g.hkv < 1 || g.hq % g.hkv != 0)
    chk.fail("k", "a head count dividing q's " + std::to_string(g.hq) + " heads",
             std::to_string(g.hkv) + " heads (shape " + k.shape_string() + ")");
  chk.same_shape("v", v, "k", k);
  if (g.varlen) {
    chk.rank_in("cu_seqlens_q", *params.cu_seqlens_q, 1, 1);
    chk.contiguous("cu_seqlens_q", *params.cu_seqlens_q);
    g.batches = params.cu_seqlens_q->shape[0] - 1;
    if (g.batches < 0)
      chk.fail("cu_seqlens_q", "B+1 >= 1 offsets", "shape " + params.cu_seqlens_q->shape_string());
    check_dims(chk, "cu_seqlens_k", *params.cu_seqlens_k, {g.batches + 1});
    chk.contiguous("cu_seqlens_k", *params.cu_seqlens_k);
    g.sq = q.shape[0];
    g.skv = k.shape[0];
    if (lse) check_dims(chk, "lse", *lse, {g.hq, g.sq});
  } else {
    g.batches = q.shape[0];
    g.sq = q.shape[1];
    g.skv = k.shape[1];
    if (k.shape[0] != g.batches)
      chk.fail("k", "batch " + std::to_string(g.batches) + " (q's)", "shape " + k.shape_string());
    if (lse) check_dims(chk, "lse", *lse, {g.batches, g.hq, g.sq});
  }
  if (params.sinks) {
    check_dims(chk, "sinks", *params.sinks, {g.hq});
    chk.contiguous("sinks", *params.sinks);
  }
  check_last_contiguous(chk, "q", q);
  check_last_contiguous(chk, "k", k);
  check_last_contiguous(chk, "v", v);
  if (lse) chk.contiguous("lse", *lse);
  if (std::isnan(params.scale) || std::isinf(params.scale))
    chk.fail("scale", "a finite scale (<= 0: 1/sqrt(D))", std::to_string(params.scale));
  if (!(params.softcap >= 0.f) || std::isinf(params.softcap))
    chk.fail("softcap", "a finite softcap >= 0 (0: none)", std::to_string(params.softcap));
  if (params.window_left < -1)
    chk.fail("window_left", ">= -1 (-1: unlimited)", std::to_string(params.window_left));
  if (params.window_right < -1)
    chk.fail("window_right", ">= -1 (-1: unlimited)", std::to_string(params.window_right));
  constexpr int64_t kIntMax = 2147483647;
  if (g.sq > kIntMax || g.skv > kIntMax || g.batches > 65535 || g.hq > 65535)
    chk.fail("q", "sequence lengths < 2^31, batch and heads <= 65535", "shape " + q.shape_string());
  return g;
}

}  // namespace tessel::attention_detail
