// Tile configurations of tessel::gemm and their launch (host side of gemm_kernel.cuh).
// gemm_bf16.cu and gemm_f16.cu instantiate run_typed<T> for their input dtype; gemm.cu
// (validation, plan) calls run_bf16 / run_f16.
#pragma once

#include <cuda.h>

#include "ops/gemm/gemm_kernel.cuh"
#include "runtime/check.hpp"
#include "runtime/workspace.hpp"

namespace tessel::gemm_detail {

// 128x256 tiles in clusters of 2 along M (B multicast) when they fill the machine; else
// 128x128 or 128x64 tiles, with split-K when even those leave SMs idle. Stages fill ~192 KB;
// the output staging boxes take 32 KB more.
template <class T, Major MB, Major MA = Major::K>
using BigTile = GemmConfig<T, MB, 128, 256, 64, 4, 2, 1, MA>;
template <class T, Major MB>
using MidTile = GemmConfig<T, MB, 128, 128, 64, 6, 1>;
template <class T, Major MB, Major MA = Major::K>
using SmallTile = GemmConfig<T, MB, 128, 64, 64, 8, 1, 1, MA>;

// 128x64 tiles in clusters of 2 along N (A multicast), with split-K: small M, where every
// CTA would otherwise re-read the whole A panel through L2 (docs/gemm.md, log step 8).
// B (N,K) only; B (K,N) runs SmallTile instead.
template <class T>
using SmallTileN2 = GemmConfig<T, Major::K, 128, 64, 64, 8, 1, 2>;

// 64x128 tiles, one consumer warpgroup: M <= 64 (128-row tiles would be half padding).
// B (N,K) only; B (K,N) runs SmallTile instead. (At M = 128 it lost to 128x64 by 6-11 %
// although 2/3 of each stage is weight instead of 1/3: docs/gemm.md, log step 12.)
template <class T>
using FlatTile = GemmConfig<T, Major::K, 64, 128, 64, 8, 1>;

// 128x192 tiles (two consumer warpgroups of 64 x 192, 4 stages: 160 KB + 32 KB of store
// boxes): N = 6144-class prefill shapes, where 128 tiles of 128x192 fill the H100's 132 SMs
// in one wave and neither 128x128 (192 tiles: 1.45 waves) nor 128x256 clusters (48 cluster
// tiles on 66 slots) do. B (N,K) only; no split-K (BN > 128).
template <class T>
using WideTile = GemmConfig<T, Major::K, 128, 192, 64, 4, 1>;

// 64x64 tiles, one consumer warpgroup, 13 stages (208 KB): memory-bound GEMMs with few output
// tiles (M = 128..256 against 2k-4k wide weights), where many small CTAs streaming the whole K
// beat fewer large ones with split-K (ncu on the H100: cuBLAS runs 128x4096x4096 as 128 CTAs
// of 64x64 in 2x1 clusters, 13 stages). TinyTile pairs CTAs along M (B multicast, no
// split-K); TinySplitTile is unclustered with split-K. B (N,K) only.
template <class T>
using TinyTile = GemmConfig<T, Major::K, 64, 64, 64, 13, 2>;
template <class T>
using TinySplitTile = GemmConfig<T, Major::K, 64, 64, 64, 13, 1>;

// 128x128 tiles in clusters of 2 along M (B multicast): few-wave prefill shapes (M = 512
// against 4k-28k wide weights). Unclustered 128x128 CTAs each pull 32 KB per 64-deep K block
// from L2 — at cuBLAS's rate on 512x4096x4096 that is ~9.6 TB/s over 132 SMs, about the L2's
// limit; sharing the B tile cuts it to 24 KB. B (N,K) only; no split-K (ClusterM > 1).
template <class T>
using MidTileM2 = GemmConfig<T, Major::K, 128, 128, 64, 6, 2>;

// 64x96 tiles in clusters of 2 along M (B multicast), 10 stages (200 KB): M = 128 against
// N = 6144-class weights, where 64 cluster tiles of 128x96 make one wave on 132 SMs (128x64:
// 96 CTAs, 0.73 wave; 64x64 pairs: 192 CTAs, 1.45 waves). The last 32 columns of 16-bit
// outputs fill no 64-column store box and are stored from registers. B (N,K) only.
template <class T>
using Tiny96Tile = GemmConfig<T, Major::K, 64, 96, 64, 10, 2>;

enum TileCfg : int {
  kBig = 0,
  kMid = 1,
  kSmall = 2,
  kSmallN2 = 3,
  kFlat = 4,
  kWide = 5,
  kTiny = 6,
  kTinySplit = 7,
  kMidM2 = 8,
  kTiny96 = 9,
};
constexpr int kNumTileCfgs = 10;

// Split-K partial sums: per (device, stream) scratch owned by gemm (gemm.cu); nullptr when it
// would have to grow and may_allocate is false.
float* splitk_partials(cudaStream_t stream, size_t bytes, bool may_allocate);

template <class Cfg>
void launch(const GemmOperands& ops, const CUtensorMap& tma_d, GemmParams p, int sms,
            cudaStream_t stream) {
  if (Cfg::SplitK && p.splits > 1) {
    // Scheduler tiles are cluster tiles; each CTA of a cluster reduces its own tile.
    constexpr size_t CS = Cfg::ClusterSize;
    const TileScheduler sched(p.m, p.n, Cfg::BM * Cfg::ClusterM, Cfg::BN * Cfg::ClusterN, p.group,
                              p.batches, p.splits);
    // Under graph capture nothing may be allocated: without workspace from an earlier eager
    // call on this stream, one split (the same result up to rounding order).
    const bool may_allocate = !detail::stream_capturing(stream);
    p.partials = splitk_partials(
        stream, static_cast<size_t>(sched.units()) * CS * Cfg::BM * Cfg::BN * sizeof(float),
        may_allocate);
    p.counters = static_cast<int*>(detail::stream_workspace(
        stream, static_cast<size_t>(sched.tiles()) * CS * sizeof(int), may_allocate));
    if (p.partials == nullptr || p.counters == nullptr) {
      p.splits = 1;
      p.partials = nullptr;
      p.counters = nullptr;
    }
  }
  TESSEL_CUDA_CHECK((launch_gemm<Cfg>(ops, tma_d, p, sms, stream)));
}

template <class T>
void run_typed(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
               const GemmParams& p, int sms, cudaStream_t stream) {
  if (kn) {
    switch (cfg) {
      case kBig: launch<BigTile<T, Major::MN>>(ops, tma_d, p, sms, stream); break;
      case kMid:
      case kWide:
      case kMidM2: launch<MidTile<T, Major::MN>>(ops, tma_d, p, sms, stream); break;
      default:
        launch<SmallTile<T, Major::MN>>(ops, tma_d, p, sms, stream);
        break;  // kSmall, kSmallN2, kFlat, kTiny, kTinySplit, kTiny96
    }
  } else {
    switch (cfg) {
      case kBig: launch<BigTile<T, Major::K>>(ops, tma_d, p, sms, stream); break;
      case kMid: launch<MidTile<T, Major::K>>(ops, tma_d, p, sms, stream); break;
      case kSmallN2: launch<SmallTileN2<T>>(ops, tma_d, p, sms, stream); break;
      case kFlat: launch<FlatTile<T>>(ops, tma_d, p, sms, stream); break;
      case kWide: launch<WideTile<T>>(ops, tma_d, p, sms, stream); break;
      case kTiny: launch<TinyTile<T>>(ops, tma_d, p, sms, stream); break;
      case kTinySplit: launch<TinySplitTile<T>>(ops, tma_d, p, sms, stream); break;
      case kMidM2: launch<MidTileM2<T>>(ops, tma_d, p, sms, stream); break;
      case kTiny96: launch<Tiny96Tile<T>>(ops, tma_d, p, sms, stream); break;
      default: launch<SmallTile<T, Major::K>>(ops, tma_d, p, sms, stream); break;
    }
  }
}

// A transposed (stored (K, M), MN-major in shared memory): the 128x256 cluster tile (kBig)
// or, for every other config, 128x64 with split-K (gemm_at_bf16.cu, gemm_at_f16.cu: their own
// translation units, compiled in parallel with the others).
template <class T>
void run_typed_at(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
                  const GemmParams& p, int sms, cudaStream_t stream) {
  if (cfg == kBig) {
    if (kn)
      launch<BigTile<T, Major::MN, Major::MN>>(ops, tma_d, p, sms, stream);
    else
      launch<BigTile<T, Major::K, Major::MN>>(ops, tma_d, p, sms, stream);
  } else {
    if (kn)
      launch<SmallTile<T, Major::MN, Major::MN>>(ops, tma_d, p, sms, stream);
    else
      launch<SmallTile<T, Major::K, Major::MN>>(ops, tma_d, p, sms, stream);
  }
}

void run_bf16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
              const GemmParams& p, int sms, cudaStream_t stream);
void run_at_bf16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
                 const GemmParams& p, int sms, cudaStream_t stream);
void run_at_f16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
                const GemmParams& p, int sms, cudaStream_t stream);
void run_f16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
             const GemmParams& p, int sms, cudaStream_t stream);

}  // namespace tessel::gemm_detail
