// MLA decode (absorbed form) for blocks of <= 16 query rows on Hopper: WGMMA with the operands
// swapped, a TMA producer warp and a ring of 64-dim chunks.
//
// With 16 query rows, S = Q·Kᵀ would fill a quarter of WGMMA's M = 64 (4x the tensor work).
// Transposed, the cache fills M and the query rows are N = 16:
//   Sᵀ (64 tokens x 16 rows) = K (64 x 576, the tile) · Qᵀ      A = K, K-major (the TMA layout)
//   Oᵀ (512 dims x 16 rows) += Vᵀ (512 x 64) · Pᵀ (64 x 16)     A = V, MN-major (same bytes)
// Each instruction is m64n16k16 with both operands in shared memory: 36 for Sᵀ and 32 for Oᵀ
// per 64-token tile, against the ~600 instructions per warp and 32 tokens of decode_kernel's
// mma.sync loop (whose schedulers issued every 2 cycles on the H200, session 28).
//
// One CTA = (sequence b, KV split), 2 consumer warpgroups and 1 producer warp:
//   producer   TMA-loads every tile as 9 chunks (64 dims x 64 tokens, 8 KB each, 128B swizzle)
//              into a ring of kSlots chunk slots (full / empty mbarriers per slot), running
//              ahead of the consumers by as many chunks as are free.
//   consumers  warpgroup w takes tiles w, w + 2, ...: Sᵀ, the column (query row) maxima over the
//              tile's 64 tokens (shuffles, then the 4 warps through shared memory), P = 2^(S - m)
//              into its Pᵀ tile, Oᵀ += Vᵀ·Pᵀ; the rope chunk is released after Sᵀ, the 8 latent
//              chunks after the Oᵀ WGMMAs. Each warpgroup has its own running max, row sums and
//              Oᵀ (64 registers); the two states merge at the end through shared memory.
// Rows of the last tile past the range end are zeroed in the latent chunks before Oᵀ (a cache
// may hold NaN there, and 0 · NaN would leak into O); their S is masked. Outputs, split
// partials, lse and the in-kernel merge follow decode_kernel (decode_kernel.cuh) exactly.
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>

#include <cute/arch/copy_sm90_tma.hpp>

#include "ops/attention_decode/mla_wgmma_kernel.cuh"  // WgArgs

namespace tessel::decode::mla::swap {

// mla::kRow, kLatent, kTile (64 tokens: WGMMA's M for Sᵀ) as for mla_wgmma_kernel; kRows and
// kThreads are this kernel's own.
constexpr int kRows = 16;                 // query rows per CTA: WGMMA's N
constexpr int kBlocks = kDimBlocks;       // 64-dim chunks per tile (8 latent + 1 rope)
constexpr int kChunkBytes = kTile * 128;  // 8 KB: 64 tokens x 64 dims
constexpr int kSlots = 25;                // 200 KB of ring: ~2.8 tiles
constexpr int kConsumers = 2;
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
constexpr int kOPitch = kLatent + 4;             // f32 row pitch of the output staging

struct Smem {
  alignas(1024) uint8_t ring[kSlots][kChunkBytes];
  alignas(1024) uint8_t q[kBlocks][kRows * 128];     // Q: 9 blocks of (16 rows x 64 dims)
  alignas(1024) uint8_t p[kConsumers][kRows * 128];  // Pᵀ per warpgroup: (16 rows x 64 tokens)
  float red[kConsumers][2][4][kRows];                // per-warp tile maxima, double-buffered
  float m_fin[kConsumers][kRows];                    // epilogue: each warpgroup's max
  float l_fin[kConsumers][4][kRows];                 // and its warps' row sums
  float lse_fin[kRows];                              // the rows' lse (log2 units)
  uint64_t full[kSlots], empty[kSlots];
  unsigned last;
};
constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
static_assert(kSmemBytes <= 232448, "shared memory per block");
static_assert((64 * 128 + kRows * kOPitch) * 4 <= sizeof(Smem::ring), "epilogue staging");

// A 128B-swizzled shared-memory operand: start address, leading / stride byte offsets.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// One m64n16k16 WGMMA of element type TY ("bf16" / "f16").
#define TESSEL_WGMMA_N16(TY)                                                                \
  asm volatile(                                                                             \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                          \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY                               \
      " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"                    \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
        "+f"(d[7])                                                                          \
      : "l"(da), "l"(db), "r"(acc), "n"(TransA))
// D (64 x 16, f32) (+)= A (64 x 16) · B (16 x 16), both from shared memory; A K-major, or
// MN-major (TransA). B K-major.
template <class T, int TransA>
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int acc) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    TESSEL_WGMMA_N16("bf16");
  else
    TESSEL_WGMMA_N16("f16");
}
#undef TESSEL_WGMMA_N16
// Accumulator registers pinned in place around the asynchronous WGMMAs.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Named barriers (0 is __syncthreads): 1 + w warpgroup w's own, 3 both consumer warpgroups.
constexpr int kBarWg = 1, kBarConsumers = 3;

