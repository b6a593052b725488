// MLA decode (absorbed form) for blocks of 64 query rows on Hopper: TMA + WGMMA, "seesaw".
//
// At H = 128 the absorbed MLA decode is compute-bound (146 GFLOP against 0.6 GB of latent cache
// at B = 64, 8192 tokens: 242 flop per byte, about the H100's ridge), so the tensor cores must
// never wait on a softmax. One CTA = (sequence b, block of 64 query rows, KV split), 2
// warpgroups and no producer warpgroup (each thread may hold 255 registers):
//   O (64 x 512) is split by columns: warpgroup 0 owns O_L (latent dims 0..255), warpgroup 1
//   O_R (256..511). Tiles of 64 tokens go in pairs: tile a (even) always sits in stage 0 and
//   its S = Q·Kᵀ (64 x 64, K = 576) is warpgroup 0's; tile b (odd) sits in stage 1 and its S is
//   warpgroup 1's. Per pair:
//     wg0: softmax(S_a) against the running max m -> m_a; O_L += P_a·V_a,L (P in registers)
//     wg1: softmax(S_b) against m_a -> m_b; O_R += (P_a·2^(m_a-m_b))·V_a,R, then P_b·V_b,R
//     wg0: O_L += P_b·V_b,L (P_b from shared memory), then S of the next even tile
//     wg1: S of the next odd tile
//   so one warpgroup's softmax runs while the other's WGMMAs keep the tensor cores busy. The
//   maxima, the O scales and the two P tiles cross through shared memory (named barriers).
// Loads: a stage is two TMA transactions with their own mbarriers, L = dims 0..255 (V_L) and
// R = dims 256..575 (V_R and the rope dims). Each half is refilled by the warpgroup that read it
// last (the owner of V_L / V_R), right after its PV of that tile: the next tile's first half
// lands while this pair still runs; whole tiles two ahead are prefetched into L2 where their
// rows are one run of bytes (the loads' latency was the limit). Q's latent dims stay in shared
// memory (SS WGMMA); its 64 rope dims live in registers (RS WGMMA), which frees the 8 KB that the
// second P tile takes. Rows past the sequence end in the last tile are zeroed in shared memory
// before their PV (a cache may hold NaN there and 0 · NaN would leak into O). Outputs, split
// partials, lse and the in-kernel merge follow decode_kernel (decode_kernel.cuh) exactly.
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

// Lambdas holding WGMMAs must be inlined: a called one gets compiler-injected waits.
#define TESSEL_LAMBDA_INLINE __attribute__((always_inline))

using namespace tessel::tile::sm90;

constexpr int kRow = 576, kLatent = 512;
constexpr int kRows = 64, kTile = 64, kStages = 2, kThreads = 256;
constexpr int kStageElems = kTile * kRow;  // 36864
constexpr int kDimBlocks = kRow / 64;      // 128-byte TMA boxes per row
constexpr int kBoxElems = 64 * 64;         // one 64-dim box column of a 64-token tile
constexpr int kSplitBox = 4;               // boxes [0, 4) are the L half, [4, 9) the R half

// Kernel parameters: the cache's TMA descriptor (576, tokens per unit, units): contiguous
// (576, Smax, B) or paged (576, page_size, num_pages), and the decode arguments.
struct alignas(64) WgArgs {
  CUtensorMap cache;
  KernelArgs a;
  int box_rows;   // tokens per TMA box: 64, or the page size when that is smaller
  uint64_t hint;  // TMA L2 cache hint of the cache loads
  // L2 prefetch of whole tiles `prefetch` tiles ahead (0: off), where a tile's 64 rows are
  // contiguous bytes: the cache's base, bytes per token and per unit (sequence or page).
  int prefetch;
  const char* base;
  int64_t tok_bytes, unit_bytes;
};

