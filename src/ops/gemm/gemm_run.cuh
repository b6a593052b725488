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
template <class T, Major MB>
using BigTile = GemmConfig<T, MB, 128, 256, 64, 4, 2>;
template <class T, Major MB>
using MidTile = GemmConfig<T, MB, 128, 128, 64, 6, 1>;
template <class T, Major MB>
using SmallTile = GemmConfig<T, MB, 128, 64, 64, 8, 1>;

// (GemmConfig's ClusterN — CTAs along N sharing A, for small M — is not instantiated yet:
// written, never measured; docs/gemm.md.)
enum TileCfg : int { kBig = 0, kMid = 1, kSmall = 2 };

// Split-K partial sums: per (device, stream) scratch owned by gemm (gemm.cu).
float* splitk_partials(cudaStream_t stream, size_t bytes);

template <class Cfg>
void launch(const GemmOperands& ops, const CUtensorMap& tma_d, GemmParams p, int sms,
            cudaStream_t stream) {
  if (Cfg::SplitK && p.splits > 1) {
    const TileScheduler sched(p.m, p.n, Cfg::BM, Cfg::BN, p.group, p.batches, p.splits);
    p.partials = splitk_partials(stream, static_cast<size_t>(sched.units()) * Cfg::BM * Cfg::BN * sizeof(float));
    p.counters = static_cast<int*>(
        detail::stream_workspace(stream, static_cast<size_t>(sched.tiles()) * sizeof(int)));
  }
  TESSEL_CUDA_CHECK((launch_gemm<Cfg>(ops, tma_d, p, sms, stream)));
}

template <class T>
void run_typed(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
               const GemmParams& p, int sms, cudaStream_t stream) {
  if (kn) {
    switch (cfg) {
      case kBig: launch<BigTile<T, Major::MN>>(ops, tma_d, p, sms, stream); break;
      case kMid: launch<MidTile<T, Major::MN>>(ops, tma_d, p, sms, stream); break;
      default: launch<SmallTile<T, Major::MN>>(ops, tma_d, p, sms, stream); break;
    }
  } else {
    switch (cfg) {
      case kBig: launch<BigTile<T, Major::K>>(ops, tma_d, p, sms, stream); break;
      case kMid: launch<MidTile<T, Major::K>>(ops, tma_d, p, sms, stream); break;
      default: launch<SmallTile<T, Major::K>>(ops, tma_d, p, sms, stream); break;
    }
  }
}

void run_bf16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
              const GemmParams& p, int sms, cudaStream_t stream);
void run_f16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
             const GemmParams& p, int sms, cudaStream_t stream);

}  // namespace tessel::gemm_detail
