// Hopper GEMM kernel: D(M,N) = alpha * A(M,K) · B + beta * C, fp32 accumulation.
//
// One CTA per SM (persistent), clusters of ClusterM CTAs stacked along M that share each B
// tile, or of ClusterN CTAs side by side along N that share each A tile (TMA multicast: each
// CTA loads 1/cluster of it for all), 1 producer + C consumer warpgroups per CTA:
//   producer : one elected thread walks the tile schedule and TMA-loads (BM x BK) A and
//              (BN x BK) B tiles into a Stages-deep 128B-swizzled ring (tile/sm90/tma.cuh,
//              pipeline.cuh); it runs ahead into the next tile while consumers store.
//   consumers: each owns 64 rows of the BM x BN tile; per stage: wait full barrier, issue
//              BK/16 WGMMAs, keep one stage of WGMMAs in flight, release the stage before;
//              then the TMA-store epilogue (tile/sm90/epilogue.cuh): the copy engine drains
//              the staged output while the warpgroup starts the next tile.
// Work units are (batch, tile, K split) (tile/sm90/scheduler.cuh). Split-K (configs with
// BN <= 128): every split writes its fp32 partial tile to a workspace in fragment order
// (16-byte coalesced stores), bumps the tile's counter, and the split that arrives last sums
// the partials in split order 0..S-1 (its own from registers) — bitwise deterministic
// whatever the arrival order — resets the counter and runs the epilogue.
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

// ClusterM > 1: CTAs stacked along M share (multicast) each B tile; ClusterN > 1: CTAs side
// by side along N share each A tile (small M, where every CTA would re-read the same A).
// MA = MN: A is stored transposed, (K, M) row-major (WGMMA reads it MN-major from shared
// memory; no transpose pass).
template <class T_, Major MB_, int BM_, int BN_, int BK_, int Stages_, int ClusterM_,
          int ClusterN_ = 1, Major MA_ = Major::K>
