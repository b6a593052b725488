// Shared-memory staged RMSNorm / LayerNorm kernels (bulk TMA copies into shared memory).
//
// ---- backward ----
// RMSNorm / LayerNorm backward for f16/bf16 rows of 1024 … 8192 elements whose rows are
// 16-byte aligned: the rows are staged in shared memory by bulk TMA copies.
//
// The register kernel (norm_bwd_kernel) keeps x and dy of two rows plus the dw/db
// accumulators in 128 registers (2 CTAs per SM); here one thread bulk-copies the next
// STAGES-1 rows (x and dy, 16 KB per bf16 4096 row) into a shared-memory ring, so ~150 KB per
// SM stay in flight, and registers hold only the thread's weights and accumulators (64 for
// RMS bf16 4096). Measured (H100, 16384 x 4096 bf16, both with the grid capped at the resident
// clusters, see max_active_clusters): RMS 0.847 / LN 0.802 of copy bandwidth, register kernel
// 0.865 / 0.793 - the same within noise; the gain over 0.61-0.65 came from the grid cap.
//
// dw/db: each thread owns fixed columns and accumulates over the CTA's rows (row order); the
// CTAs of a cluster add their partials in rank order into rank 0 (distributed shared memory);
// one partial row per cluster goes to a scratch buffer and sum_slots_kernel adds the slots in
// slot order. Deterministic for a given GPU (the grid depends on the SM count).
#pragma once

#include <algorithm>
#include <cstdlib>

#include "ops/bulk_copy.cuh"
#include "ops/norm/norm_kernels.cuh"
#include "runtime/launch.cuh"
#include "runtime/workspace.hpp"

namespace tessel::norm {

using detail::bulk_copy_g2s;
using detail::cluster_arrive_relaxed;
using detail::cluster_wait;
using detail::fence_cluster;
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_init_fence;
using detail::mbar_wait;
using detail::named_barrier_arrive;
using detail::named_barrier_sync;
using detail::st_async_f2;
using detail::st_async_f4;

// Channel of element e (< 2^31) without a division: e / hw = (umulhi(e, magic) + e) >> shift
// (round-up reciprocal; exact for e < 2^31). In the GroupNorm loops the division sequence per
// 16-byte vector cost more than the vector's arithmetic.
struct ChannelDiv {
  uint32_t magic;
  int shift;
  __device__ explicit ChannelDiv(uint32_t hw) {
    shift = 32 - __clz(static_cast<int>(hw - 1u));
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - hw)) / hw + 1u);
  }
  __device__ int operator()(uint32_t e) const {
    return static_cast<int>((__umulhi(e, magic) + e) >> shift);
  }
};

// Host: bytes of the A/B knob `name` (kilobytes in [lo_kb, hi_kb]), `fallback` bytes otherwise.
inline int64_t env_kb_bytes(const char* name, int64_t lo_kb, int64_t hi_kb, int64_t fallback) {
  const char* e = std::getenv(name);
  const int64_t kb = e ? std::atoll(e) : 0;
  return kb >= lo_kb && kb <= hi_kb ? kb * 1024 : fallback;
}

constexpr int kStagedBlock = 256;
constexpr int kStagedMaxStages = 8;
constexpr int kStagedCluster = 8;           // the largest cluster the staged backward may use
constexpr int64_t kStagedSmem = 64 * 1024;  // ring bytes per CTA: 3 CTAs per SM

// KV: 16-byte vectors per thread and row (columns up to KV * 256 * VEC).
template <class T, int KV, Mode M>
__global__ void __launch_bounds__(kStagedBlock)
    norm_bwd_staged_kernel(const NormArgs a, int stages) {
  static_assert(M == Mode::rms || M == Mode::ln, "RMS / LayerNorm only");
  constexpr int VEC = kVec16<T>;
  constexpr int kArrays = M == Mode::ln ? 2 : 1;
  using C = Cfg<VEC, kStagedBlock, 1>;  // for row_sum2: one row per CTA
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kStagedMaxStages];
  __shared__ RedSmem red;
  const int nv = static_cast<int>(a.cols / VEC);
  const int ncols = static_cast<int>(a.cols);  // <= 8192 here
  const uint32_t row_bytes = static_cast<uint32_t>(a.cols * sizeof(T));
  T* const ring_t = reinterpret_cast<T*>(ring);
  auto x_stage = [&](int s) { return ring_t + s * 2 * ncols; };
  auto g_stage = [&](int s) { return ring_t + (s * 2 + 1) * ncols; };
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.r);
  const T* w = static_cast<const T*>(a.w);
  const int64_t row0 = blockIdx.x, step = gridDim.x;
  const int64_t mine = row0 < a.rows ? (a.rows - 1 - row0) / step + 1 : 0;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);
    mbar_init_fence();
  }
  __syncthreads();
  auto issue = [&](int64_t k, int s) {  // the CTA's k-th row into stage s (= k % stages)
    if (k >= mine) return;
    const int64_t row = row0 + k * step;
    mbar_arrive_expect_tx(&full[s], 2 * row_bytes);
    bulk_copy_g2s(x_stage(s), x + row * a.x_pitch, row_bytes, &full[s]);
    bulk_copy_g2s(g_stage(s), dy + row * a.r_pitch, row_bytes, &full[s]);
  };
  if (tid == 0)
    for (int k = 0; k < stages; ++k) issue(k, k);

  PFrag<T, VEC> w_cols[KV];
  float acc_w[KV][VEC], acc_b[KV][VEC];
#pragma unroll
  for (int q = 0; q < KV; ++q) {
    const int v = tid + q * kStagedBlock;
    w_cols[q].load(w + int64_t{v} * VEC, v < nv ? VEC : 0);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_w[q][j] = acc_b[q][j] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(a.cols);
  // Per-row state kept incrementally (H200: the row loop is issue-bound; k % stages and
  // k / stages on 64-bit k cost two division sequences per row, the statistics and dx
  // addresses 64-bit multiplies).
  const float* rstd_p = a.rstd + row0;  // the next row's statistics
  const float* mean_p = M == Mode::ln ? a.mean + row0 : nullptr;
  T* dr = static_cast<T*>(a.y) + row0 * a.y_pitch;
  const int64_t dr_step = step * a.y_pitch;
  float rs = 0.f, mu = 0.f;
  if (mine > 0) {
    rs = *rstd_p;
    if constexpr (M == Mode::ln) mu = *mean_p;
  }
  int phase = 0;
  int s = 0, s_prev = stages - 1;  // stage of row k (k % stages) and of row k - 1
  uint32_t parity = 0;             // (k / stages) & 1
#pragma unroll 1
  for (int64_t k = 0; k < mine; ++k) {
    float rs_n = 0.f, mu_n = 0.f;  // the next row's statistics, loaded a row ahead
    rstd_p += step;
    if constexpr (M == Mode::ln) mean_p += step;
    if (k + 1 < mine) {
      rs_n = *rstd_p;
      if constexpr (M == Mode::ln) mu_n = *mean_p;
    }
    mbar_wait(&full[s], parity);
    const T* xs = x_stage(s);
    const T* gs = g_stage(s);
    float s_gx = 0.f, s_g = 0.f;
#pragma unroll
    for (int q = 0; q < KV; ++q) {
      const int v = tid + q * kStagedBlock;
      if (v >= nv) continue;
      PFrag<T, VEC> xf, gf;
      xf.load(xs + v * VEC, VEC);
      gf.load(gs + v * VEC, VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xh = (xf.at(j) - mu) * rs;
        const float d = gf.at(j);
        acc_w[q][j] = fmaf(d, xh, acc_w[q][j]);
        if constexpr (kArrays >= 2) acc_b[q][j] += d;
        const float g = d * w_cols[q].at(j);
        s_gx = fmaf(g, xh, s_gx);
        if constexpr (M == Mode::ln) s_g += g;  // RMS has no mean(g) term
      }
    }
    const float2 sums = row_sum2<C>(make_float2(s_gx, s_g), red, phase);
    // Past row_sum2's barriers every thread is done with row k - 1: refill its stage.
    if (tid == 0 && k >= 1) issue(k - 1 + stages, s_prev);
    const float m_gx = sums.x * inv_n;
    const float m_g = M == Mode::rms ? 0.f : sums.y * inv_n;
    // dx = rs (g w - xh m_gx - m_g) = (g w) rs + x A + B with A = -rs^2 m_gx,
    // B = rs (rs m_gx mu - m_g): three FP operations per element instead of six. (x A + B
    // loses ~|mu| / |x - mu| f32 ulps of the x̂ term to cancellation: below the 16-bit output's
    // rounding for |mu| / std up to ~10^3; this kernel serves f16 / bf16 only.)
    const float cA = -(rs * rs) * m_gx;
    const float cB = rs * fmaf(rs * m_gx, mu, -m_g);
#pragma unroll
    for (int q = 0; q < KV; ++q) {
      const int v = tid + q * kStagedBlock;
      if (v >= nv) continue;
      PFrag<T, VEC> xf, gf;
      xf.load(xs + v * VEC, VEC);
      gf.load(gs + v * VEC, VEC);
      Frag<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float t = M == Mode::rms ? xf.at(j) * cA : fmaf(xf.at(j), cA, cB);
        o.v[j] = from_f32<T>(fmaf(gf.at(j) * w_cols[q].at(j), rs, t));
      }
      store_frag_global<VEC>(dr + v * VEC, o);
    }
    dr += dr_step;
    mu = mu_n;
    rs = rs_n;
    s_prev = s;
    if (++s == stages) {
      s = 0;
      parity ^= 1u;
    }
  }
  tile::allow_next_grid();  // sum_slots_kernel may start launching (it waits for our exit)
  // Partials: this CTA's columns into its (now idle) ring, rank 0 adds the cluster's in rank
  // order and writes the cluster's slot, as 16-byte shared / global accesses (4-byte shared
  // stores at a 32-byte thread stride were 8-way bank conflicts, 16 or 32 per thread, with 3
  // CTAs per SM ending together). The cluster barriers are relaxed, the partials published by
  // one fence, and a one-CTA cluster skips them: cluster.sync() released in every thread, a
  // memory barrier behind the last row's dx stores.
  static_assert(VEC % 4 == 0, "16-bit rows: 8 floats per vector");
  __syncthreads();
  float4* const part = reinterpret_cast<float4*>(ring);  // [kArrays][cols / 4]
  const int c4n = ncols / 4;
