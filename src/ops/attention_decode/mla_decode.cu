// MLA (DeepSeek-V2) decode in the absorbed form: one latent "KV head" of 576 dims per token
// ([c (512) | k_rope (64)]) shared by all H query heads. decode_kernel runs with DQK = 576
// (q_latent dims from one tensor, q_rope dims from another), DV = 512 read from the same shared
// memory tile (each latent byte is loaded once), 8 warps, 32-token tiles. Where the cache's
// 64-token tiles are whole TMA boxes, WGMMA kernels take over (mla_launch.cuh): blocks of 64 rows
// on mla_wgmma_kernel, blocks of <= 16 rows on mla_swap_kernel.
// Bytes: every cached latent row once per block of 16 (H <= 16) or 64 query rows.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "ops/attention_decode/decode_launch.cuh"
#include "ops/attention_decode/mla_config.hpp"
#include "ops/attention_decode/mla_launch.cuh"

namespace tessel {

namespace detail {
namespace {
std::atomic<int>& mla_swap_state() {  // -1: not read yet
  static std::atomic<int> s{-1};
  return s;
}
}  // namespace
int mla_swap_mode() {
  int v = mla_swap_state().load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("TESSEL_MLA_SWAP");
    v = e && (e[0] == '0' || e[0] == '2') ? e[0] - '0' : 1;
    mla_swap_state().store(v, std::memory_order_relaxed);
  }
  return v;
}
void set_mla_swap(int mode) { mla_swap_state().store(mode < 0 ? 0 : mode > 2 ? 2 : mode); }
}  // namespace detail

namespace {

using decode::KernelArgs;

constexpr int kLatent = 512, kRope = 64, kRow = kLatent + kRope;

// 16 rows: 2 stages of 36 KB (98 KB, 2 CTAs/SM), the 576-dim S product of each of the 2 units
// split over 4 warps (KSPLIT 4: all 8 warps busy; 0.83 vs 0.68-0.76 of the copy bandwidth with 2
// busy warps); 64 rows: 3 stages + a 72 KB Q tile (185 KB, 1 CTA/SM), 8 units for 8 warps.
template <class T, int MT, bool PAGED>
using MlaCfg = decode::Cfg<T, kRow, kLatent, kLatent, true, MT, 8, 32, MT == 1 ? 2 : 3, PAGED,
                           MT == 1 ? 4 : 1>;

template <class T>
void dispatch(KernelArgs a, const decode::CacheGeometry& g, int64_t splits, bool paged,
              cudaStream_t stream) {
  const char* op = "mla_decode";
  const bool wide = a.rows_total > 16;
  // Blocks of 64 rows run on WGMMA (mla_wgmma_kernel.cuh) where the cache geometry allows, blocks
  // of <= 16 rows on mla_swap_kernel when its splits get >= 3 tiles (swap_tiles_per_split: shorter
  // ranges stay on decode_kernel); TESSEL_MLA_WGMMA=0 keeps both on decode_kernel,
  // TESSEL_MLA_SWAP=0 / 2 (or detail::set_mla_swap) the small blocks on one kernel (A/B, tests).
  static const bool wgmma_allowed = [] {
    const char* e = std::getenv("TESSEL_MLA_WGMMA");
    return !(e && e[0] == '0');
  }();
  if (wgmma_allowed && decode::mla::wgmma_supported(paged, g.page_size)) {
    if (wide) {
      if (paged)
        decode::mla::launch<T, true, false>(a, a.k, a.k_st, a.k_sb, g, splits, stream, op);
      else
        decode::mla::launch<T, false, false>(a, a.k, a.k_st, a.k_sb, g, splits, stream, op);
      return;
    }
    const int swap = detail::mla_swap_mode();
    if (swap == 2 || (swap == 1 && decode::mla::swap_tiles_per_split(a, splits) >= 3)) {
      if (paged)
        decode::mla::launch<T, true, true>(a, a.k, a.k_st, a.k_sb, g, splits, stream, op);
      else
        decode::mla::launch<T, false, true>(a, a.k, a.k_st, a.k_sb, g, splits, stream, op);
      return;
    }
  }
  if (paged) {
    if (wide)
      decode::launch_decode<MlaCfg<T, 4, true>>(a, splits, stream, op);
    else
      decode::launch_decode<MlaCfg<T, 1, true>>(a, splits, stream, op);
  } else {
    if (wide)
      decode::launch_decode<MlaCfg<T, 4, false>>(a, splits, stream, op);
    else
      decode::launch_decode<MlaCfg<T, 1, false>>(a, splits, stream, op);
  }
}

}  // namespace