struct GemmConfig {
  using T = T_;
  static constexpr Major MB = MB_;
  static constexpr Major MA = MA_;
  static constexpr int BM = BM_, BN = BN_, BK = BK_, Stages = Stages_, ClusterM = ClusterM_,
                       ClusterN = ClusterN_, ClusterSize = ClusterM_ * ClusterN_;
  static_assert(ClusterM == 1 || ClusterN == 1, "one multicast direction");
  static constexpr int Consumers = BM / 64;
  static constexpr int Threads = kWarpgroupThreads * (1 + Consumers);
  // Split-K needs registers for the running sum next to the accumulators: BN <= 128 only.
  // With ClusterN the CTAs of a cluster take the same K slice of side-by-side tiles, each
  // reducing its own tile.
  static constexpr bool SplitK = BN <= 128 && ClusterM == 1;
  using SmemA = SmemLayout<T, MA, BM, BK, Stages>;
  using SmemB = SmemLayout<T, MB, BN, BK, Stages>;
  using Mma = typename WgmmaTiled<T, MB, BM, BN, BK, Consumers, MA>::TiledMma;
  using Pipeline = TmaPipeline<Stages>;
  struct Smem {
    alignas(1024) T a[cute::cosize_v<SmemA>];
    alignas(1024) T b[cute::cosize_v<SmemB>];
    alignas(1024) char epi[Consumers][2][kStoreBoxBytes];  // output staging boxes
    alignas(16) float bias[BN];                            // the tile's bias (f32)
    alignas(16) typename Pipeline::SharedStorage pipe;
    int split_last;  // split-K: this CTA sums the tile
  };
  static constexpr uint32_t kTxBytes = stage_bytes<T, SmemA> + stage_bytes<T, SmemB>;
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

struct GemmParams {
  int m = 0, n = 0, k = 0;
  int batches = 1;
  bool a_batched = false, b_batched = false;  // else one A / B for every batch
  int group = 8;                              // tile rows per raster group
  int splits = 1;                             // K slices per tile (SplitK configs)
  float* partials = nullptr;                  // split-K: CTA tiles x splits x BM x BN floats
  int* counters = nullptr;                    // split-K: one zeroed int per CTA tile
  EpilogueParams epi;
};

// Named barriers: 1 + consumer warpgroup (its epilogue), kConsumersBarrier (all consumers).
constexpr int kConsumersBarrier = 3;

template <class Cfg, class TmaA, class TmaB>
__global__ void __launch_bounds__(Cfg::Threads, 1)
    gemm_kernel(const __grid_constant__ TmaA tma_a, const __grid_constant__ TmaB tma_b,
                const __grid_constant__ CUtensorMap tma_d, const __grid_constant__ GemmParams p) {
  using namespace cute;
  using T = typename Cfg::T;
  using BlockMN = Shape<Int<Cfg::BM>, Int<Cfg::BN>>;
  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));
  Tensor sA = make_tensor(make_smem_ptr(smem.a), typename Cfg::SmemA{});  // (BM, BK, Stages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b), typename Cfg::SmemB{});  // (BN, BK, Stages)

  constexpr int CM = Cfg::ClusterM, CN = Cfg::ClusterN, CS = Cfg::ClusterSize;
  const int wg = warpgroup_index();
  // A 1-D cluster whose CTAs all multicast into each other's stages.
  auto pipe = make_tma_pipeline<Cfg::Stages, CS>(smem.pipe, wg == 0, Cfg::kTxBytes,
                                                 Cfg::Consumers * kWarpgroupThreads);
  cluster_sync<CS>();

  // The schedule walks cluster tiles (CM*BM x CN*BN); this CTA takes tile row m*CM + rank
  // (ClusterM) or tile column n*CN + rank (ClusterN).
  const TileScheduler sched(p.m, p.n, Cfg::BM * CM, Cfg::BN * CN, p.group, p.batches,
                            Cfg::SplitK ? p.splits : 1);
  const int rank = CS > 1 ? static_cast<int>(block_rank_in_cluster()) : 0;
  const int rank_m = CM > 1 ? rank : 0, rank_n = CN > 1 ? rank : 0;
  const int64_t first = blockIdx.x / CS, stride = gridDim.x / CS;
  const int k_tiles = (p.k + Cfg::BK - 1) / Cfg::BK;
  const int splits = sched.splits;
  // K blocks [kb0, kb1) of split s.
  auto k_range = [&](int s, int& kb0, int& kb1) {
    kb0 = static_cast<int>(int64_t{k_tiles} * s / splits);
    kb1 = static_cast<int>(int64_t{k_tiles} * (s + 1) / splits);
  };

  if (wg == 0) {  // ---- producer ----
    producer_registers();
    if (warp_in_warpgroup() == 0 && elect_one()) {
      // Descriptors into the cache now, not on the first copy / store of the critical path.
      cute::prefetch_tma_descriptor(tma_a.get_tma_descriptor());
      cute::prefetch_tma_descriptor(tma_b.get_tma_descriptor());
      cute::prefetch_tma_descriptor(&tma_d);
      // gA(_, m_tile, k_tile, batch), dA(_, stage)
      auto [gA, dA] = tma_tiles<CN>(tma_a, sA, p.m, p.k, p.a_batched ? p.batches : 1, rank_n);
      auto [gB, dB] = tma_tiles<CM>(tma_b, sB, p.n, p.k, p.b_batched ? p.batches : 1, rank_m);
      constexpr uint16_t kAllCtas = (1u << CS) - 1;
      auto st = producer_start<Cfg::Stages>();
      for (int64_t u = first; u < sched.units(); u += stride) {
        const TileCoord tc = sched.coord(u);
        const int m_tile = tc.m * CM + rank_m, n_tile = tc.n * CN + rank_n;
        const int la = p.a_batched ? tc.batch : 0, lb = p.b_batched ? tc.batch : 0;
        int kb0, kb1;
        k_range(tc.split, kb0, kb1);
        for (int k = kb0; k < kb1; ++k) {
          pipe.producer_acquire(st);
          auto* bar = pipe.producer_get_barrier(st);
          if constexpr (CN > 1)
            copy(tma_a.with(*bar, kAllCtas), gA(_, m_tile, k, la), dA(_, st.index()));
          else
            copy(tma_a.with(*bar), gA(_, m_tile, k, la), dA(_, st.index()));
          if constexpr (CM > 1)
            copy(tma_b.with(*bar, kAllCtas), gB(_, n_tile, k, lb), dB(_, st.index()));
          else
            copy(tma_b.with(*bar), gB(_, n_tile, k, lb), dB(_, st.index()));
          ++st;
        }
      }
      pipe.producer_tail(st);
    }
  } else {  // ---- consumers ----
    consumer_registers();
    typename Cfg::Mma mma;
    const int ctid = consumer_thread();
    auto thr = mma.get_slice(ctid);
    Tensor fA = thr.make_fragment_A(thr.partition_A(sA));  // descriptors (MMA, M, K, Stages)
    Tensor fB = thr.make_fragment_B(thr.partition_B(sB));
    Tensor acc = partition_fragment_C(mma, BlockMN{});
    const int wgc = wg - 1;  // consumer warpgroup: rows 64*wgc .. 64*wgc+63 of the tile
    EpilogueCtx ectx{&tma_d, smem.epi[wgc][0], 0, ctid % kWarpgroupThreads, 1 + wgc};
    constexpr int CT = Cfg::Consumers * kWarpgroupThreads;
    constexpr int BV = (Cfg::BN + CT - 1) / CT;
    const bool has_bias = p.epi.bias != nullptr;
    PipeState<Cfg::Stages> st;
    for (int64_t u = first; u < sched.units(); u += stride) {
      const TileCoord tc = sched.coord(u);
      const int m_tile = tc.m * CM + rank_m, n_tile = tc.n * CN + rank_n;
      // The tile's bias, loaded now so that the mainloop hides the latency; staged in shared
      // memory before the epilogue (per-box global loads there stalled every box).
      float bias_pre[BV];
      CUTE_UNROLL
      for (int v = 0; v < BV; ++v) {
        const int cl = ctid + v * CT, col = n_tile * Cfg::BN + cl;
        bias_pre[v] = has_bias && cl < Cfg::BN && col < p.n ? load_bias(p.epi, col) : 0.f;
      }
      int kb0, kb1;
      k_range(tc.split, kb0, kb1);
      const int nk = kb1 - kb0;
      mma.accumulate_ = GMMA::ScaleOut::Zero;
      auto done = st;  // oldest stage not yet released
      for (int k = 0; k < nk; ++k) {
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
      warpgroup_fence_operand(acc);  // no accumulator read may move above the wait
      pipe.consumer_release(done);

      if constexpr (Cfg::SplitK) {
        if (splits > 1) {
          // Partial sums in fragment order: float4 v of consumer thread t at [v][t].
          constexpr int V = decltype(size(acc))::value / 4;
          constexpr int64_t kTile = int64_t{Cfg::BM} * Cfg::BN;
          const int64_t slot = tc.tile * CS + rank;  // this CTA's tile of the cluster tile
          float4* ws = reinterpret_cast<float4*>(p.partials + slot * splits * kTile);
          float4* mine = ws + tc.split * (kTile / 4);
          CUTE_UNROLL
          for (int v = 0; v < V; ++v)
            __stcg(mine + v * CT + ctid,
                   make_float4(acc(4 * v), acc(4 * v + 1), acc(4 * v + 2), acc(4 * v + 3)));
          __threadfence();
          asm volatile("bar.sync %0, %1;" ::"n"(kConsumersBarrier), "n"(CT) : "memory");
          if (ctid == 0) {
            const int last = atomicAdd(p.counters + slot, 1) == splits - 1;
            if (last) atomicExch(p.counters + slot, 0);  // leave the workspace zeroed
            smem.split_last = last;
          }
          asm volatile("bar.sync %0, %1;" ::"n"(kConsumersBarrier), "n"(CT) : "memory");
          if (!smem.split_last) continue;
          __threadfence();
          float4 sum[V];
          CUTE_UNROLL
          for (int v = 0; v < V; ++v) sum[v] = make_float4(0.f, 0.f, 0.f, 0.f);
          for (int s = 0; s < splits; ++s) {
            if (s == tc.split) {
              CUTE_UNROLL
              for (int v = 0; v < V; ++v) {
                sum[v].x += acc(4 * v);
                sum[v].y += acc(4 * v + 1);
                sum[v].z += acc(4 * v + 2);
                sum[v].w += acc(4 * v + 3);
              }
            } else {
              const float4* src = ws + s * (kTile / 4);
              CUTE_UNROLL
              for (int v = 0; v < V; ++v) {
                const float4 q = __ldcg(src + v * CT + ctid);
                sum[v].x += q.x;
                sum[v].y += q.y;
                sum[v].z += q.z;
                sum[v].w += q.w;
              }
            }
          }
          CUTE_UNROLL
          for (int v = 0; v < V; ++v) {
            acc(4 * v) = sum[v].x;
            acc(4 * v + 1) = sum[v].y;
            acc(4 * v + 2) = sum[v].z;
            acc(4 * v + 3) = sum[v].w;
          }
          warpgroup_fence_operand(acc);
        }
      }
      if (has_bias) {
        // Both warpgroups have read the previous tile's bias (their epilogues are done).
        asm volatile("bar.sync %0, %1;" ::"n"(kConsumersBarrier), "n"(CT) : "memory");
        CUTE_UNROLL
        for (int v = 0; v < BV; ++v)
          if (ctid + v * CT < Cfg::BN) smem.bias[ctid + v * CT] = bias_pre[v];
        asm volatile("bar.sync %0, %1;" ::"n"(kConsumersBarrier), "n"(CT) : "memory");
      }
      const int row0 = m_tile * Cfg::BM + 64 * wgc;
      if (row0 < p.m)
        store_tile<Cfg::BN>(acc, p.epi, ectx, row0, n_tile * Cfg::BN, tc.batch, p.m, p.n,
                            has_bias ? smem.bias : nullptr);
    }
    store_drain(ectx);
  }
}