#pragma unroll
  for (int q = 0; q < KV; ++q) {
    const int v = tid + q * kStagedBlock;
    if (v >= nv) continue;
#pragma unroll
    for (int j = 0; j < VEC / 4; ++j) {
      part[v * (VEC / 4) + j] = make_float4(acc_w[q][4 * j], acc_w[q][4 * j + 1],
                                            acc_w[q][4 * j + 2], acc_w[q][4 * j + 3]);
      if constexpr (kArrays >= 2)
        part[c4n + v * (VEC / 4) + j] = make_float4(acc_b[q][4 * j], acc_b[q][4 * j + 1],
                                                    acc_b[q][4 * j + 2], acc_b[q][4 * j + 3]);
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned n = cluster.num_blocks();
  __syncthreads();
  if (n > 1) {  // the partials published by one fence (the CTA barrier ordered them before it)
    if (tid == 0) fence_cluster();
    cluster_arrive_relaxed();
    cluster_wait();
  }
  if (cluster.block_rank() == 0) {
    const int64_t slot = blockIdx.x / n, slots = gridDim.x / n;
    for (int c = tid; c < c4n; c += kStagedBlock)
#pragma unroll
      for (int k = 0; k < kArrays; ++k) {
        float4 sum = part[k * c4n + c];
        for (unsigned r = 1; r < n; ++r) {
          const float4 p = cluster.map_shared_rank(part, r)[k * c4n + c];
          sum.x += p.x;
          sum.y += p.y;
          sum.z += p.z;
          sum.w += p.w;
        }
        reinterpret_cast<float4*>(a.ws + (k * slots + slot) * a.cols)[c] = sum;
      }
  }
  if (n > 1) {  // no CTA leaves while rank 0 reads its shared memory (nothing to publish)
    cluster_arrive_relaxed();
    cluster_wait();
  }
}

// Launches the staged backward when it applies (RMS / LN without dh, f16/bf16, 16-byte
// aligned rows of 1024 … 8192 elements); false otherwise (nothing launched).
template <class T, Mode M>
bool launch_bwd_staged(NormArgs a, bool vec_ok, void* dw, void* db, cudaStream_t stream) {
  // f32 rows get 2 stages (one row in flight): the register kernel measured better there
  // (16384x4096 f32 RMS, H100: 0.909 vs 0.895 of copy bandwidth).
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    constexpr int VEC = kVec16<T>;
    constexpr int kArrays = M == Mode::ln ? 2 : 1;
    if (!vec_ok || a.b != nullptr || a.cols < 1024 || a.rows < 1) return false;
    const int64_t nv = a.cols / VEC;
    const int64_t stage_bytes = 2 * a.cols * int64_t{sizeof(T)};
    const int stages =
        static_cast<int>(std::min<int64_t>(kStagedMaxStages, kStagedSmem / stage_bytes));
    if (stages < 2 || nv > 4 * kStagedBlock) return false;
    const size_t smem = static_cast<size_t>(stages * stage_bytes);
    auto go = [&](auto kernel) {
      // Always: 48 KB of dynamic shared memory plus the static part is over the default limit.
      TESSEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
      // One resident wave of clusters (every CTA loops over rows); a CTA may get no row.
      // TESSEL_NORM_BWD_CLUSTER=n: cluster size (1, 2, 4, 8) for the A/B of residency
      // (clusters only start where a whole cluster fits in a GPC) against slot count.
      static const int cluster_req = [] {
        const char* e = std::getenv("TESSEL_NORM_BWD_CLUSTER");
        const int v = e ? std::atoi(e) : 0;
        // Default 2 since the slot partials became 16-byte accesses behind relaxed cluster
        // barriers (H200, 16384 x 4096 bf16, five alternating rounds over two calls, the first
        // two before the barriers were relaxed: RMS 0.887-0.899 at 1, 0.901-0.915 at 2;
        // LayerNorm 0.888-0.900 / 0.898-0.907). Half the slots: half the partial bytes written
        // and summed. Before that change 1 was best (H100, same run: RMS 0.871 / 0.892 / 0.897
        // / 0.877 and LN 0.808 / 0.874 / 0.858 / 0.837 of copy for clusters of 8 / 1 / 2 / 4;
        // H200, two rounds: RMS 0.899 / 0.901 at 1, 0.890 / 0.885 at 2, 0.837 / 0.842 at 4; LN
        // 0.842 / 0.807 / 0.742).
        const bool ok = v >= 1 && v <= kStagedCluster && (v & (v - 1)) == 0;
        return ok ? v : 2;
      }();
      int cluster = a.rows >= cluster_req ? cluster_req : 1;
      int64_t resident = max_active_clusters(kernel, kStagedBlock, smem, cluster);
      if (resident < 1 && cluster > 1) {
        cluster = 1;
        resident = max_active_clusters(kernel, kStagedBlock, smem, 1);
      }
      const int64_t slots =
          std::max<int64_t>(1, std::min<int64_t>(resident, (a.rows + cluster - 1) / cluster));
      const int64_t ctas = slots * cluster;
      // Own scratch (every slot is written whole, so nothing to zero afterwards).
      const detail::AsyncBuffer ws(size_t(kArrays) * slots * a.cols * sizeof(float), stream);
      a.ws = ws.as<float>();
      TESSEL_CUDA_CHECK(detail::launch_cluster(kernel, dim3(static_cast<unsigned>(ctas)),
                                               dim3(kStagedBlock), smem, static_cast<int>(cluster),
                                               stream, a, stages));
      launch_sum_slots<T>(a.ws, slots, a.cols, dw, db, stream);
    };
    if (nv <= kStagedBlock)
      go(norm_bwd_staged_kernel<T, 1, M>);
    else if (nv <= 2 * kStagedBlock)
      go(norm_bwd_staged_kernel<T, 2, M>);
    else
      go(norm_bwd_staged_kernel<T, 4, M>);
    return true;
  }
}

