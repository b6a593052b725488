// MLA decode (absorbed form) for blocks of 64 query rows on Hopper: TMA + WGMMA, warp-specialized.
//
// At H = 128 the absorbed MLA decode is compute-bound for mma.sync (146 GFLOP against 0.6 GB of
// latent cache at B = 64, 8192 tokens): this kernel moves both products to WGMMA.
//
// One CTA = (sequence b, block of 64 query rows, KV split); 3 warpgroups:
//   producer  one thread TMA-loads 64-token latent tiles (64 x 576, 128B-swizzled, K-major) into
//             a 2-stage ring: 9 boxes of 64 dims per tile (contiguous cache), or 9 per page-sized
//             run of tokens (paged cache, pages of 8..64 tokens or multiples of 64).
//   consumers warpgroup w (0, 1), each on its own (they meet only at the tile holding the end):
//               S = Q · Kᵀ  (64 x 64, K = 576; SS WGMMA, Q stays in shared memory) — both
//               warpgroups compute the whole S: with 32 tokens each the 64x32 WGMMAs ran at a
//               fraction of their rate (1.27 TB/s), and the copy needs no exchange of maxima
//               or of P through shared memory;
//               online softmax in registers; P (bf16/f16) stays in registers as the A operand of
//               O_w += P · V[:, 256w .. 256w+255]  (V = the first 512 dims of the same tile,
//               read MN-major through a second view of the same bytes; RS WGMMA)
//             tile n's PV and tile n+1's QKᵀ are issued together; tile n's stage is freed
//             once its PV is done, so the next-but-one tile loads under tile n+1's work.
// Rows past the sequence end in the last tile are zeroed in shared memory before use (a cache
// may hold NaN there and 0 · NaN would leak into O). Outputs, split partials, lse and the
// in-kernel merge follow decode_kernel (decode_kernel.cuh) exactly.
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>

#include <cute/tensor.hpp>
#include <cutlass/cuda_host_adapter.hpp>

#include "ops/attention_decode/decode_launch.cuh"
#include "tile/sm90/pipeline.cuh"
#include "tile/sm90/tma.cuh"
#include "tile/sm90/warpgroup.cuh"

namespace tessel::decode::mla {

using namespace tessel::tile::sm90;

constexpr int kRow = 576, kLatent = 512;
constexpr int kRows = 64, kTile = 64, kStages = 2, kThreads = 384;
constexpr int kStageElems = kTile * kRow;  // 36864
constexpr int kDimBlocks = kRow / 64;      // 128-byte TMA boxes per row

// Kernel parameters: the cache's TMA descriptor (576, tokens per unit, units): contiguous
// (576, Smax, B) or paged (576, page_size, num_pages), and the decode arguments.
struct alignas(64) WgArgs {
  CUtensorMap cache;
  KernelArgs a;
  int box_rows;  // tokens per TMA box: 64, or the page size when that is smaller
};

template <class T_>
struct WgCfg {
  using T = T_;
  using SmemQ = SmemLayout<T, Major::K, kRows, kRow, 1>;        // (rows, 576)
  using SmemK = SmemLayout<T, Major::K, kTile, kRow, kStages>;  // (tokens, 576, stage)
  // Warpgroup w's V operand: the MN-major view (dims, tokens) of dims 256w.. of the ring
  // (offset w·16384 elements). Same bytes as SmemK (the swizzle acts on 1024-byte aligned
  // offsets; checked element by element when written).
  using SmemVw = decltype(cute::composition(
      cute::GMMA::Layout_MN_SW128_Atom<T>{}.layout_a(),
      cute::GMMA::Layout_MN_SW128_Atom<T>{}.offset(),
      cute::Layout<cute::Shape<cute::Shape<cute::_64, cute::_4>, cute::Shape<cute::_8, cute::_8>,
                               cute::Int<kStages>>,
                   cute::Stride<cute::Stride<cute::_1, cute::Int<4096>>,
                                cute::Stride<cute::_64, cute::_512>, cute::Int<kStageElems>>>{}));
  using MmaQK = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::_64, cute::Int<kRow>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float, cute::Shape<cute::_64, cute::_256, cute::_64>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  using Pipeline = TmaPipeline<kStages>;
  struct Smem {
    alignas(1024) T q[cute::cosize_v<SmemQ>];
    alignas(1024) T kv[cute::cosize_v<SmemK>];
    uint4 p[4][kWarpgroupThreads];    // P of the tile, as warpgroup 0's registers (thread-major)
    float2 scale[kWarpgroupThreads];  // per thread: the two rows' O scale (loop), then 1/l
    typename Pipeline::SharedStorage pipe;
    unsigned last;
  };
  static constexpr uint32_t kTileBytes = kStageElems * sizeof(T);
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

// Named barriers of the two consumer warpgroups (0 is __syncthreads).
__device__ __forceinline__ void consumers_sync(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}

// CuTe's element types for the native ones the decode kernels use.
template <class T>
struct CuteType;
template <>
struct CuteType<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CuteType<__half> {
  using type = cutlass::half_t;
};

template <class T, bool PAGED>
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_kernel(const __grid_constant__ WgArgs args) {
  using namespace cute;
  using Cfg = WgCfg<typename CuteType<T>::type>;
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const KernelArgs& a = args.a;

  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));

