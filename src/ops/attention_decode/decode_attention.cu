// GQA decode attention over a contiguous or paged KV cache (see decode_kernel.cuh for the
// kernel, include/tessel/decode_attention.hpp for the contract). Bytes: the K and V rows of
// every cached token of every KV head are read once per query-row block (one block for
// Sq·Hq/Hkv <= 32 rows at D <= 128, <= 16 at D = 256).
#include <cmath>
#include <cstdlib>
#include <string>

#include "ops/attention_decode/decode_launch.cuh"
#include "ops/attention_decode/decode_rope_append.hpp"

namespace tessel {
namespace {

using decode::Cfg;
using decode::KernelArgs;

// 4 warps; 64-token tiles (32 at D = 256), 2-4 stages: 68-110 KB of shared memory, 2-3 CTAs/SM.
// D = 128 with 16 rows: 2 stages (70 KB, 3 CTAs/SM) beat 3 stages (2 CTAs/SM) on H100: 0.97 vs
// 0.90 of the copy bandwidth contiguous, 0.94 vs 0.76 with 16-token pages (see
// docs/decode_attention.md); 32 rows need 3 stages (78 KB would not fit 3 CTAs anyway).
template <class T, int D, int MT, bool PAGED>
using GqaCfg = Cfg<T, D, D, D, false, MT, 4, D == 256 ? 32 : 64,
                   D == 64 ? 4 : (D == 128 && MT == 1 ? 2 : 3), PAGED>;

// Paged D = 128 whose pages give 16-token boxes (page sizes 16 mod 32): tiles in 16-token
// sub-blocks, one box per sub-block holding both 64-dim halves of the rows (8 boxes per tile
// instead of 16). TESSEL_DECODE_SUB=0 keeps the half-row boxes (A/B).
template <class T, int MT>
using GqaSubCfg = Cfg<T, 128, 128, 128, false, MT, 4, 64, MT == 1 ? 2 : 3, true, 1, 16>;

inline bool use_sub_boxes(int64_t page_size) {
  static const bool enabled = [] {
    const char* e = std::getenv("TESSEL_DECODE_SUB");
    return !(e != nullptr && e[0] == '0');
  }();
  return enabled && page_size % 32 == 16;
}

template <class T, int D>
void dispatch_mt(KernelArgs a, int64_t splits, bool paged, cudaStream_t stream) {
  const bool two = a.rows_total > 16 && D <= 128;
  if constexpr (D == 128) {
    if (paged && use_sub_boxes(a.page_size)) {
      if (two)
        decode::launch_decode<GqaSubCfg<T, 2>>(a, splits, stream, "decode_attention");
      else
        decode::launch_decode<GqaSubCfg<T, 1>>(a, splits, stream, "decode_attention");
      return;
    }
  }
  if (paged) {
    if (two)
      decode::launch_decode<GqaCfg<T, D, D <= 128 ? 2 : 1, true>>(a, splits, stream,
                                                                  "decode_attention");
    else
      decode::launch_decode<GqaCfg<T, D, 1, true>>(a, splits, stream, "decode_attention");
  } else {
    if (two)
      decode::launch_decode<GqaCfg<T, D, D <= 128 ? 2 : 1, false>>(a, splits, stream,
                                                                   "decode_attention");
    else
      decode::launch_decode<GqaCfg<T, D, 1, false>>(a, splits, stream, "decode_attention");
  }
}

// decode_attention, or with rope != null decode_attention_rope_append (the caches are then
// written: the new tokens' rows).
void decode_gqa(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                const Tensor& seqlens, Tensor& out, Tensor* lse, const DecodeParams& p,
                const detail::DecodeRopeAppend* rope, cudaStream_t stream) {
  detail::OpCheck chk(rope ? "decode_attention_rope_append" : "decode_attention");
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale))
    chk.fail("params.scale", "a finite scale >= 0 (0: 1/sqrt(D))", std::to_string(p.scale));
  if (!(p.softcap >= 0.0) || !std::isfinite(p.softcap))
    chk.fail("params.softcap", "a finite softcap >= 0 (0: off)", std::to_string(p.softcap));
  if (p.num_splits < 0 || p.num_splits > 256)
    chk.fail("params.num_splits", "0 (heuristic) .. 256", std::to_string(p.num_splits));
  if (p.max_seqlen < 0)
    chk.fail("params.max_seqlen", ">= 0 (0: the cache capacity)", std::to_string(p.max_seqlen));
  chk.dtype_in("q", q, {DType::f16, DType::bf16});
  chk.dtype_in("k_cache", k_cache, {DType::f16, DType::bf16});
  chk.dtype_in("v_cache", v_cache, {DType::f16, DType::bf16});
  chk.dtype_in("out", out, {DType::f16, DType::bf16});
  chk.same_dtype("k_cache", k_cache, "q", q);
  chk.same_dtype("v_cache", v_cache, "q", q);
  chk.same_dtype("out", out, "q", q);
  chk.rank_in("q", q, 4, 4);
  chk.rank_in("k_cache", k_cache, 4, 4);
  chk.rank_in("v_cache", v_cache, 4, 4);
  chk.rank_in("out", out, 4, 4);
  const int64_t B = q.shape[0], Sq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  chk.same_shape("out", out, "q", q);
  const bool paged = p.block_table != nullptr;
  const int64_t Hkv = k_cache.shape[2];
  if (!paged && k_cache.shape[0] != B)
    chk.fail("k_cache",
             "shape (B = " + std::to_string(B) +
                 ", Smax, Hkv, D) (contiguous cache; "
                 "set params.block_table for a paged one)",
             "shape " + decode::dims(k_cache));
  if (k_cache.shape[3] != D)
    chk.fail("k_cache", "head dim " + std::to_string(D) + " (q's)",
             "shape " + decode::dims(k_cache));
  chk.same_shape("v_cache", v_cache, "k_cache", k_cache);
  if (Hkv < 1 || Hq % Hkv != 0)
    chk.fail("k_cache", "a KV head count that divides q's " + std::to_string(Hq) + " heads",
             std::to_string(Hkv) + " KV heads (shape " + decode::dims(k_cache) + ")");
  if (D != 64 && D != 128 && D != 256)
    chk.fail("q", "head dim 64, 128 or 256", "head dim " + std::to_string(D));
  decode::check_seqlens_table(chk, B, seqlens, p.block_table);
  decode::check_lse(chk, lse, B, Sq, Hq);
  decode::check_vector_layout(chk, "q", q);
  decode::check_vector_layout(chk, "k_cache", k_cache);
  decode::check_vector_layout(chk, "v_cache", v_cache);
  decode::check_vector_layout(chk, "out", out);
  decode::CacheGeometry g;
  g.paged = paged;
  if (paged) {
    g.num_pages = k_cache.shape[0];
    g.page_size = k_cache.shape[1];
    g.max_pages = p.block_table->shape[1];
    g.capacity = g.max_pages * g.page_size;
    if (g.page_size < 1)
      chk.fail("k_cache", "page_size >= 1 (shape (num_pages, page_size, Hkv, D))",
               "shape " + decode::dims(k_cache));
  } else {
    g.capacity = k_cache.shape[1];
  }
  if (rope) {
    for (const auto& [arg, t] :
         {std::pair<const char*, const Tensor*>{"k_new", rope->k_new}, {"v_new", rope->v_new}}) {
      if (t == nullptr) chk.fail(arg, "a tensor (B, Sq, Hkv, D)", "none");
      chk.same_dtype(arg, *t, "q", q);
      chk.rank_in(arg, *t, 4, 4);
      if (t->shape[0] != B || t->shape[1] != Sq || t->shape[2] != Hkv || t->shape[3] != D)
        chk.fail(arg,
                 "shape (" + std::to_string(B) + ", " + std::to_string(Sq) + ", " +
                     std::to_string(Hkv) + ", " + std::to_string(D) + ") (B, Sq, Hkv, D)",
                 "shape " + decode::dims(*t));
      decode::check_vector_layout(chk, arg, *t);
    }
    if (rope->rope_dim < 16 || rope->rope_dim > D || rope->rope_dim % 16 != 0)
      chk.fail("rope_dim", "a multiple of 16 in [16, D = " + std::to_string(D) + "]",
               std::to_string(rope->rope_dim));
    for (const auto& [arg, t] :
         {std::pair<const char*, const Tensor*>{"cos", rope->cos}, {"sin", rope->sin}}) {
      if (t == nullptr) chk.fail(arg, "a tensor (B·Sq, rope_dim / 2)", "none");
      chk.dtype_in(arg, *t, {DType::f32});
      if (t->ndim != 2 || t->shape[0] != B * Sq || t->shape[1] != rope->rope_dim / 2)
        chk.fail(arg,
                 "shape (" + std::to_string(B * Sq) + ", " + std::to_string(rope->rope_dim / 2) +
                     ") (B·Sq, rope_dim / 2)",
                 "shape " + decode::dims(*t));
      chk.contiguous(arg, *t);
    }
  }
  if (B > 65535 || Hkv > 65535)
    chk.fail("q", "batch and KV heads <= 65535",
             "shape " + decode::dims(q) + ", " + std::to_string(Hkv) + " KV heads");
  if (g.capacity > (int64_t{1} << 30) || g.num_pages > (int64_t{1} << 31) - 1 ||
      Sq * Hq > (int64_t{1} << 24))
    chk.fail("k_cache", "fewer than 2^30 tokens per sequence and 2^31 pages",
             "shape " + decode::dims(k_cache));
  if (B == 0 || Sq == 0 || Hq == 0) return;
  if (g.capacity < Sq)
    chk.fail("k_cache", "room for at least Sq = " + std::to_string(Sq) + " tokens per sequence",
             std::to_string(g.capacity));
  chk.device_pointer("q", q);
  chk.device_pointer("k_cache", k_cache);
  chk.device_pointer("v_cache", v_cache);
  chk.device_pointer("out", out);
  chk.device_pointer("seqlens", seqlens);
  if (paged) chk.device_pointer("block_table", *p.block_table);
  if (lse) chk.device_pointer("lse", *lse);
  if (rope) {
    chk.device_pointer("k_new", *rope->k_new);
    chk.device_pointer("v_new", *rope->v_new);
    chk.device_pointer("cos", *rope->cos);
    chk.device_pointer("sin", *rope->sin);
  }
  if (p.check_inputs) decode::check_inputs_now(chk, seqlens, p.block_table, g, B, Sq, stream);