template <class T_>
struct WgCfg {
  using T = T_;
  using SmemQ = SmemLayout<T, Major::K, kRows, kLatent, 1>;     // (rows, 512): latent dims
  using SmemP = SmemLayout<T, Major::K, kRows, kTile, 1>;       // (rows, tokens): a P tile
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
                                       cute::Shape<cute::_64, cute::_64, cute::Int<kLatent>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  using MmaQKr = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float, cute::Shape<cute::_64, cute::_64, cute::_64>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float, cute::Shape<cute::_64, cute::_256, cute::_64>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  using MmaPVs = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float, cute::Shape<cute::_64, cute::_256, cute::_64>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  struct Smem {
    alignas(1024) T q[cute::cosize_v<SmemQ>];   // 64 KB
    alignas(1024) T p1[cute::cosize_v<SmemP>];  // P_b: warpgroup 1 -> 0 (8 KB)
    alignas(1024) T kv[cute::cosize_v<SmemK>];  // 2 x 72 KB
    alignas(1024) T p0[cute::cosize_v<SmemP>];  // P_a scaled to m_b: warpgroup 0 -> 1 (8 KB)
    float m_a[kRows], scale0[kRows];            // warpgroup 0 -> 1, per pair
    float m_b[kRows], scale1[kRows];            // warpgroup 1 -> 0, per pair
    float l_part[2][kRows];                     // the two halves' row sums, at the end
    uint64_t full[kStages][2];                  // [stage][half] TMA transactions
    unsigned last;
  };
  static constexpr uint32_t kLBytes = kSplitBox * kBoxElems * sizeof(T);
  static constexpr uint32_t kRBytes = (kDimBlocks - kSplitBox) * kBoxElems * sizeof(T);
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

// Named barriers (0 is __syncthreads). Pair protocol, each joining the 2 warpgroups (256):
constexpr int kBarScale0 = 1;  // wg0 -> wg1: m_a, scale0 written
constexpr int kBarScale1 = 2;  // wg1 -> wg0: m_b, scale1 written
constexpr int kBarP0 = 3;      // wg0 -> wg1: P_a (scaled) in shared memory
constexpr int kBarP1 = 4;      // wg1 -> wg0: P_b in shared memory (and wg1's PVs issued)
constexpr int kBarAll = 5;     // both, epilogue
constexpr int kBarWg0 = 6;     // warpgroup-local (128): tail zeroing
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// A descriptor fragment whose base the compiler cannot see through: each WGMMA's descriptor is
// then one add from it at the issue rather than one of ~100 loop-invariant values the compiler
// may keep live. (Against the session-19 spills it changed nothing measurable; kept as the form
// with the fewest live registers by construction.)
template <class Fragment>
__device__ __forceinline__ auto fresh(const Fragment& f) {
  auto it = f.data();
  asm volatile("" : "+r"(it.desc_.reg32_[0]), "+r"(it.desc_.reg32_[1]));
  return cute::make_tensor(it, f.layout());
}

// A 16-bit bf16 / f16 value's bits as f32.
template <class T>
__device__ __forceinline__ float half_to_float(uint32_t bits) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __uint_as_float(bits << 16);
  else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
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
  using E = typename Cfg::T;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const KernelArgs& a = args.a;

  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));

  const int tid = threadIdx.x;
  const int rb = blockIdx.x % a.row_blocks, split = blockIdx.x / a.row_blocks, b = blockIdx.z;
  // The hashed tile order of decode_kernel (the same for both row blocks of (b, split): they
  // share each tile through L2 while resident together).
  const SplitRange<kTile> range = split_range<kTile>(a, b, split);
  bool bad = range.bad;
  const int len_ok = range.len_ok, end = range.end;
  int ntiles = range.ntiles;
  auto tile_start = [&](int i) TESSEL_LAMBDA_INLINE { return range.start(i); };

  if constexpr (PAGED)  // every page the range touches must be a valid id
    bad = bad || range_has_bad_page(a, b, range, tid, kThreads);

  const int w = warpgroup_index(), wtid = tid % kWarpgroupThreads;
  const int lane = tid % 32, warp = warp_in_warpgroup();
  const int row0 = warp * 16 + lane / 4;  // + 8·i1: this thread's rows of the block
  const int col_lane = 2 * (lane % 4);    // + 8·g + i0

  // ---- Q: latent dims into shared memory, rope dims into registers (zero rows past the end) ----
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQ{});
  for (int idx = tid; idx < kRows * (kLatent / 8); idx += kThreads) {
    const int r = idx / (kLatent / 8), c = idx - r * (kLatent / 8);
    const int grow = rb * kRows + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (grow < a.rows_total) {
      const int s = grow / a.group, h = grow - s * a.group;
      v = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.q0) + b * a.q0_sb +
                                               s * a.q0_ss + h * a.q0_sh + c * 8));
    }
    *reinterpret_cast<uint4*>(&sQ(r, c * 8, 0)) = v;
  }
  // The rope dims as the A operand of an RS WGMMA: ((col pair, row half, 8-col half), 1, k block).
  cute::Tensor rQ = make_tensor<E>(Layout<Shape<Shape<_2, _2, _2>, _1, _4>>{});
  {
    uint32_t* rq = reinterpret_cast<uint32_t*>(rQ.data());
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      const int grow = rb * kRows + row0 + 8 * i1;
      const bool valid = grow < a.rows_total;
      const int s = valid ? grow / a.group : 0, h = valid ? grow - s * a.group : 0;
      const T* src = static_cast<const T*>(a.q1) + b * a.q1_sb + s * a.q1_ss + h * a.q1_sh;
      CUTE_UNROLL
      for (int kb = 0; kb < 4; ++kb) CUTE_UNROLL
      for (int i2 = 0; i2 < 2; ++i2)
        rq[i1 + 2 * i2 + 4 * kb] =
            valid ? __ldg(reinterpret_cast<const uint32_t*>(src + 16 * kb + 8 * i2 + col_lane))
                  : 0u;
    }
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s)
      for (int hf = 0; hf < 2; ++hf) Barrier::init(&smem.full[s][hf], 1);
    cutlass::arch::fence_barrier_init();
  }
  cutlass::arch::fence_view_async_shared();  // generic stores -> visible to WGMMA
  bad = __syncthreads_or(bad);               // also: barrier init and Q visible to every thread
  if (bad) ntiles = 0;

  // ---- loads: one half of a tile into a stage, by one warp (lane 0 issues) ----
  const uint64_t kHint = args.hint;
  // Box `lane` of the tile at t0 (lanes < 64 / box_rows): its page and slot. Called early (the
  // block-table load then has a pair's time to land) by every lane of the issuing warp.
  auto box_src = [&](int t0, int& pg, int& slot) TESSEL_LAMBDA_INLINE {
    pg = 0;
    slot = 0;
    if constexpr (PAGED) {
      const int q = lane * args.box_rows;
      if (q < kTile) {
        // Boxes wholly past the end load any valid page (their rows are zeroed before use).
        const int pos = t0 + q < end ? t0 + q : t0;
        const int j = pos / a.page_size;
        pg = a.block_table[b * a.bt_stride + j];
        slot = pos - j * a.page_size;
      }
    }
  };
  auto load_half = [&](int stage, int half, int t0, int pg, int slot) TESSEL_LAMBDA_INLINE {
    uint64_t* bar = &smem.full[stage][half];
    const int cb0 = half ? kSplitBox : 0, cb1 = half ? kDimBlocks : kSplitBox;
    if (lane == 0) Barrier::arrive_and_expect_tx(bar, half ? Cfg::kRBytes : Cfg::kLBytes);
    E* dst = smem.kv + stage * kStageElems;
    if constexpr (PAGED) {
      const int rows = args.box_rows;
      for (int q = 0, i = 0; q < kTile; q += rows, ++i) {
        const int p = __shfl_sync(0xffffffffu, pg, i), s = __shfl_sync(0xffffffffu, slot, i);
        if (lane == 0)
          for (int cb = cb0; cb < cb1; ++cb)
            SM90_TMA_LOAD_3D::copy(&args.cache, bar, kHint, dst + cb * kBoxElems + q * 64, cb * 64,
                                   s, p);
      }
    } else {
      if (lane == 0)
        for (int cb = cb0; cb < cb1; ++cb)
          SM90_TMA_LOAD_3D::copy(&args.cache, bar, kHint, dst + cb * kBoxElems, cb * 64, t0, b);
    }
  };
  if (tid < 32) {  // the first pair's tiles
    int pg, slot;
    for (int i = 0; i < min(ntiles, kStages); ++i) {
      box_src(tile_start(i), pg, slot);
      load_half(i, 0, tile_start(i), pg, slot);
      load_half(i, 1, tile_start(i), pg, slot);
    }
  }

  // ---- MMA operands ----
  cute::Tensor sK = make_tensor(make_smem_ptr(smem.kv), typename Cfg::SmemK{});
  cute::Tensor sVw = make_tensor(make_smem_ptr(smem.kv + w * 16384), typename Cfg::SmemVw{});
  // The P tile this warpgroup reads from shared memory: the other warpgroup's.
  cute::Tensor sPin = make_tensor(make_smem_ptr(w == 0 ? smem.p1 : smem.p0), typename Cfg::SmemP{});
  cute::Tensor sPout =
      make_tensor(make_smem_ptr(w == 0 ? smem.p0 : smem.p1), typename Cfg::SmemP{});
  typename Cfg::MmaQK mma_qk;
  typename Cfg::MmaQKr mma_qkr;
  typename Cfg::MmaPV mma_pv;
  typename Cfg::MmaPVs mma_pvs;
  auto thr_qk = mma_qk.get_slice(wtid);
  auto thr_qkr = mma_qkr.get_slice(wtid);
  auto thr_pv = mma_pv.get_slice(wtid);
  auto thr_pvs = mma_pvs.get_slice(wtid);
  cute::Tensor tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ));      // (MMA, 1, 32, 1)
  cute::Tensor tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK));      // (MMA, 1, 36, stage)
  cute::Tensor tSrKr = thr_qkr.make_fragment_B(thr_qkr.partition_B(sK));   // (MMA, 1, 36, stage)
  cute::Tensor tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sVw));     // (MMA, 1, 4, stage)
  cute::Tensor tOsV = thr_pvs.make_fragment_B(thr_pvs.partition_B(sVw));   // (MMA, 1, 4, stage)
  cute::Tensor tOsP = thr_pvs.make_fragment_A(thr_pvs.partition_A(sPin));  // (MMA, 1, 4, 1)
  cute::Tensor tSrS = partition_fragment_C(mma_qk, Shape<_64, _64>{});     // ((2,2,8),1,1)
  cute::Tensor tOrO = partition_fragment_C(mma_pv, Shape<_64, _256>{});    // ((2,2,32),1,1)
  // P as the A operand of the RS WGMMA: the accumulator's (col pair, row half, 8-col group)
  // regrouped as ((col pair, row half, 8-col half of a 16-wide k block), 1, k block).
  cute::Tensor tOrP = make_tensor<E>(Layout<Shape<Shape<_2, _2, _2>, _1, _4>>{});
  auto S = [&](int i0, int i1, int g) TESSEL_LAMBDA_INLINE -> float& {
    return tSrS(make_coord(make_coord(i0, i1, g), 0, 0));
  };
  auto O = [&](int i0, int i1, int g) TESSEL_LAMBDA_INLINE -> float& {
    return tOrO(make_coord(make_coord(i0, i1, g), 0, 0));
  };

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
  mma_qkr.accumulate_ = GMMA::ScaleOut::One;
  mma_pv.accumulate_ = GMMA::ScaleOut::One;
  mma_pvs.accumulate_ = GMMA::ScaleOut::One;

  // S = Q·Kᵀ of the tile in `stage`, in two commit groups: dims 0..255 once the L half has
  // landed, then 256..575 (the rope dims with Q from registers) once the R half has.
  auto qk_l = [&](int stage, int ph) TESSEL_LAMBDA_INLINE {
    Barrier::wait(&smem.full[stage][0], ph);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    auto fQ = fresh(tSrQ);
    auto fK = fresh(tSrK);
    CUTE_UNROLL
    for (int kb = 0; kb < 16; ++kb) {
      cute::gemm(mma_qk, fQ(_, _, kb, 0), fK(_, _, kb, stage), tSrS);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  auto qk_r = [&](int stage, int ph) TESSEL_LAMBDA_INLINE {
    Barrier::wait(&smem.full[stage][1], ph);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    auto fQ = fresh(tSrQ);
    auto fK = fresh(tSrK);
    auto fKr = fresh(tSrKr);
    CUTE_UNROLL
    for (int kb = 16; kb < 32; ++kb) cute::gemm(mma_qk, fQ(_, _, kb, 0), fK(_, _, kb, stage), tSrS);
    CUTE_UNROLL
    for (int kb = 0; kb < 4; ++kb)
      cute::gemm(mma_qkr, rQ(_, _, kb), fKr(_, _, 32 + kb, stage), tSrS);
    warpgroup_commit_batch();
  };
  auto qk_done = [&] TESSEL_LAMBDA_INLINE {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
  };
  // O_half += P·V_half of the tile in `stage`: P from registers, or the other warpgroup's P.
  auto pv_regs = [&](int stage) TESSEL_LAMBDA_INLINE {
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    auto fV = fresh(tOrV);
    CUTE_UNROLL
    for (int kb = 0; kb < 4; ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), fV(_, _, kb, stage), tOrO);
    warpgroup_commit_batch();
  };
  auto pv_smem = [&](int stage) TESSEL_LAMBDA_INLINE {
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    auto fP = fresh(tOsP);
    auto fV = fresh(tOsV);
    CUTE_UNROLL
    for (int kb = 0; kb < 4; ++kb) cute::gemm(mma_pvs, fP(_, _, kb, 0), fV(_, _, kb, stage), tOrO);
    warpgroup_commit_batch();
  };

  // Scale and mask S of the tile at t0 (log2 units), and the rows' maxima over the tile.
  auto scale_mask_max = [&](int t0, float(&mx)[2]) TESSEL_LAMBDA_INLINE {
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
  // The running max moves only by more than 2^8 (see attention_fwd_kernel.cuh): most tiles then
  // skip the rescale of O. (-inf - -inf is NaN: no move.)
  auto new_max = [](float mx, float m) TESSEL_LAMBDA_INLINE { return mx - m > 8.f ? mx : m; };
  auto ratio = [](float m_old, float m_new) TESSEL_LAMBDA_INLINE {
    return m_new == m_old ? 1.f : tile::exp2_ftz(m_old - m_new);
  };
  // S <- P = 2^(S - m) in f32, its bf16/f16 copy in tOrP, the rows' sums.
  auto exp_rows = [&](const float(&m)[2], float(&sum)[2]) TESSEL_LAMBDA_INLINE {
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      const float ms = m[i1] == -INFINITY ? 0.f : m[i1];
      sum[i1] = 0.f;
      CUTE_UNROLL
      for (int g = 0; g < 8; ++g) CUTE_UNROLL
      for (int i0 = 0; i0 < 2; ++i0) {
        const float p = tile::exp2_ftz(S(i0, i1, g) - ms);
        S(i0, i1, g) = p;
        sum[i1] += p;
        tOrP(make_coord(make_coord(i0, i1, g % 2), 0, g / 2)) = static_cast<E>(p);
      }
    }
  };
  auto scale_o = [&](const float(&f)[2]) TESSEL_LAMBDA_INLINE {
    if (f[0] != 1.f || f[1] != 1.f) {  // most tiles once the maxima settle
      CUTE_UNROLL
      for (int g = 0; g < 32; ++g) CUTE_UNROLL
      for (int i1 = 0; i1 < 2; ++i1) {
        O(0, i1, g) *= f[i1];
        O(1, i1, g) *= f[i1];
      }
    }
  };
  // P·f (rows) from its bf16/f16 copy into this warpgroup's outgoing P tile, visible to the
  // other's WGMMA (f is 1 but when a row's max moved: then P is rounded twice). The f32 S is
  // not kept for this: it would hold 32 more registers across the PV.
  auto store_p = [&](const float(&f)[2]) TESSEL_LAMBDA_INLINE {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(tOrP.data());
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) CUTE_UNROLL
    for (int g = 0; g < 8; ++g) {
      // tOrP ((i0, i1, g % 2), 0, g / 2): the 32-bit word i1 + 2 (g % 2) + 4 (g / 2) = i1 + 2 g
      uint32_t v = words[i1 + 2 * g];
      if (f[i1] != 1.f)
        v = pack2<T>(half_to_float<T>(v & 0xffffu) * f[i1], half_to_float<T>(v >> 16) * f[i1]);
      *reinterpret_cast<uint32_t*>(&sPout(row0 + 8 * i1, 8 * g + col_lane, 0)) = v;
    }
    cutlass::arch::fence_view_async_shared();
  };
  // Rows of the tile at t0 past the range end, in this warpgroup's V half (boxes 4w .. 4w+3)
  // of `stage`, zeroed once that half has landed (phase ph) and before this warpgroup's PV.
  auto zero_tail = [&](int stage, int t0, int ph) TESSEL_LAMBDA_INLINE {
    const int valid = end - t0;
    if (valid >= kTile) return;
    Barrier::wait(&smem.full[stage][w], ph);
    for (int idx = wtid; idx < (kTile - valid) * 32; idx += kWarpgroupThreads) {
      const int r = valid + idx / 32, c = w * 32 + idx % 32;  // 16-byte chunk c of the row
      *reinterpret_cast<uint4*>(&sK(r, c * 8, stage)) = make_uint4(0, 0, 0, 0);
    }
    cutlass::arch::fence_view_async_shared();
    bar_sync(kBarWg0 + w, kWarpgroupThreads);
  };
  auto row_store = [&](float* dst, const float(&v)[2]) TESSEL_LAMBDA_INLINE {
    if (lane % 4 == 0) {
      dst[row0] = v[0];
      dst[row0 + 8] = v[1];
    }
  };
  auto row_load = [&](const float* src, float(&v)[2]) TESSEL_LAMBDA_INLINE {
    v[0] = src[row0];
    v[1] = src[row0 + 8];
  };

  // Warpgroup 0's half of pair j (tiles a = 2j, b = 2j + 1; S_a computed on entry). The
  // template flags: tile b exists, the next pair's a / b exist. No branch between a WGMMA's
  // issue and its wait other than the barrier waits (ptxas would serialize the WGMMAs).
  auto wg0_pair = [&](auto has_b, auto next_a, auto next_b, int j) TESSEL_LAMBDA_INLINE {
    constexpr bool HasB = decltype(has_b)::value, NextA = decltype(next_a)::value,
                   NextB = decltype(next_b)::value;
    const int ph = j & 1, phn = ph ^ 1;
    const int ta = tile_start(2 * j);
    int pga = 0, sla = 0, pgb = 0, slb = 0;
    if (NextA && warp == 0) box_src(tile_start(2 * j + 2), pga, sla);
    if (NextB && warp == 0) box_src(tile_start(2 * j + 3), pgb, slb);
    // Whole-tile L2 prefetches of tiles 2j + args.prefetch and the one after (their addresses
    // loaded now, issued after the softmax).
    const char* pf[2] = {nullptr, nullptr};
    int pf_bytes[2] = {0, 0};
    if (args.prefetch > 0 && warp == 0 && lane == 0) {
      for (int u = 0; u < 2; ++u) {
        const int t = 2 * j + args.prefetch + u;
        if (t >= ntiles) break;
        const int t0 = tile_start(t);
        const int rows = min(kTile, end - t0);
        if constexpr (PAGED) {
          const int jp = t0 / a.page_size;
          pf[u] = args.base + a.block_table[b * a.bt_stride + jp] * args.unit_bytes +
                  (t0 - jp * a.page_size) * args.tok_bytes;
        } else {
          pf[u] = args.base + b * args.unit_bytes + t0 * args.tok_bytes;
        }
        pf_bytes[u] = rows * static_cast<int>(args.tok_bytes);
      }
    }
    float mx[2], mn[2], f0[2], f1[2], sum[2];
    scale_mask_max(ta, mx);
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      mn[i1] = new_max(mx[i1], m_run[i1]);
      f0[i1] = ratio(m_run[i1], mn[i1]);
    }
    exp_rows(mn, sum);
    row_store(smem.m_a, mn);
    row_store(smem.scale0, f0);
    bar_arrive(kBarScale0, 2 * kWarpgroupThreads);
    for (int u = 0; u < 2; ++u)
      if (pf_bytes[u] > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf[u]), "r"(pf_bytes[u])
                     : "memory");
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) l_run[i1] = l_run[i1] * f0[i1] + sum[i1];
    scale_o(f0);
    zero_tail(0, ta, ph);
    pv_regs(0);
    // P_a relative to m_b for warpgroup 1's O_R, while PV_L(a) runs (it only reads tOrP).
    bar_sync(kBarScale1, 2 * kWarpgroupThreads);
    row_load(smem.scale1, f1);
    row_load(smem.m_b, m_run);
    store_p(f1);
    bar_arrive(kBarP0, 2 * kWarpgroupThreads);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    if (NextA && warp == 0) load_half(0, 0, tile_start(2 * j + 2), pga, sla);
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) l_run[i1] *= f1[i1];
    scale_o(f1);
    bar_sync(kBarP1, 2 * kWarpgroupThreads);
    if constexpr (HasB) {
      zero_tail(1, tile_start(2 * j + 1), ph);
      pv_smem(1);
    }
    if constexpr (NextA) qk_l(0, phn);
    if constexpr (HasB) {
      warpgroup_wait<NextA ? 1 : 0>();
      warpgroup_fence_operand(tOrO);
      if (NextB && warp == 0) load_half(1, 0, tile_start(2 * j + 3), pgb, slb);
    }
    if constexpr (NextA) {
      qk_r(0, phn);
      qk_done();
    }
  };
  // Warpgroup 1's half of pair j (S_b computed on entry when b exists).
  auto wg1_pair = [&](auto has_b, auto next_a, auto next_b, int j) TESSEL_LAMBDA_INLINE {
    constexpr bool HasB = decltype(has_b)::value, NextA = decltype(next_a)::value,
                   NextB = decltype(next_b)::value;
    const int ph = j & 1, phn = ph ^ 1;
    int pga = 0, sla = 0, pgb = 0, slb = 0;
    if (NextA && warp == 0) box_src(tile_start(2 * j + 2), pga, sla);
    if (NextB && warp == 0) box_src(tile_start(2 * j + 3), pgb, slb);
    float mx[2] = {-INFINITY, -INFINITY}, ma[2], mn[2], f0[2], f1[2], fo[2];
    float sum[2] = {0.f, 0.f};
    if constexpr (HasB) scale_mask_max(tile_start(2 * j + 1), mx);
    bar_sync(kBarScale0, 2 * kWarpgroupThreads);
    row_load(smem.m_a, ma);
    row_load(smem.scale0, f0);
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      mn[i1] = new_max(mx[i1], ma[i1]);
      f1[i1] = ratio(ma[i1], mn[i1]);
      fo[i1] = f0[i1] * f1[i1];
    }
    row_store(smem.m_b, mn);
    row_store(smem.scale1, f1);
    bar_arrive(kBarScale1, 2 * kWarpgroupThreads);
    if constexpr (HasB) exp_rows(mn, sum);
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      l_run[i1] = l_run[i1] * fo[i1] + sum[i1];
      m_run[i1] = mn[i1];
    }
    scale_o(fo);
    zero_tail(0, tile_start(2 * j), ph);
    if constexpr (HasB) zero_tail(1, tile_start(2 * j + 1), ph);
    // PV_R(a) first: stage 0's R half is then refilled as early as possible.
    bar_sync(kBarP0, 2 * kWarpgroupThreads);
    pv_smem(0);
    if constexpr (HasB) {
      const float one[2] = {1.f, 1.f};
      store_p(one);  // P_b for warpgroup 0's O_L
      pv_regs(1);
    }
    bar_arrive(kBarP1, 2 * kWarpgroupThreads);
    warpgroup_wait<HasB ? 1 : 0>();
    warpgroup_fence_operand(tOrO);
    if (NextA && warp == 0) load_half(0, 1, tile_start(2 * j + 2), pga, sla);
    if constexpr (HasB) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      if (NextB && warp == 0) load_half(1, 1, tile_start(2 * j + 3), pgb, slb);
    }
    if constexpr (NextB) {
      qk_l(1, phn);
      qk_r(1, phn);
      qk_done();
    }
  };

  // ---- main loop: S of the first pair, then the pairs ----
  using T1 = cute::true_type;
  using F0 = cute::false_type;
  // Warpgroup w computes S of tile w (stage w, first phase); stage indices stay compile-time
  // constants (a runtime one would put the descriptor arrays in local memory).
  if (w == 0) {
    if (ntiles > 0) {
      qk_l(0, 0);
      qk_r(0, 0);
      qk_done();
    }
  } else if (ntiles > 1) {
    qk_l(1, 0);
    qk_r(1, 0);
    qk_done();
  }
  const int npairs = (ntiles + 1) / 2;
  for (int j = 0; j < npairs; ++j) {
    const int left = ntiles - 2 * j;  // tiles from a on
    if (w == 0) {
      if (left >= 4)
        wg0_pair(T1{}, T1{}, T1{}, j);
      else if (left == 3)
        wg0_pair(T1{}, T1{}, F0{}, j);
      else if (left == 2)
        wg0_pair(T1{}, F0{}, F0{}, j);
      else
        wg0_pair(F0{}, F0{}, F0{}, j);
    } else {
      if (left >= 4)
        wg1_pair(T1{}, T1{}, T1{}, j);
      else if (left == 3)
        wg1_pair(T1{}, T1{}, F0{}, j);
      else if (left == 2)
        wg1_pair(T1{}, F0{}, F0{}, j);
      else
        wg1_pair(F0{}, F0{}, F0{}, j);
    }
  }

  // ---- epilogue: the two halves' row sums, normalize, store (or write the split partial) ----
  CUTE_UNROLL
  for (int i1 = 0; i1 < 2; ++i1) {
    float l = l_run[i1];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l_run[i1] = l;
  }
  row_store(smem.l_part[w], l_run);
  bar_sync(kBarAll, 2 * kWarpgroupThreads);
  CUTE_UNROLL
  for (int i1 = 0; i1 < 2; ++i1)
    l_run[i1] = smem.l_part[0][row0 + 8 * i1] + smem.l_part[1][row0 + 8 * i1];
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
  // The last of the num_splits CTAs of (b, row block) merges the partials.
  if (!last_split_arrives(
          a.num_splits, tid == 0, &smem.last, [] { __syncthreads(); },
          [&] { return a.tickets + static_cast<int64_t>(b) * a.row_blocks + rb; }))
    return;
  for (int row = tid / 32; row < kRows; row += kThreads / 32) {
    const int grow = rb * kRows + row;
    if (grow >= a.rows_total) break;
    const int s = grow / a.group, h = grow - s * a.group;
    combine_row_serial<T, kLatent>(a, (static_cast<int64_t>(b) * a.sq + s) * a.hq + h, lane);
  }
}

}  // namespace tessel::decode::mla

#undef TESSEL_LAMBDA_INLINE