  const int tid = threadIdx.x;
  const int rb = blockIdx.x % a.row_blocks, split = blockIdx.x / a.row_blocks, b = blockIdx.z;
  const int len = a.seqlens[b];
  bool bad = len < a.sq || static_cast<int64_t>(len) > a.capacity;
  const int len_ok = bad ? 0 : len;
  const int per_split = (len_ok + a.num_splits - 1) / a.num_splits;
  const int chunk = (per_split + kTile - 1) / kTile * kTile;
  const int begin = split * chunk;
  const int end = min(begin + chunk, len_ok);
  int ntiles = end > begin ? (end - begin + kTile - 1) / kTile : 0;
  // The hashed tile order of decode_kernel (the same for both row blocks of (b, split): they
  // share each tile through L2 while resident together).
  int rot = 0;
  if (ntiles > 1)
    rot = static_cast<int>(((static_cast<uint32_t>(b) * 0x9E3779B1u) ^
                            (static_cast<uint32_t>(split) * 0x85EBCA77u)) >>
                           8) %
          ntiles;
  auto tile_start = [&](int i) {
    int t = i + rot;
    if (t >= ntiles) t -= ntiles;
    return begin + t * kTile;
  };

  if constexpr (PAGED) {  // every page the range touches must be a valid id
    if (end > begin)
      for (int j = begin / a.page_size + tid; j <= (end - 1) / a.page_size; j += kThreads) {
        const int pg = a.block_table[b * a.bt_stride + j];
        if (pg < 0 || pg >= a.num_pages) bad = true;
      }
  }