// ---- forward, long rows ---------------------------------------------------------------------
// Rows longer than the register paths (> 32768 16-bit / 16384 f32 elements, 16-byte aligned):
// a cluster of up to 8 CTAs per row, each bulk-copying its ~64 KB slice into shared memory in
// kFwdPieces pieces (3 CTAs per SM at different phases, so copies overlap other CTAs'
// reductions). Per CTA: local (count, mean, M2) for LayerNorm (two passes over shared memory)
// or Σx² for RMS; the cluster combines them in rank order (Chan's formula: no E[x²] - mean²
// cancellation); y is written from shared memory. The register-cluster kernel it replaces
// loaded, reduced and stored in lockstep, 2 CTAs per SM: 0.35 (RMS) / 0.25 (LN) of copy
// bandwidth at 256 x 262144 bf16.
// GroupNorm rows ((n, g): cpg channels x hw, hw % VEC == 0) take the same kernel with LayerNorm
// statistics and per-channel weights: its register-cluster path measured 0.27 of copy bandwidth
// at 32x512x64x64 bf16 (rows of 65536).
constexpr int kFwdBlock = 256;
constexpr int kFwdPieces = 4;
constexpr int kFwdClusterMax = 8;  // GroupNorm (its backward reads the peers in one sweep)
// RMS / LayerNorm long rows: slices of 32 KB in clusters of up to 16 (non-portable; 6-7 CTAs
// per SM). H100, 256 x 262144 bf16, two rounds (bench/results/h100/dev/session12/lr_*.json),
// RMS / LN of copy: 32 KB x 16 0.833 / 0.844, 40 KB x 13 0.768 / 0.769, 48 KB x 11 0.782 /
// 0.741, 64 KB x 8 0.731 / 0.705; the persistent RMS ring kernel (removed) 0.752 at 64 KB, 0.680 at
// 32 KB.
constexpr int kFwdLongClusterMax = 16;
constexpr int64_t kFwdSliceTarget = 32 * 1024;
constexpr int64_t kFwdSliceMax = 200 * 1024;
constexpr int kGnFwdSliceCh = 64;  // GroupNorm channels per slice with a shared (scale, shift)

struct StagedRed {  // row_sum2's view of the staged forward's CTA (one slice)
  static constexpr int THREADS = kFwdBlock;
  static constexpr int CLUSTER = 1;
};

template <class T, Mode M>
__global__ void __launch_bounds__(kFwdBlock) norm_fwd_staged_kernel(const NormArgs a, int chunk) {
  constexpr int VEC = kVec16<T>;
  constexpr bool kCentered = M == Mode::ln || M == Mode::gn;  // mean and variance statistics
  extern __shared__ __align__(128) unsigned char slice_raw[];
  const T* slice = reinterpret_cast<const T*>(slice_raw);
  __shared__ uint64_t bar[kFwdPieces];
  __shared__ float scratch[kFwdBlock / 32];
  __shared__ RedSmem red;
  // (count, mean, M2) or (count, -, Σx²) of each rank's slice, pushed by the rank (st.async)
  __shared__ float4 part[kFwdLongClusterMax];
  __shared__ uint64_t part_bar;
  __shared__ float stats[2];  // the row's (mean, rstd)
  // GroupNorm: (scale, shift) of the slice's channels, when it touches <= kGnFwdSliceCh
  __shared__ float2 ch_coef[M == Mode::gn ? kGnFwdSliceCh : 1];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int csize = static_cast<int>(cluster.num_blocks());
  const int64_t row = blockIdx.x / csize;
  const int64_t base = int64_t{rank} * chunk;
  const int64_t left = a.cols - base;
  const int n = left <= 0 ? 0 : left < chunk ? static_cast<int>(left) : chunk;
  const int nv = n / VEC;
  const int piece_v = (nv + kFwdPieces - 1) / kFwdPieces;
  const int tid = threadIdx.x;
  // GroupNorm: the slice's channels [ch_lo, ch_lo + n_ch) and their weight / bias, requested
  // now (one thread per channel) and used after the statistics.
  int ch_lo = 0, n_ch = 0;
  float w_ch = 0.f, b_ch = 0.f;
  if constexpr (M == Mode::gn) {
    const int hw = static_cast<int>(a.hw), base_i = static_cast<int>(base);
    ch_lo = n > 0 ? base_i / hw : 0;
    n_ch = n > 0 ? (base_i + n - 1) / hw - ch_lo + 1 : 0;
    const int64_t g0 = (row % a.groups) * a.cpg + ch_lo;
    if (n_ch <= kGnFwdSliceCh && tid < n_ch) {
      w_ch = to_f32(static_cast<const T*>(a.w)[g0 + tid]);
      if (a.b != nullptr) b_ch = to_f32(static_cast<const T*>(a.b)[g0 + tid]);
    }
  }
  if (tid == 0) {
#pragma unroll
    for (int p = 0; p < kFwdPieces; ++p) mbar_init(&bar[p], 1);
    mbar_init(&part_bar, 1);
    mbar_init_fence();
  }
  // part_bar is initialized cluster-wide before any peer pushes into it: this arrive releases
  // the initialization (fence above), the wait sits just before the pushes.
  cluster_arrive_relaxed();
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(&part_bar, static_cast<uint32_t>(csize) * sizeof(float4));
    const T* xr = static_cast<const T*>(a.x) + row * a.x_pitch + base;
    for (int p = 0; p < kFwdPieces; ++p) {
      const int v0 = p * piece_v, v1 = min(nv, v0 + piece_v);
      if (v1 <= v0) break;
      const uint32_t bytes = static_cast<uint32_t>(v1 - v0) * 16u;
      mbar_arrive_expect_tx(&bar[p], bytes);
      bulk_copy_g2s(const_cast<T*>(slice) + v0 * VEC, xr + v0 * VEC, bytes, &bar[p]);
    }
  }
  // One pass, as pieces land: Σx² (RMS), or for LayerNorm / GroupNorm Σd and Σd² of d = x - p,
  // p the slice's first element (shifted data: the cancellation in Σd² - (Σd)² / n is relative
  // to (mean - p)² / var, O(1), not to mean² / var). A second pass over the slice for
  // Σ(x - mean)² cost LayerNorm a shared-memory sweep and a block reduction per slice.
  float s1 = 0.f, s2 = 0.f, pivot = 0.f;
  for (int p = 0; p < kFwdPieces; ++p) {
    const int v0 = p * piece_v, v1 = min(nv, v0 + piece_v);
    if (v1 <= v0) break;
    mbar_wait(&bar[p], 0);
    if (kCentered && p == 0) pivot = to_f32(slice[0]);
    for (int v = v0 + tid; v < v1; v += kFwdBlock) {
      PFrag<T, VEC> f;
      f.load(slice + v * VEC, VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float x = f.at(j);
        if constexpr (kCentered) {
          const float d = x - pivot;
          s1 += d;
          s2 = fmaf(d, d, s2);
        } else {
          s1 = fmaf(x, x, s1);
        }
      }
    }
  }
  float local_mean = 0.f, m2 = 0.f;
  if constexpr (kCentered) {
    int phase = 0;
    const float2 r = row_sum2<StagedRed>(make_float2(s1, s2), red, phase);
    const float cnt = static_cast<float>(n);
    local_mean = n > 0 ? pivot + r.x / cnt : 0.f;
    m2 = n > 0 ? fmaxf(r.y - r.x * (r.x / cnt), 0.f) : 0.f;
  } else {
    s1 = group_reduce<kFwdBlock, kFwdBlock>(s1, SumOp{}, scratch);
  }
  // The partial goes to every rank's part[rank] by st.async (lane r of warp 0 to rank r); each
  // CTA waits for its csize partials on part_bar. No cluster barrier after the statistics (a
  // fence, then arrive / wait; session 31's profile put ~20 % of the long-row LayerNorm
  // forward's stall samples on the release barriers), no DSMEM reads, and no closing barrier:
  // a CTA leaves as soon as its y is stored (every push into it has landed by then).
  cluster_wait();
  if (tid < 32) {  // lane r reads rank r's partial; fixed butterflies (deterministic)
    if (tid < csize)
      st_async_f4(&part[rank], &part_bar, static_cast<uint32_t>(tid),
                  make_float4(static_cast<float>(n), local_mean, kCentered ? m2 : s1, 0.f));
    mbar_wait(&part_bar, 0);
    float pn = 0.f, pm = 0.f, pq = 0.f;
    if (tid < csize) {
      const float4 q = part[tid];
      pn = q.x;
      pm = q.y;
      pq = q.z;
    }
    const float inv_cols = 1.f / static_cast<float>(a.cols);
    float mean = 0.f, var;
    if constexpr (kCentered) {
      mean = warp_reduce<32>(pn * pm, SumOp{}) * inv_cols;
      const float dm = pm - mean;
      var = warp_reduce<32>(pq + pn * dm * dm, SumOp{}) * inv_cols;
    } else {
      var = warp_reduce<32>(pq, SumOp{}) * inv_cols;
    }
    if (tid == 0) {
      stats[0] = mean;
      stats[1] = rsqrtf(var + a.eps);
    }
  }
  __syncthreads();
  const float mean = stats[0], rstd = stats[1];
  if (rank == 0 && tid == 0) {
    if (a.rstd) a.rstd[row] = rstd;
    if constexpr (kCentered)
      if (a.mean) a.mean[row] = mean;
  }
  T* yr = static_cast<T*>(a.y) + row * a.y_pitch + base;
  if constexpr (M == Mode::gn) {
    // One channel per vector (hw % VEC == 0). Up to kGnFwdSliceCh channels per slice: each
    // vector takes its channel's (scale, shift) from shared memory, the channel by a multiply.
    // The per-vector division and the two dependent 2-byte weight / bias loads this replaces
    // (kept below for slices of more channels) cost more than the vector's arithmetic.
    const int hw = static_cast<int>(a.hw), base_i = static_cast<int>(base);
    if (n_ch <= kGnFwdSliceCh) {
      if (tid < n_ch) {
        const float scale = rstd * w_ch;
        ch_coef[tid] = make_float2(scale, b_ch - mean * scale);
      }
      __syncthreads();
      const ChannelDiv channel_of(static_cast<uint32_t>(hw));
#pragma unroll 2
      for (int v = tid; v < nv; v += kFwdBlock) {
        PFrag<T, VEC> f;
        f.load(slice + v * VEC, VEC);
        const float2 c = ch_coef[channel_of(static_cast<uint32_t>(base_i + v * VEC)) - ch_lo];
        Frag<T, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] = from_f32<T>(fmaf(f.at(j), c.x, c.y));
        store_frag_global<VEC>(yr + int64_t{v} * VEC, o);
      }
      return;
    }
    const T* w = static_cast<const T*>(a.w) + (row % a.groups) * a.cpg;
    const T* b = a.b != nullptr ? static_cast<const T*>(a.b) + (row % a.groups) * a.cpg : nullptr;