template <class T, bool PAGED>
__global__ void __launch_bounds__(kThreads, 1)
    mla_swap_kernel(const __grid_constant__ WgArgs args) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const KernelArgs& a = args.a;

  extern __shared__ char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  auto& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024 - raw % 1024) % 1024));

  const int tid = threadIdx.x, lane = tid % 32;
  const int split = blockIdx.x, b = blockIdx.z;
  const SplitRange<kTile> range = split_range<kTile>(a, b, split);  // decode_kernel's tile order
  bool bad = range.bad;
  const int len_ok = range.len_ok, end = range.end;
  int ntiles = range.ntiles;
  auto tile_start = [&](int i) { return range.start(i); };
  if constexpr (PAGED)  // every page the range touches must be a valid id
    bad = bad || range_has_bad_page(a, b, range, tid, kThreads);

  // ---- Q (rows x 576) into 9 swizzled K-major blocks; rows past rows_total are zero ----
  for (int idx = tid; idx < kRows * (kRow / 8); idx += kThreads) {
    const int r = idx / (kRow / 8), c = idx % (kRow / 8);  // row, 16-byte chunk of the row
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < a.rows_total) {
      const int s = r / a.group, h = r - s * a.group;
      const T* src = c < kLatent / 8 ? static_cast<const T*>(a.q0) + b * a.q0_sb + s * a.q0_ss +
                                           h * a.q0_sh + c * 8
                                     : static_cast<const T*>(a.q1) + b * a.q1_sb + s * a.q1_ss +
                                           h * a.q1_sh + (c - kLatent / 8) * 8;
      v = __ldg(reinterpret_cast<const uint4*>(src));
    }
    *reinterpret_cast<uint4*>(&sm.q[c / 8][r * 128 + (((c % 8) ^ (r % 8)) << 4)]) = v;
  }
  if (tid == 0) {
    for (int s = 0; s < kSlots; ++s) {
      Barrier::init(&sm.full[s], 1);
      Barrier::init(&sm.empty[s], 4);  // the 4 warps of the consuming warpgroup
    }
    cutlass::arch::fence_barrier_init();
  }
  cutlass::arch::fence_view_async_shared();  // Q's generic stores -> visible to WGMMA
  bad = __syncthreads_or(bad);               // also: barrier init and Q visible to every thread
  if (bad) ntiles = 0;

  const int warp = tid / 32;
  if (warp == kConsumerThreads / 32) {
    // ---- producer: tile i's chunk kb is chunk number 9 i + kb of the ring ----
    const uint64_t hint = args.hint;
    const int rows = args.box_rows;
    for (int i = 0; i < ntiles; ++i) {
      const int t0 = tile_start(i);
      int pg = 0, slot_in = 0;  // box `lane` of the tile (lanes < 64 / rows)
      if constexpr (PAGED) {
        const int q = lane * rows;
        if (q < kTile) {
          // Boxes wholly past the end load any valid page (their rows are zeroed before use).
          const int pos = t0 + q < end ? t0 + q : t0;
          const int j = pos / a.page_size;
          pg = a.block_table[b * a.bt_stride + j];
          slot_in = pos - j * a.page_size;
        }
      }
      for (int kb = 0; kb < kBlocks; ++kb) {
        const uint32_t c = static_cast<uint32_t>(kBlocks * i + kb);
        const int s = static_cast<int>(c % kSlots);
        const uint32_t ph = (c / kSlots) & 1u;
        uint8_t* dst = sm.ring[s];
        if (lane == 0) {
          Barrier::wait(&sm.empty[s], ph ^ 1u);
          Barrier::arrive_and_expect_tx(&sm.full[s], kChunkBytes);
        }
        if constexpr (PAGED) {
          for (int q = 0, u = 0; q < kTile; q += rows, ++u) {
            const int p = __shfl_sync(0xffffffffu, pg, u),
                      sl = __shfl_sync(0xffffffffu, slot_in, u);
            if (lane == 0)
              cute::SM90_TMA_LOAD_3D::copy(&args.cache, &sm.full[s], hint, dst + q * 128, kb * 64,
                                           sl, p);
          }
        } else {
          if (lane == 0)
            cute::SM90_TMA_LOAD_3D::copy(&args.cache, &sm.full[s], hint, dst, kb * 64, t0, b);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  const int w = warp / 4, wtid = tid % 128, wwarp = warp % 4;
  const int trow = wwarp * 16 + lane / 4;  // + 8·i1: this thread's tokens (Sᵀ) / dims (Oᵀ)
  // This thread's 4 query rows (columns of Sᵀ / Oᵀ): col(cc) = 8·(cc / 2) + 2·(lane % 4) + cc % 2.
  auto col_of = [&](int cc) { return 8 * (cc / 2) + 2 * (lane % 4) + cc % 2; };
  int lim[4];  // causal limit (inclusive) of each column's row; -1 past rows_total
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    const int r = col_of(cc);
    lim[cc] = r < a.rows_total ? len_ok - a.sq + r / a.group : -1;
  }
  const int lim_min = len_ok - a.sq;  // row 0's limit: the smallest of the block

  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.ring[0][0]));
  const uint32_t q0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.q[0][0]));
  const uint32_t p0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.p[w][0]));
  // K-major operands: 8-row groups 1024 B apart, k-steps 32 B along the row. The MN-major Vᵀ:
  // one 64-dim atom in M, 8-token groups 1024 B apart (both offset fields), k-steps of 16 tokens
  // 2048 B apart.
  const uint64_t dq = sw128_desc(q0, 16, 1024), dp = sw128_desc(p0, 16, 1024);
  auto chunk_desc = [&](int slot) { return sw128_desc(ring0 + slot * kChunkBytes, 1024, 1024); };

  float o[8][8], m_run[4], l_run[4];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int e = 0; e < 8; ++e) o[mb][e] = 0.f;
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    m_run[cc] = -INFINITY;
    l_run[cc] = 0.f;
  }

  int par = 0;
  for (int i = w; i < ntiles; i += kConsumers, par ^= 1) {
    const int t0 = tile_start(i);
    const uint32_t c0 = static_cast<uint32_t>(kBlocks * i);
    int slot[kBlocks];
#pragma unroll
    for (int kb = 0; kb < kBlocks; ++kb) {
      const uint32_t c = c0 + kb;
      slot[kb] = static_cast<int>(c % kSlots);
      Barrier::wait(&sm.full[slot[kb]], (c / kSlots) & 1u);
    }
    const int valid = end - t0;
    if (valid < kTile) {  // zero the latent rows past the end (before Oᵀ reads them)
      for (int idx = wtid; idx < (kTile - valid) * 64; idx += 128) {
        const int r = valid + idx / 64, c = idx % 64;
        const int sl = static_cast<int>((c0 + c / 8) % kSlots);
        *reinterpret_cast<uint4*>(&sm.ring[sl][r * 128 + (c % 8) * 16]) = make_uint4(0, 0, 0, 0);
      }
      cutlass::arch::fence_view_async_shared();
      bar_sync(kBarWg + w, 128);
    }

    // Sᵀ = K·Qᵀ over the 576 dims
    float s[8];
    fence_regs(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kb = 0; kb < kBlocks; ++kb) {
      const uint64_t da = chunk_desc(slot[kb]), db = dq + (kb * kRows * 128 >> 4);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_n16<T, 0>(s, da + 2 * ks, db + 2 * ks, kb | ks);
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_regs(s);
    if (lane == 0) Barrier::arrive(&sm.empty[slot[kBlocks - 1]]);  // the rope chunk is done

    // scale, mask, the columns' maxima over the tile's 64 tokens
    const bool need_mask = t0 + kTile > end || t0 + kTile - 1 > lim_min;
    float mx[4];
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      mx[cc] = -INFINITY;
#pragma unroll
      for (int i1 = 0; i1 < 2; ++i1) {
        const int e = 4 * (cc / 2) + 2 * i1 + cc % 2;
        float x = s[e] * a.scale_log2;
        if (need_mask) {
          const int pos = t0 + trow + 8 * i1;
          if (pos > lim[cc] || pos >= end) x = -INFINITY;
        }
        s[e] = x;
        mx[cc] = fmaxf(mx[cc], x);
      }
      mx[cc] = fmaxf(mx[cc], __shfl_xor_sync(0xffffffffu, mx[cc], 4));
      mx[cc] = fmaxf(mx[cc], __shfl_xor_sync(0xffffffffu, mx[cc], 8));
      mx[cc] = fmaxf(mx[cc], __shfl_xor_sync(0xffffffffu, mx[cc], 16));
      if (lane < 4) sm.red[w][par][wwarp][col_of(cc)] = mx[cc];
    }
    bar_sync(kBarWg + w, 128);
    float alpha[4];
    bool moved = false;
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int col = col_of(cc);
      float tm = fmaxf(fmaxf(sm.red[w][par][0][col], sm.red[w][par][1][col]),
                       fmaxf(sm.red[w][par][2][col], sm.red[w][par][3][col]));
      // The running max moves only by more than 2^8 (attention_fwd_kernel.cuh): most tiles then
      // skip the rescale of Oᵀ. (-inf - -inf is NaN: no move.)
      const float mn = tm - m_run[cc] > 8.f ? tm : m_run[cc];
      alpha[cc] = mn == m_run[cc] ? 1.f : tile::exp2_ftz(m_run[cc] - mn);
      moved |= alpha[cc] != 1.f;
      m_run[cc] = mn;
    }
    // P = 2^(S - m) into Pᵀ (rows x tokens, K-major, swizzled), the rows' partial sums
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const float ms = m_run[cc] == -INFINITY ? 0.f : m_run[cc];
      const int col = col_of(cc);
      float sum = 0.f;