  // ---- Q rows of the block into shared memory (zero rows past rows_total) ----
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQ{});
  for (int idx = tid; idx < kRows * (kRow / 8); idx += kThreads) {
    const int r = idx / (kRow / 8), c = idx - r * (kRow / 8);
    const int grow = rb * kRows + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (grow < a.rows_total) {
      const int s = grow / a.group, h = grow - s * a.group;
      const T* src = c < kLatent / 8 ? static_cast<const T*>(a.q0) + b * a.q0_sb + s * a.q0_ss +
                                           h * a.q0_sh + c * 8
                                     : static_cast<const T*>(a.q1) + b * a.q1_sb + s * a.q1_ss +
                                           h * a.q1_sh + (c - kLatent / 8) * 8;
      v = __ldg(reinterpret_cast<const uint4*>(src));
    }
    *reinterpret_cast<uint4*>(&sQ(r, c * 8, 0)) = v;
  }
  cutlass::arch::fence_view_async_shared();  // generic stores -> visible to WGMMA

  const int wg = warpgroup_index();
  auto pipe =
      make_tma_pipeline<kStages, 1>(smem.pipe, wg == 0, Cfg::kTileBytes, 2 * kWarpgroupThreads);
  bad = __syncthreads_or(bad);  // also: barrier init and Q visible to every thread
  if (bad) ntiles = 0;

  if (wg == 0) {  // ---- producer ----
    producer_registers();
    if (warp_in_warpgroup() == 0 && elect_one() && ntiles > 0) {
      constexpr uint64_t kHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
      auto st = producer_start<kStages>();
      for (int i = 0; i < ntiles; ++i) {
        const int t0 = tile_start(i);
        pipe.producer_acquire(st);
        uint64_t* bar = reinterpret_cast<uint64_t*>(pipe.producer_get_barrier(st));
        auto* dst = smem.kv + st.index() * kStageElems;
        if constexpr (PAGED) {
          const int rows = args.box_rows;
          for (int q = 0; q < kTile; q += rows) {
            // Boxes wholly past the end load any valid page (the consumers zero those rows).
            const int pos = t0 + q < end ? t0 + q : t0;
            const int j = pos / a.page_size;
            const int pg = a.block_table[b * a.bt_stride + j];
            const int slot = pos - j * a.page_size;
            for (int cb = 0; cb < kDimBlocks; ++cb)
              SM90_TMA_LOAD_3D::copy(&args.cache, bar, kHint, dst + cb * 4096 + q * 64, cb * 64,
                                     slot, pg);
          }
        } else {
          for (int cb = 0; cb < kDimBlocks; ++cb)
            SM90_TMA_LOAD_3D::copy(&args.cache, bar, kHint, dst + cb * 4096, cb * 64, t0, b);
        }
        ++st;
      }
      pipe.producer_tail(st);
    }
    return;
  }

  // ---- consumers ----
  consumer_registers();
  const int w = wg - 1, ctid = tid - kWarpgroupThreads, wtid = ctid % kWarpgroupThreads;
  const int lane = tid % 32, warp = warp_in_warpgroup();
  cute::Tensor sK = make_tensor(make_smem_ptr(smem.kv), typename Cfg::SmemK{});
  cute::Tensor sVw = make_tensor(make_smem_ptr(smem.kv + w * 16384), typename Cfg::SmemVw{});
  typename Cfg::MmaQK mma_qk;
  typename Cfg::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_slice(wtid);
  auto thr_pv = mma_pv.get_slice(wtid);
  cute::Tensor tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ));    // (MMA, 1, 36, 1)
  cute::Tensor tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK));    // (MMA, 1, 36, stage)
  cute::Tensor tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sVw));   // (MMA, 1, 4, stage)
  cute::Tensor tSrS = partition_fragment_C(mma_qk, Shape<_64, _64>{});   // ((2,2,8),1,1)
  cute::Tensor tOrO = partition_fragment_C(mma_pv, Shape<_64, _256>{});  // ((2,2,32),1,1)
  // P as the A operand of the RS WGMMA: the accumulator's (col pair, row half, 8-col group)
  // regrouped as ((col pair, row half, 8-col half of a 16-wide k block), 1, k block).
  cute::Tensor tOrP = make_tensor<typename Cfg::T>(Layout<Shape<Shape<_2, _2, _2>, _1, _4>>{});
  auto S = [&](int i0, int i1, int g) -> float& {
    return tSrS(make_coord(make_coord(i0, i1, g), 0, 0));
  };
  auto O = [&](int i0, int i1, int g) -> float& {
    return tOrO(make_coord(make_coord(i0, i1, g), 0, 0));
  };
  const int row0 = warp * 16 + lane / 4;  // + 8·i1: this thread's rows of the block
  const int col_lane = 2 * (lane % 4);    // + 8·g + i0

  // Causal limit (inclusive) of the thread's rows, and the block's smallest (decides masking).
  int lim[2];
  for (int i1 = 0; i1 < 2; ++i1) {
    const int grow = rb * kRows + row0 + 8 * i1;
    lim[i1] = grow < a.rows_total ? len_ok - a.sq + grow / a.group : -1;
  }
  const int lim_min = len_ok - a.sq + (rb * kRows) / a.group;

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  CUTE_UNROLL
  for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;

  // Rows of a tile past the range end: zeroed once the tile has landed (all 256 consumers).
  auto zero_tail = [&](int stage, int t0) {
    const int valid = end - t0;
    if (valid >= kTile) return;
    for (int idx = wtid; idx < (kTile - valid) * (kRow / 8); idx += kWarpgroupThreads) {
      const int r = valid + idx / (kRow / 8), c = idx % (kRow / 8);
      *reinterpret_cast<uint4*>(&sK(r, c * 8, stage)) = make_uint4(0, 0, 0, 0);
    }
    cutlass::arch::fence_view_async_shared();
    asm volatile("bar.sync 3, 128;" ::: "memory");  // warpgroup 0 only
  };
  auto issue_qk = [&](int stage) {
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
      cute::gemm(mma_qk, tSrQ(_, _, kb, 0), tSrK(_, _, kb, stage), tSrS);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  auto issue_pv = [&](int stage) {
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tOrP); ++kb)
      cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb, stage), tOrO);
    warpgroup_commit_batch();
  };

  // Scale and mask S of the tile at t0 (log2 units), and this half's row maxima.
  auto scale_mask_max = [&](int t0, float(&mx)[2]) {
    const bool need_mask = t0 + kTile > end || t0 + kTile - 1 > lim_min;
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      mx[i1] = -INFINITY;
      CUTE_UNROLL
      for (int g = 0; g < 8; ++g) CUTE_UNROLL
      for (int i0 = 0; i0 < 2; ++i0) {
        float x = S(i0, i1, g) * a.scale_log2;
        if (need_mask) {
          const int pos = t0 + 8 * g + col_lane + i0;
          if (pos > lim[i1] || pos >= end) x = -INFINITY;
        }
        S(i0, i1, g) = x;
        mx[i1] = fmaxf(mx[i1], x);
      }
      mx[i1] = fmaxf(mx[i1], __shfl_xor_sync(0xffffffffu, mx[i1], 1));
      mx[i1] = fmaxf(mx[i1], __shfl_xor_sync(0xffffffffu, mx[i1], 2));
    }
  };
  // Running max, P (in registers: the A operand of the PV WGMMA), running sums; O rescaled
  // (its previous PV has finished).
  auto softmax_to_p = [&](const float(&mx)[2], float(&alpha)[2]) {
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      // The running max moves only by more than 2^8 (see attention_fwd_kernel.cuh): most
      // tiles then skip the rescale of O's 128 registers. (-inf - -inf is NaN: no move.)
      const float mn = mx[i1] - m_run[i1] > 8.f ? mx[i1] : m_run[i1];
      alpha[i1] = mn == m_run[i1] ? 1.f : tile::exp2_ftz(m_run[i1] - mn);
      const float ms = mn == -INFINITY ? 0.f : mn;
      float sum = 0.f;
      CUTE_UNROLL
      for (int g = 0; g < 8; ++g) CUTE_UNROLL
      for (int i0 = 0; i0 < 2; ++i0) {
        const float p = tile::exp2_ftz(S(i0, i1, g) - ms);
        sum += p;
        tOrP(make_coord(make_coord(i0, i1, g % 2), 0, g / 2)) = static_cast<typename Cfg::T>(p);
      }
      l_run[i1] = l_run[i1] * alpha[i1] + sum;
      m_run[i1] = mn;
    }
  };
  auto rescale_o = [&](const float(&alpha)[2]) {
    if (alpha[0] != 1.f || alpha[1] != 1.f) {  // most tiles once the maxima settle
      CUTE_UNROLL
      for (int g = 0; g < 32; ++g) CUTE_UNROLL
      for (int i1 = 0; i1 < 2; ++i1) {
        O(0, i1, g) *= alpha[i1];
        O(1, i1, g) *= alpha[i1];
      }
    }
  };
  uint4* p_regs = reinterpret_cast<uint4*>(tOrP.data());  // 4 k blocks x 8 values

  // Warpgroup 0 computes S = Q·Kᵀ (64 x 64, K = 576; one SS WGMMA chain per tile) and the
  // online softmax, and hands P and the rows' O scales to warpgroup 1 through shared memory
  // (named barriers: kPFull 0 -> 1, kPEmpty 1 -> 0). Each warpgroup accumulates its 256
  // columns of O = P·V with P in registers (RS WGMMA). Warpgroup 0 issues tile i's PV with
  // tile i+1's QKᵀ; a stage is released by both once their PV of it has finished.
  constexpr int kPFull = 1, kPEmpty = 2;
  mma_pv.accumulate_ = GMMA::ScaleOut::One;
  if (w == 0) {
    if (ntiles > 0) {
      PipeState<kStages> st;
      float mx[2], alpha[2] = {1.f, 1.f};
      pipe.consumer_wait(st);
      zero_tail(st.index(), tile_start(0));
      issue_qk(st.index());
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      auto hand_over = [&]() {
        asm volatile("bar.sync %0, 256;" ::"n"(kPEmpty) : "memory");
        CUTE_UNROLL
        for (int kb = 0; kb < 4; ++kb) smem.p[kb][wtid] = p_regs[kb];
        smem.scale[wtid] = make_float2(alpha[0], alpha[1]);
        asm volatile("bar.arrive %0, 256;" ::"n"(kPFull) : "memory");
      };
      // No branch between a WGMMA's issue and its wait (ptxas would serialize them).
      for (int i = 0; i + 1 < ntiles; ++i) {
        scale_mask_max(tile_start(i), mx);
        softmax_to_p(mx, alpha);
        hand_over();
        rescale_o(alpha);
        PipeState<kStages> st_next = st;
        ++st_next;
        pipe.consumer_wait(st_next);
        zero_tail(st_next.index(), tile_start(i + 1));
        issue_pv(st.index());
        issue_qk(st_next.index());
        warpgroup_wait<1>();
        warpgroup_fence_operand(tOrO);
        pipe.consumer_release(st);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        st = st_next;
      }
      scale_mask_max(tile_start(ntiles - 1), mx);
      softmax_to_p(mx, alpha);
      hand_over();
      rescale_o(alpha);
      issue_pv(st.index());
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe.consumer_release(st);
    }
  } else {
    asm volatile("bar.arrive %0, 256;" ::"n"(kPEmpty) : "memory");  // the P buffer starts free
    PipeState<kStages> st;
    for (int i = 0; i < ntiles; ++i) {
      pipe.consumer_wait(st);  // the stage's bytes, for this warpgroup's WGMMA
      asm volatile("bar.sync %0, 256;" ::"n"(kPFull) : "memory");
      CUTE_UNROLL
      for (int kb = 0; kb < 4; ++kb) p_regs[kb] = smem.p[kb][wtid];
      const float2 sc = smem.scale[wtid];
      asm volatile("bar.arrive %0, 256;" ::"n"(kPEmpty) : "memory");
      const float alpha[2] = {sc.x, sc.y};
      rescale_o(alpha);
      issue_pv(st.index());
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe.consumer_release(st);
      ++st;
    }
  }

  // ---- epilogue: row sums of the two halves, normalize, store (or write the split partial) ----
  // Row sums (and maxima, for the lse) live in warpgroup 0: handed over like a tile's P.
  if (w == 0) {
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      float l = l_run[i1];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      l_run[i1] = l;
    }
    asm volatile("bar.sync %0, 256;" ::"n"(kPEmpty) : "memory");
    smem.scale[wtid] = make_float2(l_run[0], l_run[1]);
    smem.p[0][wtid] = make_uint4(__float_as_uint(m_run[0]), __float_as_uint(m_run[1]), 0, 0);
    asm volatile("bar.arrive %0, 256;" ::"n"(kPFull) : "memory");
  } else {
    asm volatile("bar.sync %0, 256;" ::"n"(kPFull) : "memory");
    const float2 l = smem.scale[wtid];
    const uint4 m = smem.p[0][wtid];
    l_run[0] = l.x;
    l_run[1] = l.y;
    m_run[0] = __uint_as_float(m.x);
    m_run[1] = __uint_as_float(m.y);
  }
  const int rows_global = a.batch * a.sq * a.hq;
  CUTE_UNROLL
  for (int i1 = 0; i1 < 2; ++i1) {
    const int r = row0 + 8 * i1, grow = rb * kRows + r;
    if (grow >= a.rows_total) continue;
    const float l = l_run[i1];
    const int s = grow / a.group, h = grow - s * a.group;
    const int64_t row_id = (static_cast<int64_t>(b) * a.sq + s) * a.hq + h;
    const float inv = bad ? __int_as_float(0x7fffffff) : (l > 0.f ? 1.f / l : 0.f);
    const float lse2 =
        bad ? __int_as_float(0x7fffffff) : (l > 0.f ? m_run[i1] + log2f(l) : -INFINITY);
    if (a.part_o == nullptr) {
      T* dst = static_cast<T*>(a.out) + b * a.o_sb + s * a.o_ss + h * a.o_sh + 256 * w;
      CUTE_UNROLL
      for (int g = 0; g < 32; ++g)
        *reinterpret_cast<uint32_t*>(dst + 8 * g + col_lane) =
            pack2<T>(O(0, i1, g) * inv, O(1, i1, g) * inv);
      if (a.lse != nullptr && w == 0 && lane % 4 == 0) a.lse[row_id] = lse2 * 0.69314718055994531f;
    } else {
      const int64_t prow = static_cast<int64_t>(split) * rows_global + row_id;
      float* dst = a.part_o + prow * kLatent + 256 * w;
      if (!(lse2 == -INFINITY)) {
        CUTE_UNROLL
        for (int g = 0; g < 32; ++g)
          *reinterpret_cast<float2*>(dst + 8 * g + col_lane) =
              make_float2(O(0, i1, g) * inv, O(1, i1, g) * inv);
      }
      if (w == 0 && lane % 4 == 0) a.part_lse[prow] = lse2;
    }
  }
  if (a.part_o == nullptr || a.tickets == nullptr) return;
  // The last of the num_splits CTAs of (b, row block) merges the partials (as decode_kernel).
  __threadfence();
  consumers_sync(4);
  if (ctid == 0) {
    unsigned* t = a.tickets + static_cast<int64_t>(b) * a.row_blocks + rb;
    const bool last = atomicAdd(t, 1u) == static_cast<unsigned>(a.num_splits - 1);
    if (last) *t = 0u;  // ready for the next call (and the next replay of a graph)
    smem.last = last;
  }
  consumers_sync(4);
  if (!smem.last) return;
  __threadfence();
  for (int row = ctid / 32; row < kRows; row += 8) {
    const int grow = rb * kRows + row;
    if (grow >= a.rows_total) break;
    const int s = grow / a.group, h = grow - s * a.group;
    combine_row<T, kLatent>(a, (static_cast<int64_t>(b) * a.sq + s) * a.hq + h, lane);
  }
}