#pragma unroll 2
    for (int v = tid; v < nv; v += kFwdBlock) {
      PFrag<T, VEC> f;
      f.load(slice + v * VEC, VEC);
      const int ch = (base_i + v * VEC) / hw;
      const float scale = rstd * to_f32(w[ch]);
      const float shift = (b != nullptr ? to_f32(b[ch]) : 0.f) - mean * scale;
      Frag<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = from_f32<T>(fmaf(f.at(j), scale, shift));
      store_frag_global<VEC>(yr + int64_t{v} * VEC, o);
    }
    return;
  }
  const T* w = static_cast<const T*>(a.w) + base;
  const T* b = a.b != nullptr ? static_cast<const T*>(a.b) + base : nullptr;
  // The weight (and bias) vectors of kBatch stores are loaded before any of them: a load
  // written after a store cannot be moved above it (y might alias w), so the plain loop had one
  // L2 round trip per vector in flight. 256 x 262144 bf16 (H200, session 31): RMS 0.752-0.759
  // -> 0.765-0.768 of copy, LayerNorm 0.704-0.706 -> 0.711-0.714; a batch of 4 (55 registers:
  // 4 CTAs per SM instead of 6) read 0.72 / 0.64.
  constexpr int kBatch = 2;
  for (int v0 = tid; v0 < nv; v0 += kBatch * kFwdBlock) {
    PFrag<T, VEC> wf[kBatch], bf[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = v0 + u * kFwdBlock;
      if (v < nv) {
        wf[u].load(w + v * VEC, VEC);
        if (b != nullptr) bf[u].load(b + v * VEC, VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = v0 + u * kFwdBlock;
      if (v >= nv) break;
      PFrag<T, VEC> f;
      f.load(slice + v * VEC, VEC);
      Frag<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        float y = (f.at(j) - mean) * rstd * wf[u].at(j);
        if (b != nullptr) y += bf[u].at(j);
        o.v[j] = from_f32<T>(y);
      }
      store_frag_global<VEC>(yr + int64_t{v} * VEC, o);
    }
  }
}

// Launches the staged long-row forward when it applies (RMS / LN, 16-byte aligned rows longer
// than the register paths; GroupNorm rows of >= kGnStagedMinCols with hw % VEC == 0; slices
// <= 200 KB); false otherwise (nothing launched).
constexpr int64_t kGnStagedMinCols = 2048;
// GroupNorm slices of 32 KB (4-CTA clusters, 6 CTAs per SM at 32x512x64x64 bf16). H200, since
// the partials travel by st.async without cluster barriers (session 33, two rounds): 32 KB
// 0.912 / 0.913 of copy, 64 KB (clusters of 2, 3 per SM) 0.896 / 0.892, 48 KB 0.863 / 0.860,
// 128 KB 0.842 / 0.833. With the barriers 64 KB had led: H100 0.940 against 0.900 at 32 KB
// (bench/results/h100/dev/session10/call2_gn*.json), H200 0.84-0.86 against 0.70-0.77 for
// 16-26 KB (session 33, call 2).
constexpr int64_t kGnFwdSliceTarget = 32 * 1024;

