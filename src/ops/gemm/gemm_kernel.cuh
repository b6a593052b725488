// Hopper GEMM kernel: D(M,N) = alpha * A(M,K) · B + beta * C, fp32 accumulation.
//
// One CTA per SM (persistent), clusters of ClusterM CTAs stacked along M that share each B
// tile (TMA multicast: each CTA loads 1/ClusterM of it for all), 1 producer + C consumer
// warpgroups per CTA:
//   producer : one elected thread walks the tile schedule and TMA-loads (BM x BK) A and
//              (BN x BK) B tiles into a Stages-deep 128B-swizzled ring (tile/sm90/tma.cuh,
//              pipeline.cuh); it runs ahead into the next tile while consumers store.
//   consumers: each owns 64 rows of the BM x BN tile; per stage: wait full barrier, issue
//              BK/16 WGMMAs, keep one stage of WGMMAs in flight, release the stage before;
//              then the register epilogue (tile/sm90/epilogue.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "tile/sm90/epilogue.cuh"
#include "tile/sm90/pipeline.cuh"
#include "tile/sm90/scheduler.cuh"
#include "tile/sm90/tma.cuh"
#include "tile/sm90/warpgroup.cuh"
#include "tile/sm90/wgmma.cuh"

namespace tessel::gemm_detail {

using namespace tessel::tile::sm90;

template <class T_, Major MB_, int BM_, int BN_, int BK_, int Stages_, int ClusterM_>
struct GemmConfig {
  using T = T_;
  static constexpr Major MB = MB_;
  static constexpr int BM = BM_, BN = BN_, BK = BK_, Stages = Stages_, ClusterM = ClusterM_;
  static constexpr int Consumers = BM / 64;
  static constexpr int Threads = kWarpgroupThreads * (1 + Consumers);
  using SmemA = SmemLayout<T, Major::K, BM, BK, Stages>;
  using SmemB = SmemLayout<T, MB, BN, BK, Stages>;
  using Mma = typename WgmmaTiled<T, MB, BM, BN, BK, Consumers>::TiledMma;
  using Pipeline = TmaPipeline<Stages>;
  struct Smem {
    alignas(1024) T a[cute::cosize_v<SmemA>];
    alignas(1024) T b[cute::cosize_v<SmemB>];
    alignas(16) typename Pipeline::SharedStorage pipe;
  };
  static constexpr uint32_t kTxBytes = stage_bytes<T, SmemA> + stage_bytes<T, SmemB>;
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
};

struct GemmParams {
  int m = 0, n = 0, k = 0;
  int group = 8;  // tile rows per raster group
  EpilogueParams epi;
};

template <class Cfg, class TmaA, class TmaB>
__global__ void __launch_bounds__(Cfg::Threads, 1)
    gemm_kernel(const __grid_constant__ TmaA tma_a, const __grid_constant__ TmaB tma_b,
                const __grid_constant__ GemmParams p) {
  using namespace cute;
  using T = typename Cfg::T;
  using BlockMN = Shape<Int<Cfg::BM>, Int<Cfg::BN>>;
  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));
  Tensor sA = make_tensor(make_smem_ptr(smem.a), typename Cfg::SmemA{});  // (BM, BK, Stages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b), typename Cfg::SmemB{});  // (BN, BK, Stages)

  constexpr int CM = Cfg::ClusterM;
  const int wg = warpgroup_index();
  auto pipe = make_tma_pipeline<Cfg::Stages, CM>(smem.pipe, wg == 0, Cfg::kTxBytes,
                                                 Cfg::Consumers * kWarpgroupThreads);
  cluster_sync<CM>();

  // The schedule walks cluster tiles (CM*BM x BN); this CTA takes tile row m*CM + rank.
  const TileScheduler sched(p.m, p.n, Cfg::BM * CM, Cfg::BN, p.group);
  const int rank = CM > 1 ? static_cast<int>(block_rank_in_cluster()) : 0;
  const int64_t first = blockIdx.x / CM, stride = gridDim.x / CM;
  const int k_tiles = (p.k + Cfg::BK - 1) / Cfg::BK;

  if (wg == 0) {  // ---- producer ----
    producer_registers();
    if (warp_in_warpgroup() == 0 && elect_one()) {
      auto [gA, dA] = tma_tiles(tma_a, sA, p.m, p.k);  // gA(_, m_tile, k_tile), dA(_, stage)
      auto [gB, dB] = tma_tiles<CM>(tma_b, sB, p.n, p.k, rank);
      constexpr uint16_t kAllCtas = (1u << CM) - 1;
      auto st = producer_start<Cfg::Stages>();
      for (int64_t t = first; t < sched.tiles(); t += stride) {
        const TileCoord tc = sched.coord(t);
        const int m_tile = tc.m * CM + rank;
        for (int k = 0; k < k_tiles; ++k) {
          pipe.producer_acquire(st);
          auto* bar = pipe.producer_get_barrier(st);
          copy(tma_a.with(*bar), gA(_, m_tile, k), dA(_, st.index()));
          if constexpr (CM > 1) copy(tma_b.with(*bar, kAllCtas), gB(_, tc.n, k), dB(_, st.index()));
          else copy(tma_b.with(*bar), gB(_, tc.n, k), dB(_, st.index()));
          ++st;
        }
      }
      pipe.producer_tail(st);
    }
  } else {  // ---- consumers ----
    consumer_registers();
    typename Cfg::Mma mma;
    auto thr = mma.get_slice(consumer_thread());
    Tensor fA = thr.make_fragment_A(thr.partition_A(sA));  // descriptors (MMA, M, K, Stages)
    Tensor fB = thr.make_fragment_B(thr.partition_B(sB));
    Tensor acc = partition_fragment_C(mma, BlockMN{});
    Tensor coords = thr.partition_C(make_identity_tensor(BlockMN{}));
    PipeState<Cfg::Stages> st;
    for (int64_t t = first; t < sched.tiles(); t += stride) {
      const TileCoord tc = sched.coord(t);
      const int m_tile = tc.m * CM + rank;
      mma.accumulate_ = GMMA::ScaleOut::Zero;
      if (k_tiles == 0) clear(acc);
      auto done = st;  // oldest stage not yet released
      for (int k = 0; k < k_tiles; ++k) {
        pipe.consumer_wait(st);
        mma_stage(mma, fA(_, _, _, st.index()), fB(_, _, _, st.index()), acc);
        warpgroup_wait<1>();  // the previous stage's WGMMAs are done: free its buffers
        if (k > 0) {
          pipe.consumer_release(done);
          ++done;
        }
        ++st;
      }
      warpgroup_wait<0>();
      if (k_tiles > 0) pipe.consumer_release(done);
      store_tile(acc, coords, p.epi, m_tile * Cfg::BM, tc.n * Cfg::BN, p.m, p.n);
    }
  }
}