void mla_decode(const Tensor& q_latent, const Tensor& q_rope, const Tensor& latent_cache,
                const Tensor& seqlens, Tensor& out, Tensor* lse, const DecodeParams& p,
                cudaStream_t stream) {
  detail::OpCheck chk("mla_decode");
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale))
    chk.fail("params.scale", "a finite scale >= 0 (0: 1/sqrt(576))", std::to_string(p.scale));
  if (p.softcap != 0.0)
    chk.fail("params.softcap", "0 (MLA has no soft cap)", std::to_string(p.softcap));
  if (p.num_splits < 0 || p.num_splits > 256)
    chk.fail("params.num_splits", "0 (heuristic) .. 256", std::to_string(p.num_splits));
  if (p.max_seqlen < 0)
    chk.fail("params.max_seqlen", ">= 0 (0: the cache capacity)", std::to_string(p.max_seqlen));
  chk.dtype_in("q_latent", q_latent, {DType::f16, DType::bf16});
  chk.dtype_in("q_rope", q_rope, {DType::f16, DType::bf16});
  chk.dtype_in("latent_cache", latent_cache, {DType::f16, DType::bf16});
  chk.dtype_in("out", out, {DType::f16, DType::bf16});
  chk.same_dtype("q_rope", q_rope, "q_latent", q_latent);
  chk.same_dtype("latent_cache", latent_cache, "q_latent", q_latent);
  chk.same_dtype("out", out, "q_latent", q_latent);
  chk.rank_in("q_latent", q_latent, 4, 4);
  chk.rank_in("q_rope", q_rope, 4, 4);
  chk.rank_in("latent_cache", latent_cache, 3, 3);
  chk.rank_in("out", out, 4, 4);
  const int64_t B = q_latent.shape[0], Sq = q_latent.shape[1], H = q_latent.shape[2];
  if (q_latent.shape[3] != kLatent)
    chk.fail("q_latent", "shape (B, Sq, H, 512)", "shape " + decode::dims(q_latent));
  if (q_rope.shape[0] != B || q_rope.shape[1] != Sq || q_rope.shape[2] != H ||
      q_rope.shape[3] != kRope)
    chk.fail("q_rope",
             "shape (" + std::to_string(B) + ", " + std::to_string(Sq) + ", " + std::to_string(H) +
                 ", 64) (q_latent's B, Sq, H)",
             "shape " + decode::dims(q_rope));
  chk.same_shape("out", out, "q_latent", q_latent);
  const bool paged = p.block_table != nullptr;
  if (latent_cache.shape[2] != kRow)
    chk.fail("latent_cache",
             std::string(paged ? "shape (num_pages, page_size, 576)" : "shape (B, Smax, 576)") +
                 " (512 latent + 64 rope dims)",
             "shape " + decode::dims(latent_cache));
  if (!paged && latent_cache.shape[0] != B)
    chk.fail("latent_cache",
             "shape (B = " + std::to_string(B) +
                 ", Smax, 576) (contiguous cache; set "
                 "params.block_table for a paged one)",
             "shape " + decode::dims(latent_cache));
  decode::check_seqlens_table(chk, B, seqlens, p.block_table);
  decode::check_lse(chk, lse, B, Sq, H);
  decode::check_vector_layout(chk, "q_latent", q_latent);
  decode::check_vector_layout(chk, "q_rope", q_rope);
  decode::check_vector_layout(chk, "latent_cache", latent_cache);
  decode::check_vector_layout(chk, "out", out);
  decode::CacheGeometry g;
  g.paged = paged;
  if (paged) {
    g.num_pages = latent_cache.shape[0];
    g.page_size = latent_cache.shape[1];
    g.max_pages = p.block_table->shape[1];
    g.capacity = g.max_pages * g.page_size;
    if (g.page_size < 1)
      chk.fail("latent_cache", "page_size >= 1", "shape " + decode::dims(latent_cache));
  } else {
    g.capacity = latent_cache.shape[1];
  }
  if (B > 65535) chk.fail("q_latent", "batch <= 65535", "shape " + decode::dims(q_latent));
  if (g.capacity > (int64_t{1} << 30) || g.num_pages > (int64_t{1} << 31) - 1 ||
      Sq * H > (int64_t{1} << 24))
    chk.fail("latent_cache", "fewer than 2^30 tokens per sequence and 2^31 pages",
             "shape " + decode::dims(latent_cache));
  if (B == 0 || Sq == 0 || H == 0) return;
  if (g.capacity < Sq)
    chk.fail("latent_cache",
             "room for at least Sq = " + std::to_string(Sq) + " tokens per sequence",
             std::to_string(g.capacity));
  chk.device_pointer("q_latent", q_latent);
  chk.device_pointer("q_rope", q_rope);
  chk.device_pointer("latent_cache", latent_cache);
  chk.device_pointer("out", out);
  chk.device_pointer("seqlens", seqlens);
  if (paged) chk.device_pointer("block_table", *p.block_table);
  if (lse) chk.device_pointer("lse", *lse);
  if (p.check_inputs) decode::check_inputs_now(chk, seqlens, p.block_table, g, B, Sq, stream);

  KernelArgs a{};
  a.q0 = q_latent.data;
  a.q0_sb = q_latent.strides[0];
  a.q0_ss = q_latent.strides[1];
  a.q0_sh = q_latent.strides[2];
  a.q1 = q_rope.data;
  a.q1_sb = q_rope.strides[0];
  a.q1_ss = q_rope.strides[1];
  a.q1_sh = q_rope.strides[2];
  a.k = a.v = latent_cache.data;
  a.k_sb = a.v_sb = latent_cache.strides[0];
  a.k_st = a.v_st = latent_cache.strides[1];
  a.k_sh = a.v_sh = 0;
  // One latent "KV head" shared by all H query heads.
  decode::fill_sequence_args(a, p, g, paged, seqlens, out, lse, B, Sq, H, 1);
  a.plan_len = p.max_seqlen;
  const double scale = p.scale > 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(kRow));
  a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  if (q_latent.dtype == DType::bf16)
    dispatch<__nv_bfloat16>(a, g, p.num_splits, paged, stream);
  else
    dispatch<__half>(a, g, p.num_splits, paged, stream);
}

}  // namespace tessel