template <class T, Mode M>
bool launch_fwd_staged(const NormArgs& a, bool vec_ok, cudaStream_t stream) {
  constexpr int64_t kVec = kVec16<T>;
  const int64_t min_cols = M == Mode::gn ? kGnStagedMinCols : 4096 * kVec + 1;
  if (!vec_ok || a.rows < 1 || a.cols < min_cols) return false;
  if (M == Mode::gn && (a.hw % kVec != 0 || a.cols >= (int64_t{1} << 30))) return false;
  const int64_t row_bytes = a.cols * int64_t{sizeof(T)};
  // TESSEL_NORM_GN_SLICE_KB=n: GroupNorm slice target (A/B of CTAs per SM vs cluster size).
  static const int64_t gn_target =
      env_kb_bytes("TESSEL_NORM_GN_SLICE_KB", 4, 192, kGnFwdSliceTarget);
  // TESSEL_NORM_FWD_SLICE_KB=n: RMS / LayerNorm slice target (A/B).
  static const int64_t fwd_target =
      env_kb_bytes("TESSEL_NORM_FWD_SLICE_KB", 4, 192, kFwdSliceTarget);
  const int64_t target = M == Mode::gn ? gn_target : fwd_target;
  const int64_t cmax = M == Mode::gn ? kFwdClusterMax : kFwdLongClusterMax;
  const int64_t csize =
      std::min<int64_t>(cmax, std::max<int64_t>(1, (row_bytes + target - 1) / target));
  const int64_t chunk = ((a.cols + csize - 1) / csize + kVec - 1) / kVec * kVec;
  const int64_t smem = chunk * int64_t{sizeof(T)};
  if (smem > kFwdSliceMax || a.rows * csize >= (int64_t{1} << 31)) return false;
  auto kernel = norm_fwd_staged_kernel<T, M>;
  if (csize > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (detail::launch_cluster(kernel, dim3(static_cast<unsigned>(a.rows * csize)), dim3(kFwdBlock),
                             static_cast<size_t>(smem), static_cast<int>(csize), stream, a,
                             static_cast<int>(chunk)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace tessel::norm

namespace tessel::norm {

// ---- backward, long rows ----------------------------------------------------------------------
// RMSNorm / LayerNorm backward of 16-bit rows longer than 16384 elements (16-byte aligned): a
// cluster of up to 16 CTAs (1024 threads, one per SM) per row, persistent over rows. Each CTA
// owns one column slice (<= 16384 columns) of every row its cluster handles: x and dy of the
// slice are bulk-copied into a ring of 3 (2 where shared memory is short) stages of 64 KB (the
// next rows land while this one is reduced and written), the slice's weights sit in shared
// memory (registers are for the accumulators: LayerNorm's weights in registers spilled), the
// row sums are combined over the cluster through distributed shared memory in rank order, and
// dw (db) of the slice's columns accumulate in registers over the cluster's rows. Each cluster
// writes one partial row per array (its slot, own columns per CTA); sum_slots_kernel adds the slots
// in order. The register-cluster kernel it replaces loaded, reduced and stored in lockstep: 0.44
// (RMS) / 0.36 (LN) of copy bandwidth at 256 x 262144 bf16.
// Software-pipelined over rows (session 15, long rows): a row's sums are exchanged without a
// cluster barrier. Each CTA pushes its partial (Σ g·x̂, Σ g) into every peer's stat_buf[k % 2]
// [rank] with st.async, completing 8 bytes on the peer's stat_bar[k % 2]; the CTA then writes
// dx of the previous row and reduces the next one before its warp 0 waits for row k's 16
// partials (summed in rank order as before: bitwise the same sums, dx and dw/db). The cluster
// barrier it replaces (cluster.sync per row: MEMBAR.ALL.GPU behind the row's dx stores, then
// UCGABAR + CCTL.IVALL, then a DSMEM gather by warp 0) sat serially between every row's
// reduction and its stores. The ring keeps one row fewer ahead (a stage holds row k - 1 until
// its dx is written).
constexpr int kLongBwdBlock = 1024;
constexpr int kLongBwdWarps = kLongBwdBlock / 32;
constexpr int kLongBwdClusterMax = 16;
constexpr int64_t kLongBwdStageBytes = 64 * 1024;  // x + dy of one slice
constexpr int kLongBwdMaxStages = 3;

namespace long_bwd {
// The CTA's rank, re-read (volatile: not a value kept live from the kernel's start).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
}  // namespace long_bwd

template <class T, int KV, Mode M>
__global__ void __launch_bounds__(kLongBwdBlock, 1)
    norm_bwd_long_kernel(const NormArgs a, int chunk, int stages) {
  static_assert(M == Mode::rms || M == Mode::ln, "RMS / LayerNorm only");
  constexpr int VEC = kVec16<T>;
  constexpr int kArrays = M == Mode::ln ? 2 : 1;
  extern __shared__ __align__(128) unsigned char long_ring[];
  __shared__ uint64_t full[kLongBwdMaxStages];
  __shared__ uint64_t stat_bar[2];                                  // row parity
  __shared__ __align__(16) float2 stat_buf[2][kLongBwdClusterMax];  // [row parity][peer rank]
  __shared__ float2 red_warp[kLongBwdWarps];
  __shared__ float4 coef;       // (cA, cB, rs) of the row whose dx is written next
  __shared__ float2 pend_stat;  // (rstd, mean) of the row whose partials are travelling
  T* const ring = reinterpret_cast<T*>(long_ring);
  T* const w_slice = ring + int64_t{stages} * 2 * chunk;
  auto x_stage = [&](int s) { return ring + int64_t{s} * 2 * chunk; };
  auto g_stage = [&](int s) { return ring + (int64_t{s} * 2 + 1) * chunk; };
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int csize = static_cast<int>(cluster.num_blocks());
  const int64_t row0 = blockIdx.x / csize, step = gridDim.x / csize;
  // Rows of this cluster (32-bit: fewer live registers in the row loop).
  const int mine = row0 < a.rows ? static_cast<int>((a.rows - 1 - row0) / step + 1) : 0;
  const int64_t base = int64_t{rank} * chunk;
  const int64_t left = a.cols - base;
  const int n = left <= 0 ? 0 : left < chunk ? static_cast<int>(left) : chunk;
  const int nv = n / VEC;
  const uint32_t slice_bytes = static_cast<uint32_t>(n) * sizeof(T);
  const uint32_t stat_bytes = static_cast<uint32_t>(csize) * sizeof(float2);
  const T* x = static_cast<const T*>(a.x) + base;
  const T* dy = static_cast<const T*>(a.r) + base;
  const T* dh = static_cast<const T*>(a.b);
  T* dx = static_cast<T*>(a.y) + base;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);
    mbar_init(&stat_bar[0], 1);
    mbar_init(&stat_bar[1], 1);
    mbar_init_fence();
  }
  cluster.sync();  // peers push into stat_bar / stat_buf: initialized everywhere first
  auto issue = [&](int k, int s) {  // the cluster's k-th row into stage s (= k % stages)
    if (k >= mine) return;
    const int64_t row = row0 + int64_t{k} * step;
    mbar_arrive_expect_tx(&full[s], 2 * slice_bytes);
    if (slice_bytes > 0) {
      bulk_copy_g2s(x_stage(s), x + row * a.x_pitch, slice_bytes, &full[s]);
      bulk_copy_g2s(g_stage(s), dy + row * a.r_pitch, slice_bytes, &full[s]);
    }
  };
  if (tid == 0) {
#pragma unroll 1
    for (int k = 0; k < stages; ++k) issue(k, k);
    // Rows 0 and 1 of the exchange: one arrival (this one) plus the peers' bytes.
    for (int b = 0; b < 2; ++b)
      if (b < mine) mbar_arrive_expect_tx(&stat_bar[b], stat_bytes);
  }
  // Each thread reads back only the weight vectors it stored: no barrier needed.
  float acc_w[KV][VEC], acc_b[KV][VEC];
#pragma unroll
  for (int q = 0; q < KV; ++q) {
    const int v = tid + q * kLongBwdBlock;
    if (v < nv)
      *reinterpret_cast<uint4*>(w_slice + v * VEC) =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(a.w) + base + int64_t{v} * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_w[q][j] = acc_b[q][j] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(a.cols);
  // Warp 0: waits for the cluster's partials of row k (pushed one row earlier), sums them in
  // rank order (lane = rank, the fixed butterfly) and leaves dx's per-row coefficients in
  // `coef`; re-arms the row's barrier for row k + 2. The row's rstd / mean come from pend_stat
  // (a global load here sat on warp 0's path to the CTA barrier).
  auto gather = [&](int k) {
    const int b = k & 1;
    mbar_wait(&stat_bar[b], static_cast<uint32_t>(k >> 1) & 1u);
    float2 p = make_float2(0.f, 0.f);
    if (lane < csize) p = stat_buf[b][lane];
    p = warp_sum2(p);
    __syncwarp();  // every lane has read stat_buf[b] before its next phase is armed
    if (lane == 0) {
      if (k + 2 < mine) mbar_arrive_expect_tx(&stat_bar[b], stat_bytes);
      const float2 st = pend_stat;
      const float prs = st.x, pmu = st.y;
      const float m_gx = p.x * inv_n;
      const float m_g = M == Mode::rms ? 0.f : p.y * inv_n;
      // dx = rs (g w - xh m_gx - m_g) = (g w) rs + x A + B (as norm_bwd_staged_kernel).
      coef = make_float4(-(prs * prs) * m_gx, prs * fmaf(prs * m_gx, pmu, -m_g), prs, 0.f);
    }
  };
  // dx of the cluster's row k from stage s (coefficients in `coef`). Two copies of the loop:
  // a runtime-predicated dh cost 16 instructions per vector (unpack + predicated adds) without dh.
  // LayerNorm has no dh (layer_norm_backward leaves a.b null): one copy, and no dh registers.
  auto write_dx_as = [&](int k, int s, auto with_dh) {
    constexpr bool kDh = decltype(with_dh)::value;
    const int64_t row = row0 + int64_t{k} * step;
    const float4 c = coef;
    const T* xs = x_stage(s);
    const T* gs = g_stage(s);
    T* const dr = dx + row * a.y_pitch;
    const T* hr = nullptr;
    if constexpr (kDh) hr = dh + row * a.b_pitch + int64_t{long_bwd::cluster_rank()} * chunk;
#pragma unroll
    for (int q = 0; q < KV; ++q) {
      const int v = tid + q * kLongBwdBlock;
      if (v >= nv) continue;
      PFrag<T, VEC> xf, gf, wf, hf;
      if constexpr (kDh) hf.load(hr + v * VEC, VEC);
      xf.load(xs + v * VEC, VEC);
      gf.load(gs + v * VEC, VEC);
      wf.load(w_slice + v * VEC, VEC);
      Frag<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float tx = M == Mode::rms ? xf.at(j) * c.x : fmaf(xf.at(j), c.x, c.y);
        float r = fmaf(gf.at(j) * wf.at(j), c.z, tx);
        if constexpr (kDh) r += hf.at(j);
        o.v[j] = from_f32<T>(r);
      }
      store_frag_global<VEC>(dr + v * VEC, o);
    }
  };
  auto write_dx = [&](int k, int s) {
    if (M == Mode::rms && dh != nullptr)
      write_dx_as(k, s, std::bool_constant<M == Mode::rms>{});
    else
      write_dx_as(k, s, std::false_type{});
  };
  // One CTA per SM: a row's statistics are loaded a row ahead (a dependent global load at the
  // top of every row stalled the whole SM), the stage and its parity kept incrementally (k %
  // stages, k / stages on 64-bit k were two division sequences per row).
  float rs = 0.f, mu = 0.f;
  if (mine > 0) {
    rs = a.rstd[row0];
    if constexpr (M == Mode::ln) mu = a.mean[row0];
  }
  int s = 0, ps = 0;  // stages of rows k and k - 1
  uint32_t parity = 0;
#pragma unroll 1
  for (int k = 0; k < mine; ++k) {
    float rs_n = 0.f, mu_n = 0.f;
    if (k + 1 < mine) {
      const int64_t next = row0 + int64_t{k + 1} * step;
      rs_n = a.rstd[next];
      if constexpr (M == Mode::ln) mu_n = a.mean[next];
    }
    mbar_wait(&full[s], parity);
    const T* xs = x_stage(s);
    const T* gs = g_stage(s);
    float s_gx = 0.f, s_g = 0.f;
#pragma unroll
    for (int q = 0; q < KV; ++q) {
      const int v = tid + q * kLongBwdBlock;
      if (v >= nv) continue;
      PFrag<T, VEC> xf, gf, wf;
      xf.load(xs + v * VEC, VEC);
      gf.load(gs + v * VEC, VEC);
      wf.load(w_slice + v * VEC, VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xh = (xf.at(j) - mu) * rs;
        const float d = gf.at(j);
        acc_w[q][j] = fmaf(d, xh, acc_w[q][j]);
        if constexpr (kArrays >= 2) acc_b[q][j] += d;
        const float g = d * wf.at(j);
        s_gx = fmaf(g, xh, s_gx);
        if constexpr (M == Mode::ln) s_g += g;  // RMS has no mean(g) term
      }
    }
    // Row sums: warps, then the CTA's 32 warps; pushed to the cluster's CTAs below.
    const float2 t = warp_sum2(make_float2(s_gx, s_g));
    if (lane == 0) red_warp[warp] = t;
    if (warp == 0 && k > 0) gather(k - 1);  // row k - 1's partials: long arrived
    __syncthreads();                        // S1: red_warp, coef
    if (warp == 0) {
      const float2 p = warp_sum2(red_warp[lane]);
      if (lane < csize)
        st_async_f2(&stat_buf[k & 1][rank], &stat_bar[k & 1], static_cast<uint32_t>(lane), p);
      if (lane == 0) pend_stat = make_float2(rs, mu);  // gather(k - 1) has read the last one
    }
    if (k > 0) write_dx(k - 1, ps);  // while row k's partials travel
    __syncthreads();                 // S2: every thread is done with stage ps: refill it
    if (tid == 0 && k > 0) issue(k - 1 + stages, ps);
    mu = mu_n;
    rs = rs_n;
    ps = s;
    if (++s == stages) {
      s = 0;
      parity ^= 1u;
    }
  }
  if (mine > 0) {  // the last row's dx
    if (warp == 0) gather(mine - 1);
    __syncthreads();
    write_dx(mine - 1, ps);
  }
  // This CTA's columns of the cluster's slot, transposed through the (now idle) ring so that
  // a warp stores 512 contiguous bytes: a thread's own 8 floats per vector, stored directly,
  // left each 32-byte sector to several instructions (ptxas split half of the 16-byte stores
  // into 4-byte ones at the 64-register cap). Those stores and the cluster wait behind them drew
  // 17 % of the LayerNorm kernel's stall samples (Nsight Compute, H200, session 31's profile).
  // The slice offset is re-read here (volatile): a pointer kept from before the row loop
  // spilled (LayerNorm KV 2, at the 64-register cap).
  static_assert(VEC % 4 == 0, "16-bit rows: 8 floats per vector");
  float* const acc_smem = reinterpret_cast<float*>(long_ring);  // [kArrays][chunk]
  __syncthreads();  // every thread is done with the ring (the last row's dx)
#pragma unroll
  for (int q = 0; q < KV; ++q) {
    const int v = tid + q * kLongBwdBlock;
    if (v >= nv) continue;
#pragma unroll
    for (int j = 0; j < VEC / 4; ++j) {
      reinterpret_cast<float4*>(acc_smem + v * VEC)[j] = make_float4(
          acc_w[q][4 * j], acc_w[q][4 * j + 1], acc_w[q][4 * j + 2], acc_w[q][4 * j + 3]);
      if constexpr (kArrays >= 2)
        reinterpret_cast<float4*>(acc_smem + chunk + v * VEC)[j] = make_float4(
            acc_b[q][4 * j], acc_b[q][4 * j + 1], acc_b[q][4 * j + 2], acc_b[q][4 * j + 3]);
    }
  }
  __syncthreads();
  const int64_t col0 = int64_t{long_bwd::cluster_rank()} * chunk;
  const int64_t slot = row0, slots = step;
  const int n4 = nv * (VEC / 4);  // float4s per array (the ws rows are 32-byte aligned here)
  float4* const pw = reinterpret_cast<float4*>(a.ws + slot * a.cols + col0);
  float4* const pb = reinterpret_cast<float4*>(a.ws + (slots + slot) * a.cols + col0);
  for (int i = tid; i < n4; i += kLongBwdBlock) {
    pw[i] = reinterpret_cast<const float4*>(acc_smem)[i];
    if constexpr (kArrays >= 2) pb[i] = reinterpret_cast<const float4*>(acc_smem + chunk)[i];
  }
  // No CTA leaves while a peer may still push into its stat_buf. Relaxed: nothing is published
  // through this barrier (cluster.sync's release waited for every dx / dw store to drain).
  cluster_arrive_relaxed();
  cluster_wait();
}

// Launches the long-row backward when it applies (RMS / LN, f16/bf16, 16-byte aligned rows of
// more than 16384 elements whose slice fits a 64 KB stage); false otherwise (nothing launched).
template <class T, Mode M>
bool launch_bwd_long(NormArgs a, bool vec_ok, void* dw, void* db, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    constexpr int64_t kVec = kVec16<T>;
    constexpr int kArrays = M == Mode::ln ? 2 : 1;
    if (!vec_ok || a.rows < 1 || a.cols <= 16384) return false;
    const int64_t pair_bytes = 2 * a.cols * int64_t{sizeof(T)};
    const int64_t csize = (pair_bytes + kLongBwdStageBytes - 1) / kLongBwdStageBytes;
    if (csize > kLongBwdClusterMax) return false;
    const int64_t chunk = ((a.cols + csize - 1) / csize + kVec - 1) / kVec * kVec;
    if (2 * chunk * int64_t{sizeof(T)} > kLongBwdStageBytes) return false;
    // Stages of x + dy, then the slice's weights.
    const int64_t slice_bytes = chunk * int64_t{sizeof(T)};
    const int stages = 7 * slice_bytes + 1024 <= int64_t{227} * 1024 ? 3 : 2;  // + static
    const size_t smem = static_cast<size_t>((2 * stages + 1) * slice_bytes);
    auto go = [&](auto kernel) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      const int64_t resident =
          max_active_clusters(kernel, kLongBwdBlock, smem, static_cast<int>(csize));
      if (resident < 1) return false;
      const int64_t slots = std::min<int64_t>(resident, a.rows);
      // Own scratch (every slot is written whole, so nothing to zero afterwards).
      const detail::AsyncBuffer ws(size_t(kArrays) * slots * a.cols * sizeof(float), stream);
      a.ws = ws.as<float>();
      TESSEL_CUDA_CHECK(detail::launch_cluster(kernel, dim3(static_cast<unsigned>(slots * csize)),
                                               dim3(kLongBwdBlock), smem, static_cast<int>(csize),
                                               stream, a, static_cast<int>(chunk), stages));
      launch_sum_slots<T>(a.ws, slots, a.cols, dw, db, stream);
      return true;
    };
    if (chunk <= kLongBwdBlock * kVec) return go(norm_bwd_long_kernel<T, 1, M>);
    return go(norm_bwd_long_kernel<T, 2, M>);
  }
}

// ---- GroupNorm backward, staged ---------------------------------------------------------------
// A row (n, g) of L = cpg * hw elements (hw % VEC == 0) per cluster of csize CTAs; each CTA
// bulk-copies its slice of x and dy into shared memory, so both are read from memory once (the
// register path re-read them in a second kernel for dw/db: 0.44 of copy bandwidth at
// 32x512x64x64 bf16). Per channel k of the row:
//   A_k = sum dy (x - mean),  B_k = sum dy     (over the channel's hw elements)
// which give dw/db partials (A_k * rstd, B_k; summed over n by sum_slots_kernel) and the row
// sums of the backward: sum g xhat = rstd sum_k w_k A_k, sum g = sum_k w_k B_k (g = dy w).
// Order: a CTA reduces each of its channels over warps then the CTA's 8 warps in order; its
// weighted pair (sum w_k A_k, sum w_k B_k over its slice's channels) is one warp sum; every CTA
// adds the cluster's pairs in rank order, rank 0 the channel partials, so results are
// deterministic.
constexpr int kGnBwdBlock = 256;
constexpr int kGnBwdWarps = kGnBwdBlock / 32;
constexpr int kGnBwdMaxSliceCh = 32;  // channels that one CTA's slice may touch
constexpr int kGnBwdMaxCpg = 4096;
// Bytes of x (and of dy) per CTA. H100, 32x512x64x64 bf16, one device call, two rounds: 8 KB
// 0.828 / 0.835 of copy, 16 KB 0.838 / 0.839, 24 KB 0.759 / 0.753, 32 KB 0.732 / 0.742, 48 KB
// 0.723 / 0.729 (bench/results/h100/dev/session10/call3_gnb*.json).
constexpr int64_t kGnBwdSliceTarget = 16 * 1024;
constexpr int kGnBwdStages = 2;
constexpr int kGnBwdMaxStages = 4;
constexpr int kGnBwdClusterMax = 16;   // non-portable above 8 (TESSEL_NORM_GN_BWD_SLICE_KB)
constexpr int kGnBwdPartsBarrier = 1;  // named barrier: the warps' channel partials are stored

// Persistent: a cluster handles rows row0, row0 + step, ...; its CTAs keep the same column
// slice, staged in a 2-deep ring (the next row's x and dy land while this one is reduced and
// written; one row per short-lived cluster measured 0.76-0.79 of copy bandwidth at
// 32x512x64x64 bf16).
// Exchange without a cluster barrier: warp 0 pushes the CTA's weighted pair into every rank's
// recv_w[k % 2][rank] and its channel partials into rank 0's recv[k % 2][rank] with st.async,
// completing on the receiver's recv_bar[k % 2]; each CTA waits for the row's bytes and adds the
// pairs from local shared memory in rank order (session 34: the block reduction of per-channel
// sums it replaces held warps 1-7 at a barrier while warp 0 summed the channels, 9 % of the
// stall samples). The per-row cluster barrier before that put a fence (MEMBAR.ALL.GPU) and a
// DSMEM gather per channel on every row's path. A parity buffer is pushed again (row k + 2)
// only after every peer has pushed row k + 1, which each does after reading row k (the closing
// __syncthreads orders rank 0's channel reads too): the receiver's reads are done by then.
template <class T>
__global__ void __launch_bounds__(kGnBwdBlock, 3)
    gn_bwd_staged_kernel(const NormArgs a, int chunk, int stages, float* __restrict__ ch_ws,
                         int64_t nc) {
  constexpr int VEC = kVec16<T>;
  extern __shared__ __align__(128) unsigned char gn_smem[];
  T* const ring = reinterpret_cast<T*>(gn_smem);
  auto x_stage = [&](int s) { return ring + int64_t{s} * 2 * chunk; };
  auto g_stage = [&](int s) { return ring + (int64_t{s} * 2 + 1) * chunk; };
  __shared__ uint64_t full[kGnBwdMaxStages];
  __shared__ uint64_t recv_bar[2];  // row parity
  __shared__ float2 warp_part[kGnBwdMaxSliceCh][kGnBwdWarps];
  __shared__ float w_slice[kGnBwdMaxSliceCh];  // rstd * w of the slice's channels, this row
  // [row parity][sender rank]: each rank's (sum w_k A_k, sum w_k B_k) over its slice's
  // channels, pushed to every rank: the row sums are their rank-order total.
  __shared__ float2 recv_w[2][kGnBwdClusterMax];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int csize = static_cast<int>(cluster.num_blocks());
  const int64_t row0 = blockIdx.x / csize, step = gridDim.x / csize;
  const int64_t mine = row0 < a.rows ? (a.rows - 1 - row0) / step + 1 : 0;
  const int base = rank * chunk;
  const int cols = static_cast<int>(a.cols), hw = static_cast<int>(a.hw), cpg = a.cpg;
  const int n = cols - base <= 0 ? 0 : min(cols - base, chunk);
  const int nv = n / VEC;
  const uint32_t slice_bytes = static_cast<uint32_t>(n) * sizeof(T);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // [row parity][sender rank][sender's slice channel]: the ranks' (A, B) channel partials, past
  // the ring; only rank 0 receives them (the per-(n, c) dw/db partials)
  float2(*const recv)[kGnBwdMaxSliceCh] =
      reinterpret_cast<float2(*)[kGnBwdMaxSliceCh]>(ring + int64_t{stages} * 2 * chunk);
  auto recv_at = [&](int b, int r) { return recv[b * csize + r]; };
  // Channels of this slice: [ch_lo, ch_hi], the same for every row.
  const int ch_lo = n > 0 ? base / hw : 0;
  const int ch_hi = n > 0 ? (base + n - 1) / hw : -1;
  // Channel of element e (< 2^30) by a multiply (ChannelDiv). The H200 runs the dx loop at its
  // issue limit: the division sequence and the dependent weight load per 16-byte vector it
  // replaces cost more than the vector's arithmetic.
  const ChannelDiv channel_of(static_cast<uint32_t>(hw));
  // Rank r's slice: channels [r_lo(r), r_lo(r) + r_nch(r)), kept in shared memory (rank_ch);
  // the bytes each row brings.
  __shared__ int2 rank_ch[kGnBwdClusterMax];
  auto r_lo = [&](int r) { return r * chunk / hw; };
  auto r_nch = [&](int r) {
    const int nr = min(cols - r * chunk, chunk);
    return nr <= 0 ? 0 : (r * chunk + nr - 1) / hw - r * chunk / hw + 1;
  };
  if (tid < kGnBwdClusterMax)
    rank_ch[tid] = tid < csize ? make_int2(r_lo(tid), r_nch(tid)) : make_int2(0, 0);
  uint32_t recv_bytes = static_cast<uint32_t>(csize) * sizeof(float2);  // recv_w
  if (rank == 0)
    for (int r = 0; r < csize; ++r) recv_bytes += static_cast<uint32_t>(r_nch(r)) * sizeof(float2);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kGnBwdMaxStages; ++s)
      if (s < stages) mbar_init(&full[s], 1);
    mbar_init(&recv_bar[0], 1);
    mbar_init(&recv_bar[1], 1);
    mbar_init_fence();
  }
  cluster.sync();  // peers push into recv / recv_bar: initialized everywhere first
  auto issue = [&](int64_t k, int s) {  // the cluster's k-th row into stage s = k % stages
    if (k >= mine) return;
    const int64_t row = row0 + k * step;
    mbar_arrive_expect_tx(&full[s], 2 * slice_bytes);
    if (slice_bytes > 0) {
      bulk_copy_g2s(x_stage(s), static_cast<const T*>(a.x) + row * a.x_pitch + base, slice_bytes,
                    &full[s]);
      bulk_copy_g2s(g_stage(s), static_cast<const T*>(a.r) + row * a.r_pitch + base, slice_bytes,
                    &full[s]);
    }
  };
  if (tid == 0) {
    for (int k = 0; k < stages; ++k) issue(k, k);
    for (int b = 0; b < 2; ++b)  // rows 0 and 1: this arrival plus the peers' bytes
      if (b < mine) mbar_arrive_expect_tx(&recv_bar[b], recv_bytes);
  }
  const float inv_n = 1.f / static_cast<float>(cols);
  // The row's group (row % groups) kept incrementally: no 64-bit modulo per row.
  int grp = static_cast<int>(row0 % a.groups);
  const int grp_step = static_cast<int>(step % a.groups);
  // mean, rstd and the weight of this thread's slice channel (tid <= ch_hi - ch_lo) of row k,
  // loaded a row ahead: their global-load latency sat on every row's path (5 % of the stall
  // samples, session 34).
  float mean_n = 0.f, rstd_n = 0.f, w_n = 0.f;
  auto load_params = [&](int64_t k) {
    if (k >= mine) return;
    const int64_t row = row0 + k * step;
    mean_n = a.mean[row];
    rstd_n = a.rstd[row];
    if (tid <= ch_hi - ch_lo) w_n = to_f32(static_cast<const T*>(a.w)[grp * cpg + ch_lo + tid]);
    grp += grp_step;
    if (grp >= a.groups) grp -= a.groups;
  };
  load_params(0);
  int s = 0;              // stage of row k (k % stages)
  uint32_t s_parity = 0;  // (k / stages) & 1