// Host: descriptors + launch on a persistent grid: min(cluster tiles, clusters that fit at
// once) clusters of ClusterM CTAs (one CTA per SM).
template <class Cfg>
cudaError_t launch_gemm(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                        int sm_count, cudaStream_t stream) {
  using T = typename Cfg::T;
  constexpr int CM = Cfg::ClusterM;
  auto gA = gmem_operand<Major::K>(static_cast<const T*>(a), p.m, p.k, lda);
  auto gB = gmem_operand<Cfg::MB>(static_cast<const T*>(b), p.n, p.k, ldb);
  auto tma_a = make_tma_load(gA, typename Cfg::SmemA{});
  auto tma_b = make_tma_load<CM>(gB, typename Cfg::SmemB{});
  auto kernel = gemm_kernel<Cfg, decltype(tma_a), decltype(tma_b)>;

  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(Cfg::Threads);
  cfg.dynamicSmemBytes = Cfg::kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;

  // Per process and device-independent enough for one kind of GPU: first call sets it up.
  static int max_clusters = 0;
  if (max_clusters == 0) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Cfg::kSmemBytes));
    if (err != cudaSuccess) return err;
    int n = sm_count / CM;
    if constexpr (CM > 1) {
      cfg.gridDim = dim3(CM * n);
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        n = sm_count / CM;
      }
    }
    max_clusters = n;
  }
  const TileScheduler sched(p.m, p.n, Cfg::BM * CM, Cfg::BN, p.group);
  const int64_t clusters = sched.tiles() < max_clusters ? sched.tiles() : max_clusters;
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * CM));
  return cudaLaunchKernelEx(&cfg, kernel, tma_a, tma_b, p);
}

}  // namespace tessel::gemm_detail
