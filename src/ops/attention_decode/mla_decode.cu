// MLA (DeepSeek-V2) decode in the absorbed form: one latent "KV head" of 576 dims per token
// ([c (512) | k_rope (64)]) shared by all H query heads. decode_kernel runs with DQK = 576
// (q_latent dims from one tensor, q_rope dims from another), DV = 512 read from the same shared
// memory tile (each latent byte is loaded once), 8 warps, 32-token tiles (blocks of <= 16 rows
// in bf16: alternative tilings selectable by TESSEL_MLA_CFG, see mla_config.hpp).
// Bytes: every cached latent row once per block of 16 (H <= 16) or 64 query rows.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops/attention_decode/decode_launch.cuh"
#include "ops/attention_decode/mla_config.hpp"
#include "ops/attention_decode/mla_wgmma_kernel.cuh"

namespace tessel {
namespace {

using decode::KernelArgs;

constexpr int kLatent = 512, kRope = 64, kRow = kLatent + kRope;

// 16 rows: 2 stages of 36 KB (98 KB, 2 CTAs/SM), the 576-dim S product of each of the 2 units
// split over 4 warps (KSPLIT 4: all 8 warps busy; 0.83 vs 0.68-0.76 of the copy bandwidth with 2
// busy warps); 64 rows: 3 stages + a 72 KB Q tile (185 KB, 1 CTA/SM), 8 units for 8 warps.
template <class T, int MT, bool PAGED>
using MlaCfg = decode::Cfg<T, kRow, kLatent, kLatent, true, MT, 8, 32, MT == 1 ? 2 : 3, PAGED,
                           MT == 1 ? 4 : 1>;

// The alternatives for 16 rows (mla_config.hpp; TESSEL_MLA_CFG): the H200 reads the default at
// 0.68-0.82 of the copy bandwidth (the H100 0.88-0.91), with one 36 KB tile in flight per CTA.
// 16-token tiles give more, smaller tiles in flight: (1) the same ring bytes as 4 stages, (2) a
// 6-stage ring on 4 warps, (3) 3 stages on 4 warps at 3 CTAs/SM. The S product is split over
// all warps as in the default (KSPLIT = warps / 16-token slabs); (2) and (3) keep Q in
// registers to fit. bf16 only (the DeepSeek cache): f16 keeps the default.
template <bool PAGED, int TILE, int STAGES, int NW, bool QREG>
using MlaSmallCfg = decode::Cfg<__nv_bfloat16, kRow, kLatent, kLatent, true, 1, NW, TILE, STAGES,
                                PAGED, NW * 16 / TILE, QREG>;
template <bool PAGED>
using MlaSmall1 = MlaSmallCfg<PAGED, 16, 4, 8, false>;
template <bool PAGED>
using MlaSmall2 = MlaSmallCfg<PAGED, 16, 6, 4, true>;
// 162 registers (ptxas, CUDA 13.0): 168 allocated x 128 threads x 3 CTAs fits the 64K register
// file. A build needing more than 168 would run 2 CTAs/SM (the occupancy query sizes the splits
// either way); __launch_bounds__ with a minimum would change every other decode kernel's code.
template <bool PAGED>
using MlaSmall3 = MlaSmallCfg<PAGED, 16, 3, 4, true>;

// Per-SM shared memory 228 KB, 1 KB of it reserved per CTA.
constexpr size_t smem_per_cta(int ctas) { return 233472 / ctas - 1024; }
static_assert(MlaCfg<__nv_bfloat16, 1, true>::SMEM <= smem_per_cta(2));
static_assert(MlaSmall1<true>::SMEM <= smem_per_cta(2));
static_assert(MlaSmall2<true>::SMEM <= smem_per_cta(2));
static_assert(MlaSmall3<true>::SMEM <= smem_per_cta(3));

template <bool PAGED>
int small_resident_ctas(int n) {
  switch (n) {
    case 1: return decode::resident_ctas<MlaSmall1<PAGED>>();
    case 2: return decode::resident_ctas<MlaSmall2<PAGED>>();
    case 3: return decode::resident_ctas<MlaSmall3<PAGED>>();
    default: return decode::resident_ctas<MlaCfg<__nv_bfloat16, 1, PAGED>>();
  }
}

template <bool PAGED>
void launch_small_bf16(const KernelArgs& a, int64_t splits, cudaStream_t stream, const char* op) {
  switch (detail::mla_small_config()) {
    case 1: decode::launch_decode<MlaSmall1<PAGED>>(a, splits, stream, op); return;
    case 2: decode::launch_decode<MlaSmall2<PAGED>>(a, splits, stream, op); return;
    case 3: decode::launch_decode<MlaSmall3<PAGED>>(a, splits, stream, op); return;
    default: decode::launch_decode<MlaCfg<__nv_bfloat16, 1, PAGED>>(a, splits, stream, op);
  }
}

std::atomic<int> g_small_override{-1};

template <class T>
void dispatch(KernelArgs a, const decode::CacheGeometry& g, int64_t splits, bool paged,
              cudaStream_t stream) {
  const char* op = "mla_decode";
  const bool wide = a.rows_total > 16;
  // Blocks of 64 rows run on WGMMA (mla_wgmma_kernel.cuh) where the cache geometry allows;
  // TESSEL_MLA_WGMMA=0 keeps them on decode_kernel (A/B, debugging).
  static const bool wgmma_allowed = [] {
    const char* e = std::getenv("TESSEL_MLA_WGMMA");
    return !(e && e[0] == '0');
  }();
  if (wide && wgmma_allowed && decode::mla::wgmma_supported(paged, g.page_size)) {
    if (paged)
      decode::mla::launch<T, true>(a, a.k, a.k_st, a.k_sb, g, splits, stream, op);
    else
      decode::mla::launch<T, false>(a, a.k, a.k_st, a.k_sb, g, splits, stream, op);
    return;
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (!wide) {
      if (paged)
        launch_small_bf16<true>(a, splits, stream, op);
      else
        launch_small_bf16<false>(a, splits, stream, op);
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

namespace detail {

int mla_small_config() {
  static const int from_env = [] {
    const char* e = std::getenv("TESSEL_MLA_CFG");
    if (e == nullptr || e[0] == '\0') return 0;
    char* tail = nullptr;
    const long n = std::strtol(e, &tail, 10);
    if (*tail != '\0' || n < 0 || n >= kMlaSmallConfigs) {
      std::fprintf(stderr, "[tessel] TESSEL_MLA_CFG=%s is not 0..%d: using 0\n", e,
                   kMlaSmallConfigs - 1);
      return 0;
    }
    return static_cast<int>(n);
  }();
  const int o = g_small_override.load(std::memory_order_relaxed);
  return o >= 0 ? o : from_env;
}

void set_mla_small_config(int n) {
  g_small_override.store(n >= 0 && n < kMlaSmallConfigs ? n : -1, std::memory_order_relaxed);
}

int mla_small_resident_ctas(int n, bool paged) {
  return paged ? small_resident_ctas<true>(n) : small_resident_ctas<false>(n);
}

}  // namespace detail

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