#pragma unroll 1
  for (int64_t k = 0; k < mine; ++k) {
    const int64_t row = row0 + k * step;
    const int b = static_cast<int>(k & 1);
    const float mean = mean_n, rstd = rstd_n, w_own = w_n;
    load_params(k + 1);
    // Past the previous row's closing barrier: nobody reads w_slice any more.
    if (tid <= ch_hi - ch_lo) w_slice[tid] = rstd * w_own;
    mbar_wait(&full[s], s_parity);
    const T* xs = x_stage(s);
    const T* gs = g_stage(s);
    for (int c = ch_lo; c <= ch_hi; ++c) {
      const int lo = max(c * hw, base) - base, hi = min((c + 1) * hw, base + n) - base;
      float s1 = 0.f, s2 = 0.f;
      for (int v = lo / VEC + tid; v < hi / VEC; v += kGnBwdBlock) {
        PFrag<T, VEC> xf, gf;
        xf.load(xs + v * VEC, VEC);
        gf.load(gs + v * VEC, VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = gf.at(j);
          s1 = fmaf(d, xf.at(j) - mean, s1);
          s2 += d;
        }
      }
      const float2 t = warp_sum2(make_float2(s1, s2));
      if (lane == 0) warp_part[c - ch_lo][warp] = t;
    }
    // Warp 0 sums the warps' partials; the others go on to the exchange wait.
    if (warp == 0) {
      named_barrier_sync(kGnBwdPartsBarrier, kGnBwdBlock);
      // Lane l: channel ch_lo + l of the slice (< kGnBwdMaxSliceCh <= 32 channels).
      const bool own = lane <= ch_hi - ch_lo;
      float2 t = make_float2(0.f, 0.f);
      if (own) {
        t = warp_part[lane][0];
#pragma unroll
        for (int q = 1; q < kGnBwdWarps; ++q) {
          t.x += warp_part[lane][q].x;
          t.y += warp_part[lane][q].y;
        }
        st_async_f2(&recv_at(b, rank)[lane], &recv_bar[b], 0u, t);  // rank 0: dw/db partials
      }
      const float2 u =
          warp_sum2(own ? make_float2(w_own * t.x, w_own * t.y) : make_float2(0.f, 0.f));
      if (lane < csize) st_async_f2(&recv_w[b][rank], &recv_bar[b], static_cast<uint32_t>(lane), u);
    } else {
      named_barrier_arrive(kGnBwdPartsBarrier, kGnBwdBlock);
    }
    mbar_wait(&recv_bar[b], static_cast<uint32_t>(k >> 1) & 1u);
    // Row sums: sum_c w_c A_c = sum over ranks of each rank's sum over its slice's channels,
    // added in rank order by every thread (the same result in every CTA of the cluster).
    float2 sums = recv_w[b][0];
    for (int r = 1; r < csize; ++r) {
      sums.x += recv_w[b][r].x;
      sums.y += recv_w[b][r].y;
    }
    const float m_gx = sums.x * rstd * inv_n, m_g = sums.y * inv_n;
    // dx = rstd (g w - xh m_gx - m_g) = g (rstd w) + (x - mean) A + B, A = -rstd^2 m_gx,
    // B = -rstd m_g: four FP operations per element instead of six, rstd w from w_slice.
    const float cA = -(rstd * rstd) * m_gx, cB = -rstd * m_g;
    T* dr = static_cast<T*>(a.y) + row * a.y_pitch + base;
#pragma unroll 2
    for (int v = tid; v < nv; v += kGnBwdBlock) {
      PFrag<T, VEC> xf, gf;
      xf.load(xs + v * VEC, VEC);
      gf.load(gs + v * VEC, VEC);
      const uint32_t e = static_cast<uint32_t>(base + v * VEC);
      const int ch = channel_of(e);
      const float rw = w_slice[ch - ch_lo];
      Frag<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        o.v[j] = from_f32<T>(fmaf(gf.at(j), rw, fmaf(xf.at(j) - mean, cA, cB)));
      store_frag_global<VEC>(dr + v * VEC, o);
    }
    if (rank == 0) {
      // The per-(n, c) dw/db partials: channel c's partials from the ranks whose slices touch
      // it, in rank order (after the dx stores: off the other ranks' path).
      for (int c = tid; c < cpg; c += kGnBwdBlock) {
        float2 t = make_float2(0.f, 0.f);
#pragma unroll
        for (int r = 0; r < kGnBwdClusterMax; ++r) {
          const int2 rc = rank_ch[r];  // (0, 0) past csize
          const int i = c - rc.x;
          if (i >= 0 && i < rc.y) {
            const float2 p = recv_at(b, r)[i];
            t.x += p.x;
            t.y += p.y;
          }
        }
        ch_ws[row * cpg + c] = t.x * rstd;
        ch_ws[nc + row * cpg + c] = t.y;
      }
    }
    __syncthreads();  // every thread is done with stage s, w_slice and recv[b]: refill them
    if (tid == 0) {
      issue(k + stages, s);
      if (k + 2 < mine) mbar_arrive_expect_tx(&recv_bar[b], recv_bytes);
    }
    if (++s == stages) {
      s = 0;
      s_parity ^= 1u;
    }
  }
  // Every push into this CTA has landed (its bytes were waited for); no CTA leaves while its
  // own pushes may be in flight. Relaxed: nothing is published through this barrier.
  cluster_arrive_relaxed();
  cluster_wait();
}