// The cache geometries whose 64-token tiles are whole TMA boxes: contiguous caches, and pages of
// 8..64 tokens dividing 64 or of a multiple of 64 tokens (others take decode_kernel).
inline bool wgmma_supported(bool paged, int64_t page_size) {
  return !paged || (page_size >= 8 && 64 % page_size == 0) || page_size % 64 == 0;
}

// Host: descriptor, splits (launch_decode's heuristic with one CTA per SM), launch, and the
// combine launch when the splits are not merged in the kernel.
template <class T, bool PAGED>
void launch(KernelArgs a, const void* cache, int64_t tok_stride, int64_t unit_stride,
            const CacheGeometry& g, int64_t requested_splits, cudaStream_t stream, const char* op) {
  using Cfg = WgCfg<typename CuteType<T>::type>;
  auto kernel = mla_wgmma_kernel<T, PAGED>;
  static const bool configured = [&] {
    TESSEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Cfg::kSmemBytes)));
    return true;
  }();
  (void)configured;
  WgArgs args{};
  const int64_t rows = PAGED ? g.page_size : g.capacity;
  const int64_t units = PAGED ? g.num_pages : a.batch;
  const int64_t s_tok = rows > 1 ? tok_stride : kRow,
                s_unit = units > 1 ? unit_stride : rows * s_tok;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kRow), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(units)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(s_tok * sizeof(T)),
                                 static_cast<cuuint64_t>(s_unit * sizeof(T))};
  args.box_rows = PAGED ? static_cast<int>(std::min<int64_t>(g.page_size, kTile)) : kTile;
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(args.box_rows), 1};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult cr = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &args.cache,
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      3, const_cast<void*>(cache), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (cr != CUDA_SUCCESS)
    throw Error(TESSEL_ERROR_CUDA, std::string("tessel::") + op +
                                       ": cuTensorMapEncodeTiled failed (CUresult " +
                                       std::to_string(static_cast<int>(cr)) + ")");

  a.row_blocks = (a.rows_total + kRows - 1) / kRows;
  const int64_t base = static_cast<int64_t>(a.batch) * a.row_blocks;
  const int64_t plan = a.plan_len > 0 ? std::min(a.plan_len, a.capacity) : a.capacity;
  const int sms = detail::current_sm_count();
  const int splits = requested_splits > 0 ? static_cast<int>(requested_splits)
                                          : choose_splits(base, plan, kTile, sms);
  a.num_splits = splits;
  const int64_t rows_global = static_cast<int64_t>(a.batch) * a.sq * a.hq;
  a.part_o = nullptr;
  a.part_lse = nullptr;
  a.tickets = nullptr;
  if (splits > 1) {
    float* p = partials_scratch(
        stream, sizeof(float) * static_cast<size_t>(splits * rows_global * (kLatent + 1)));
    a.part_o = p;
    a.part_lse = p + splits * rows_global * kLatent;
    // In-kernel merge under launch_decode's rule (one wave, splits of >= 8 tiles).
    static const bool merge_allowed = [] {
      const char* e = std::getenv("TESSEL_DECODE_MERGE");
      return !(e && e[0] == '0');
    }();
    if (merge_allowed && static_cast<int64_t>(splits) * base <= sms && plan / splits >= 8 * kTile)
      a.tickets = static_cast<unsigned*>(
          detail::stream_workspace(stream, static_cast<size_t>(base) * sizeof(unsigned)));
  }
  args.a = a;
  const dim3 grid(static_cast<unsigned>(splits * a.row_blocks), 1, static_cast<unsigned>(a.batch));
  TESSEL_CUDA_CHECK(
      detail::launch_dependent(kernel, grid, dim3(kThreads), Cfg::kSmemBytes, stream, args));
  detail::check_launch(op);
  if (splits > 1 && a.tickets == nullptr) {
    TESSEL_CUDA_CHECK(detail::launch_dependent(combine_kernel<T, kLatent>,
                                               dim3(static_cast<unsigned>((rows_global + 7) / 8)),
                                               dim3(256), 0, stream, a));
    detail::check_launch(op);
  }
}

}  // namespace tessel::decode::mla