#pragma unroll
      for (int i1 = 0; i1 < 2; ++i1) {
        const int e = 4 * (cc / 2) + 2 * i1 + cc % 2;
        const float pv = tile::exp2_ftz(s[e] - ms);
        sum += pv;
        const int tok = trow + 8 * i1;
        *reinterpret_cast<T*>(
            &sm.p[w][col * 128 + (((tok >> 3) ^ (col & 7)) << 4) + (tok & 7) * 2]) =
            static_cast<T>(pv);
      }
      l_run[cc] = l_run[cc] * alpha[cc] + sum;
    }
    if (moved) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[mb][e] *= alpha[(e / 4) * 2 + (e % 2)];
    }
    cutlass::arch::fence_view_async_shared();
    bar_sync(kBarWg + w, 128);

    // Oᵀ += Vᵀ·Pᵀ over the tile's 64 tokens
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) fence_regs(o[mb]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
      const uint64_t da = chunk_desc(slot[mb]);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_n16<T, 1>(o[mb], da + 128 * ks, dp + 2 * ks, 1);
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) fence_regs(o[mb]);
    if (lane == 0)
#pragma unroll
      for (int kb = 0; kb < kBlocks - 1; ++kb) Barrier::arrive(&sm.empty[slot[kb]]);
  }

  // ---- epilogue: merge the two warpgroups' states, normalize, store ----
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    float l = l_run[cc];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    if (lane < 4) {
      sm.l_fin[w][wwarp][col_of(cc)] = l;
      if (wwarp == 0) sm.m_fin[w][col_of(cc)] = m_run[cc];
    }
  }
  bar_sync(kBarConsumers, kConsumerThreads);  // also: every ring read and write is done
  float f_own[4];
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    const int col = col_of(cc);
    const float m0 = sm.m_fin[0][col], m1 = sm.m_fin[1][col], m = fmaxf(m0, m1);
    const float mw = w == 0 ? m0 : m1;
    f_own[cc] = mw == -INFINITY ? 0.f : tile::exp2_ftz(mw - m);
  }
  float* stage = reinterpret_cast<float*>(&sm.ring[0][0]);  // warpgroup 1's scaled Oᵀ
  if (w == 1) {
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        stage[(mb * 8 + e) * 128 + wtid] = o[mb][e] * f_own[(e / 4) * 2 + (e % 2)];
  }
  bar_sync(kBarConsumers, kConsumerThreads);
  float* out_stage = stage + 64 * 128;  // (rows, kOPitch) f32: normalized O
  const int rows_global = a.batch * a.sq * a.hq;
  if (w == 0) {
    float inv[4];
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int col = col_of(cc);
      const float m0 = sm.m_fin[0][col], m1 = sm.m_fin[1][col], m = fmaxf(m0, m1);
      const float f1 = m1 == -INFINITY ? 0.f : tile::exp2_ftz(m1 - m);
      float l = 0.f;
#pragma unroll
      for (int ww = 0; ww < 4; ++ww)
        l += sm.l_fin[0][ww][col] * f_own[cc] + sm.l_fin[1][ww][col] * f1;
      inv[cc] = bad ? __int_as_float(0x7fffffff) : (l > 0.f ? 1.f / l : 0.f);
      const float lse2 = bad ? __int_as_float(0x7fffffff) : (l > 0.f ? m + log2f(l) : -INFINITY);
      if (wwarp == 0 && lane < 4 && col < a.rows_total) {
        const int srow = col / a.group, h = col - srow * a.group;
        const int64_t row_id = (static_cast<int64_t>(b) * a.sq + srow) * a.hq + h;
        if (a.part_o == nullptr) {
          if (a.lse != nullptr) a.lse[row_id] = lse2 * 0.69314718055994531f;
        } else {
          a.part_lse[static_cast<int64_t>(split) * rows_global + row_id] = lse2;
        }
        sm.lse_fin[col] = lse2;
      }
    }
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int cc = (e / 4) * 2 + (e % 2);
        const float v = o[mb][e] * f_own[cc] + stage[(mb * 8 + e) * 128 + wtid];
        out_stage[col_of(cc) * kOPitch + mb * 64 + trow + 8 * ((e / 2) % 2)] = v * inv[cc];
      }
  }
  bar_sync(kBarConsumers, kConsumerThreads);
  // Rows of 512 values, 8 per thread and step.
  for (int idx = tid; idx < a.rows_total * (kLatent / 8); idx += kConsumerThreads) {
    const int r = idx / (kLatent / 8), c8 = (idx % (kLatent / 8)) * 8;
    const float* src = out_stage + r * kOPitch + c8;
    const float4 x0 = *reinterpret_cast<const float4*>(src),
                 x1 = *reinterpret_cast<const float4*>(src + 4);
    const int srow = r / a.group, h = r - srow * a.group;
    const int64_t row_id = (static_cast<int64_t>(b) * a.sq + srow) * a.hq + h;
    if (a.part_o == nullptr) {
      T* dst = static_cast<T*>(a.out) + b * a.o_sb + srow * a.o_ss + h * a.o_sh + c8;
      *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<T>(x0.x, x0.y), pack2<T>(x0.z, x0.w),
                                                  pack2<T>(x1.x, x1.y), pack2<T>(x1.z, x1.w));
    } else {
      const int64_t prow = static_cast<int64_t>(split) * rows_global + row_id;
      // A split without a visible token (lse -inf) leaves its partial unwritten, as decode_kernel.
      if (!(sm.lse_fin[r] == -INFINITY)) {
        float* dst = a.part_o + prow * kLatent + c8;
        *reinterpret_cast<float4*>(dst) = x0;
        *reinterpret_cast<float4*>(dst + 4) = x1;
      }
    }
  }
  if (a.part_o == nullptr || a.tickets == nullptr) return;
  // The last of the num_splits CTAs of sequence b merges the partials.
  if (!last_split_arrives(
          a.num_splits, tid == 0, &sm.last, [] { bar_sync(kBarConsumers, kConsumerThreads); },
          [&] { return a.tickets + b; }))
    return;
  for (int row = warp; row < a.rows_total; row += kConsumerThreads / 32) {
    const int srow = row / a.group, h = row - srow * a.group;
    combine_row_serial<T, kLatent>(a, (static_cast<int64_t>(b) * a.sq + srow) * a.hq + h, lane);
  }
}

}  // namespace tessel::decode::mla::swap