// Launches the staged GroupNorm backward when it applies (16-byte aligned, hw % VEC == 0, rows
// of >= kGnStagedMinCols, cpg <= kGnBwdMaxCpg, <= kGnBwdMaxSliceCh channels per slice); writes
// dx and ch_ws[2][nc] (the per-(n, c) dw and db partials). false otherwise (nothing launched).
template <class T>
bool launch_gn_bwd_staged(const NormArgs& a, bool vec_ok, float* ch_ws, int64_t nc,
                          cudaStream_t stream) {
  constexpr int64_t kVec = kVec16<T>;
  if (!vec_ok || a.rows < 1 || a.cols < kGnStagedMinCols || a.hw % kVec != 0 ||
      a.cpg > kGnBwdMaxCpg || a.cols >= (int64_t{1} << 30))
    return false;
  // TESSEL_NORM_GN_BWD_SLICE_KB=n (4 ... 64) and TESSEL_NORM_GN_BWD_STAGES=s (2 ... 4): A/B of
  // the slice target (clusters of up to 16 below 16 KB at 32x512x64x64) and the ring depth.
  static const int64_t target =
      env_kb_bytes("TESSEL_NORM_GN_BWD_SLICE_KB", 4, 64, kGnBwdSliceTarget);
  static const int stages = [] {
    const char* e = std::getenv("TESSEL_NORM_GN_BWD_STAGES");
    const int v = e ? std::atoi(e) : 0;
    return v >= 2 && v <= kGnBwdMaxStages ? v : kGnBwdStages;
  }();
  const int64_t row_bytes = a.cols * int64_t{sizeof(T)};
  const int64_t cmax = target < kGnBwdSliceTarget ? kGnBwdClusterMax : kFwdClusterMax;
  const int64_t csize =
      std::min<int64_t>(cmax, std::max<int64_t>(1, (row_bytes + target - 1) / target));
  const int64_t chunk = ((a.cols + csize - 1) / csize + kVec - 1) / kVec * kVec;
  // A slice of `chunk` elements touches at most chunk / hw + 2 channels.
  if (chunk / a.hw + 2 > kGnBwdMaxSliceCh) return false;
  const int64_t smem = stages * 2 * chunk * int64_t{sizeof(T)} +
                       2 * csize * kGnBwdMaxSliceCh * int64_t{sizeof(float2)};
  if (smem > kFwdSliceMax) return false;
  auto kernel = gn_bwd_staged_kernel<T>;
  if (csize > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // One resident wave of clusters, each looping over rows.
  const int64_t resident =
      max_active_clusters(kernel, kGnBwdBlock, static_cast<size_t>(smem), static_cast<int>(csize));
  if (resident < 1) return false;
  const int64_t clusters = std::min<int64_t>(resident, a.rows);
  if (detail::launch_cluster(kernel, dim3(static_cast<unsigned>(clusters * csize)),
                             dim3(kGnBwdBlock), static_cast<size_t>(smem), static_cast<int>(csize),
                             stream, a, static_cast<int>(chunk), stages, ch_ws,
                             nc) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace tessel::norm