  KernelArgs a{};
  a.q0 = q.data;
  a.q1 = q.data;
  a.q0_sb = a.q1_sb = q.strides[0];
  a.q0_ss = a.q1_ss = q.strides[1];
  a.q0_sh = a.q1_sh = q.strides[2];
  a.k = k_cache.data;
  a.v = v_cache.data;
  a.k_sb = k_cache.strides[0];
  a.k_st = k_cache.strides[1];
  a.k_sh = k_cache.strides[2];
  a.v_sb = v_cache.strides[0];
  a.v_st = v_cache.strides[1];
  a.v_sh = v_cache.strides[2];
  decode::fill_sequence_args(a, p, g, paged, seqlens, out, lse, B, Sq, Hq, Hkv);
  a.plan_len = p.max_seqlen;
  if (rope) {
    a.rope_cos = static_cast<const float*>(rope->cos->data);
    a.rope_sin = static_cast<const float*>(rope->sin->data);
    a.rope_half = static_cast<int>(rope->rope_dim / 2);
    a.rope_neox = rope->neox ? 1 : 0;
    a.new_k = rope->k_new->data;
    a.new_v = rope->v_new->data;
    a.nk_sb = rope->k_new->strides[0];
    a.nk_ss = rope->k_new->strides[1];
    a.nk_sh = rope->k_new->strides[2];
    a.nv_sb = rope->v_new->strides[0];
    a.nv_ss = rope->v_new->strides[1];
    a.nv_sh = rope->v_new->strides[2];
  }
  const double scale = p.scale > 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(D));
  constexpr double kLog2e = 1.4426950408889634;
  a.scale_log2 = static_cast<float>(scale * kLog2e);
  if (p.softcap > 0.0) {
    a.scale_over_cap = static_cast<float>(scale / p.softcap);
    a.cap_log2 = static_cast<float>(p.softcap * kLog2e);
  }
  auto by_dtype = [&](auto tag) {
    using T = decltype(tag);
    switch (D) {
      case 64: dispatch_mt<T, 64>(a, p.num_splits, paged, stream); break;
      case 128: dispatch_mt<T, 128>(a, p.num_splits, paged, stream); break;
      default: dispatch_mt<T, 256>(a, p.num_splits, paged, stream); break;
    }
  };
  if (q.dtype == DType::bf16)
    by_dtype(__nv_bfloat16{});
  else
    by_dtype(__half{});
}

}  // namespace

void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& seqlens, Tensor& out, Tensor* lse, const DecodeParams& p,
                      cudaStream_t stream) {
  decode_gqa(q, k_cache, v_cache, seqlens, out, lse, p, nullptr, stream);
}

namespace detail {

void decode_attention_rope_append(const Tensor& q, const DecodeRopeAppend& rope, Tensor& k_cache,
                                  Tensor& v_cache, const Tensor& seqlens, Tensor& out, Tensor* lse,
                                  const DecodeParams& p, cudaStream_t stream) {
  decode_gqa(q, k_cache, v_cache, seqlens, out, lse, p, &rope, stream);
}

}  // namespace detail

}  // namespace tessel