// Operand pointers, leading dimensions and batch strides (elements; 0: shared by all batches).
struct GemmOperands {
  const void* a = nullptr;
  int64_t lda = 0, batch_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, batch_b = 0;
};

// Host: descriptors + launch on a persistent grid: min(cluster units, clusters that fit at
// once) clusters of ClusterM CTAs (one CTA per SM).
template <class Cfg>
cudaError_t launch_gemm(const GemmOperands& ops, const CUtensorMap& tma_d, GemmParams p,
                        int sm_count, cudaStream_t stream) {
  using T = typename Cfg::T;
  constexpr int CM = Cfg::ClusterM, CN = Cfg::ClusterN, CS = Cfg::ClusterSize;
  if (!Cfg::SplitK) p.splits = 1;
  p.a_batched = p.batches > 1 && ops.batch_a != 0;
  p.b_batched = p.batches > 1 && ops.batch_b != 0;
  // Batch strides of unbatched operands only need to be valid TMA strides.
  const int64_t bsa = p.a_batched ? ops.batch_a : ops.lda * (Cfg::MA == Major::K ? p.m : p.k);
  const int64_t bsb = p.b_batched ? ops.batch_b : ops.ldb * (Cfg::MB == Major::K ? p.n : p.k);
  auto gA = gmem_operand<Cfg::MA>(static_cast<const T*>(ops.a), p.m, p.k, ops.lda,
                                  p.a_batched ? p.batches : 1, bsa);
  auto gB = gmem_operand<Cfg::MB>(static_cast<const T*>(ops.b), p.n, p.k, ops.ldb,
                                  p.b_batched ? p.batches : 1, bsb);
  auto tma_a = make_tma_load<CN>(gA, typename Cfg::SmemA{});
  auto tma_b = make_tma_load<CM>(gB, typename Cfg::SmemB{});
  auto kernel = gemm_kernel<Cfg, decltype(tma_a), decltype(tma_b)>;

  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CS;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(Cfg::Threads);
  cfg.dynamicSmemBytes = Cfg::kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = CS > 1 ? 1 : 0;  // a plain launch without clusters

  // Per process and device-independent enough for one kind of GPU: first call sets it up.
  static int max_clusters = 0;
  if (max_clusters == 0) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Cfg::kSmemBytes));
    if (err != cudaSuccess) return err;
    int n = sm_count / CS;
    if constexpr (CS > 1) {
      cfg.gridDim = dim3(CS * n);
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        n = sm_count / CS;
      }
    }
    max_clusters = n;
  }
  const TileScheduler sched(p.m, p.n, Cfg::BM * CM, Cfg::BN * CN, p.group, p.batches, p.splits);
  const int64_t clusters = sched.units() < max_clusters ? sched.units() : max_clusters;
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * CS));
  return cudaLaunchKernelEx(&cfg, kernel, tma_a, tma_b, tma_d, p);
}

}  // namespace tessel::gemm_detail
