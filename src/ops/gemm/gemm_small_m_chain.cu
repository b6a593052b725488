// Small-M GEMM chains (see gemm_small_m_ring.hpp, "chains"): a decode layer's dependent GEMMs
// (o projection + residual, RMSNorm + gate|up, SwiGLU + down + residual, the next layer's
// RMSNorm + qkv) in one launch of the bulk-copy ring kernel's shape.
//
// Why: at batch 1 every kernel boundary costs the weight stream a ramp and a tail. Under
// dependent launch the next ring GEMM's CTA becomes resident only when the previous one's has
// left its SM (~110 registers x 352 threads each), so its first stage lands ~2.5-3.5 µs later
// (H200, session 13's timestamps), and the busiest CTA of each GEMM sets when the next can
// start on all SMs. Here the producer warp walks all phases' weights in one sequence through
// the same ring, so while the MMA warps wait at a grid barrier for the previous phase's
// outputs, the ring already holds the next phase's first stages (6 x 33 KB per SM at M = 1:
// ~26 MB over 132 SMs, ~6 µs of the H200's bandwidth).
//
// Roles as in gemm_small_m_ring.cu (warps 0-7 MMA, warp 8 producer, warps 9-10 activations),
// one CTA per SM (the grid barriers need every CTA resident: the launch's grid is at most the
// SM count and the ring takes more than half an SM's shared memory). Every phase uses
// whole-slab runs (SmallMRingSplit with unit = ksn), so no partials or tickets. Between phases
// the A warps and the MMA warps wait for all CTAs' arrivals on a global counter (release /
// acquire at gpu scope); C (the residual, written by another CTA in an earlier phase) and the
// fused norm's rows are read through L2 (__ldcg), never from a possibly stale L1 line.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/bulk_copy.cuh"
#include "ops/gemm/gemm_small_m_common.cuh"
#include "ops/gemm/gemm_small_m_ring.hpp"
#include "runtime/launch.cuh"
#include "tile/tile.cuh"

namespace tessel::detail {
namespace {

using namespace small_m;

constexpr int kRows = 16;
constexpr int kMmaWarps = 8;
constexpr int kActWarps = 2;
constexpr int kProducerWarp = kMmaWarps;
constexpr int kThreads = (kMmaWarps + 1 + kActWarps) * 32;
// 64 mod 128 bytes: conflict-free 16-byte reads.
constexpr int pitch_of(int stage_k) { return stage_k * 2 + 64; }
constexpr int kRedFloats = kMmaWarps * 8 * kRows;
constexpr size_t kMaxSmem = 226 * 1024;
constexpr int kPieces = 4;  // 16-byte pieces per A lane and stage (SwiGLU / RMSNorm staging)
// Tokens the A warps stage per stage of stage_k (2 at 1024 k, 1 at 2048 k).
constexpr int max_m_of(int stage_k) { return kActWarps * 32 * kPieces * 8 / stage_k; }
static_assert(max_m_of(1024) == kSmallMChainMaxM, "A staging covers m");

size_t smem_bytes(int stages, int m, int stage_k) {
  return size_t(stages) * (kRows + m) * pitch_of(stage_k) + kRedFloats * sizeof(float) +
         2 * size_t(stages) * sizeof(uint64_t);
}

__device__ __forceinline__ void mma_warps_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kMmaWarps * 32) : "memory");
}
// MMA warps + A warps: named barrier 3 releases the A warps into the next phase once MMA
// thread 0 has seen the grid barrier complete.
// (A first version let the A warps poll the counter themselves, from the moment they had
// staged a phase, i.e. for most of every phase: docs/engine_gpu.md, session 24.)
constexpr int kTailThreads = (kMmaWarps + kActWarps) * 32;

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Grid barrier on a counter that is never reset: every launch adds exactly kBarrierSpan to it
// (CTA 0 adds kBarrierSpan - (ctas - 1), the others 1), so the value before a CTA's own
// addition lies in the launch's window [j·span, (j+1)·span) and the barrier is complete at
// (j+1)·span. (Launches on one stream do not overlap here: each waits for its predecessor's
// completion before its first arrival.) A reset by the last CTA out — an atomic ticket at
// every CTA's exit — made a one-phase chain ~11 % slower than the single ring launch (H200).
constexpr unsigned kBarrierSpan = 1024;  // > any grid
// One thread, after the CTA's stores of the phase (ordered before it by a CTA barrier):
// returns the counter value at which the barrier is complete.
__device__ __forceinline__ unsigned grid_arrive(unsigned* ctr, unsigned ctas) {
  const unsigned add = blockIdx.x == 0 ? kBarrierSpan - (ctas - 1) : 1u;
  __threadfence();
  unsigned old;
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(ctr), "r"(add)
               : "memory");
  return (old / kBarrierSpan + 1) * kBarrierSpan;
}
// The same thread: wait until the counter reaches `target` (wrap-around safe).
__device__ __forceinline__ void grid_wait(const unsigned* ctr, unsigned target) {
  while (static_cast<int>(load_acquire(ctr) - target) < 0) __nanosleep(64);
}

// This CTA's run of a phase: whole slabs of 16 rows x ksn stages.
struct Run {
  int64_t first;
  int count;
  int ksn;
};
template <int kStageK>
__device__ __forceinline__ Run run_of(const SmallMChainPhase& ph) {
  Run r{0, 0, (ph.k + kStageK - 1) / kStageK};
  if (static_cast<int>(blockIdx.x) >= ph.grid) return r;
  const int slabs = (ph.n + kRows - 1) / kRows;
  const SmallMRingSplit split{int64_t{slabs} * r.ksn, r.ksn, ph.grid, r.ksn};
  r.first = split.start(blockIdx.x);
  r.count = static_cast<int>(split.start(blockIdx.x + 1) - r.first);
  return r;
}

template <class T>
__device__ __forceinline__ void store_result(const SmallMChainPhase& ph, int tok, int n, float v) {
  float r = ph.alpha * v;
  const int64_t ic = int64_t{tok} * ph.ldc + n;
  if (ph.c != nullptr) {  // through L2: another CTA may have written it in an earlier phase
    float c;
    if (ph.out == 0)
      c = __ldcg(static_cast<const float*>(ph.c) + ic);
    else if (ph.out == 1)
      c = __half2float(__ldcg(static_cast<const __half*>(ph.c) + ic));
    else
      c = __bfloat162float(__ldcg(static_cast<const __nv_bfloat16*>(ph.c) + ic));
    r += ph.beta * c;
  }
  store_out(ph, int64_t{tok} * ph.ldd + n, r);
}

template <class T, int kStageK>
__global__ void __launch_bounds__(kThreads, 1)
    small_m_chain_kernel(const __grid_constant__ SmallMChainParams p) {
  constexpr int kPitch = pitch_of(kStageK);
  constexpr int kStageWBytes = kRows * kPitch;
  constexpr int kWarpK = kStageK / kMmaWarps;  // each MMA warp's k range in a stage
  extern __shared__ __align__(128) unsigned char smem[];
  const int S = p.stages;
  const int stage_a_bytes = p.m * kPitch;
  unsigned char* wring = smem;
  unsigned char* aring = smem + size_t(S) * kStageWBytes;
  float* red = reinterpret_cast<float*>(aring + size_t(S) * stage_a_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(red + kRedFloats);
  uint64_t* empty = full + S;
  const unsigned ctas = gridDim.x;  // <= kBarrierSpan (host: grid <= SMs)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // full: the producer's expect-tx arrival + every A-warp lane (whatever the phase's
    // staging); empty: one arrival per MMA warp.
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1 + kActWarps * 32);
      mbar_init(&empty[s], kMmaWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kProducerWarp) {
    const uint64_t policy = l2_evict_first_policy();
    int g = 0;  // ring position, continued across phases
    for (int f = 0; f < p.phases; ++f) {
      const SmallMChainPhase& ph = p.ph[f];
      const Run run = run_of<kStageK>(ph);
      const char* b = static_cast<const char*>(ph.b);
      for (int i = 0; i < run.count; ++i, ++g) {
        const int s = g % S;
        if (g >= S) mbar_wait(&empty[s], ((g / S) + 1) & 1);
        const int64_t L = run.first + i;
        const int row0 = static_cast<int>(L / run.ksn) * kRows;
        const int k0 = static_cast<int>(L % run.ksn) * kStageK;
        const int kc = min(kStageK, ph.k - k0), rows = min(kRows, ph.n - row0);
        if (lane == 0) mbar_arrive_expect_tx(&full[s], uint32_t(rows) * kc * 2);
        __syncwarp();
        if (lane < rows)
          bulk_copy_g2s_hint(wring + size_t(s) * kStageWBytes + lane * kPitch,
                             b + (int64_t{row0} + lane) * ph.ldb * 2 + int64_t{k0} * 2, kc * 2,
                             &full[s], policy);
      }
    }
    return;
  }

  if (warp > kProducerWarp) {
    const int aw = warp - kProducerWarp - 1;
    tile::wait_prior_grid();  // phase 0's A is the previous kernel's output
    int g = 0;
    for (int f = 0; f < p.phases; ++f) {
      const SmallMChainPhase& ph = p.ph[f];
      if (f > 0) {  // phase f - 1's outputs, from every CTA: MMA thread 0 saw them arrive
        asm volatile("bar.sync 3, %0;" ::"n"(kTailThreads) : "memory");
        asm volatile("fence.proxy.async.global;" ::: "memory");  // before bulk copies of them
      }
      const Run run = run_of<kStageK>(ph);
      const T* ga = static_cast<const T*>(ph.a);
      // K <= one stage: every stage of the phase takes the same A slice, so a slot keeps the
      // slice written at its first use in the phase (the producer only writes weight rows).
      const bool constant_a = run.ksn == 1;
      if (!ph.gated && !ph.rms) {
        // Bulk copies of this warp's tokens (lane 0); every lane arrives.
        for (int i = 0; i < run.count; ++i, ++g) {
          const int s = g % S;
          if (g >= S) mbar_wait(&empty[s], ((g / S) + 1) & 1);
          const int k0 = static_cast<int>((run.first + i) % run.ksn) * kStageK;
          const int kc = min(kStageK, ph.k - k0);
          const int tokens = aw < p.m && (!constant_a || i < S) ? 1 : 0;
          if (lane == 0) {
            mbar_arrive_expect_tx(&full[s], uint32_t(tokens) * kc * 2);
            if (tokens)
              bulk_copy_g2s(aring + size_t(s) * stage_a_bytes + aw * kPitch,
                            ga + int64_t{aw} * ph.lda + k0, kc * 2, &full[s]);
          } else {
            mbar_arrive(&full[s]);
          }
        }
        continue;
      }
      // SwiGLU (silu(gate)·up) or RMSNorm (a · norm weight) pieces, one stage ahead in
      // registers, rounded as gemm_small_m_ring.cu rounds them.
      uint4 gc[kPieces], uc[kPieces], gn[kPieces], un[kPieces];
      const T* nw = static_cast<const T*>(ph.norm_w);
      auto piece = [&](int q, int& tok, int& kk) {
        const int id = lane + 32 * aw + 32 * kActWarps * q;
        tok = id / (kStageK / 8);
        kk = (id % (kStageK / 8)) * 8;
      };
      auto load = [&](int i, uint4(&gv)[kPieces], uint4(&uv)[kPieces]) {
        const int k0 = static_cast<int>((run.first + i) % run.ksn) * kStageK;
        const int kc = min(kStageK, ph.k - k0);
#pragma unroll
        for (int q = 0; q < kPieces; ++q) {
          int tok, kk;
          piece(q, tok, kk);
          gv[q] = uv[q] = make_uint4(0u, 0u, 0u, 0u);
          if (tok < p.m && kk < kc) {
            const T* src = ga + int64_t{tok} * ph.lda + k0 + kk;
            gv[q] = __ldcg(reinterpret_cast<const uint4*>(src));
            uv[q] = ph.rms ? __ldg(reinterpret_cast<const uint4*>(nw + k0 + kk))
                           : __ldcg(reinterpret_cast<const uint4*>(src + ph.k));
          }
        }
      };
      if (run.count > 0) load(0, gn, un);
      for (int i = 0; i < run.count; ++i, ++g) {
        if (!constant_a || i == 0) {
#pragma unroll
          for (int q = 0; q < kPieces; ++q) gc[q] = gn[q], uc[q] = un[q];
          if (!constant_a && i + 1 < run.count) load(i + 1, gn, un);
        }
        const int s = g % S;
        if (g >= S) mbar_wait(&empty[s], ((g / S) + 1) & 1);
        const int k0 = static_cast<int>((run.first + i) % run.ksn) * kStageK;
        const int kc = min(kStageK, ph.k - k0);
        if (!constant_a || i < S) {
#pragma unroll
          for (int q = 0; q < kPieces; ++q) {
            int tok, kk;
            piece(q, tok, kk);
            if (tok < p.m && kk < kc)
              *reinterpret_cast<uint4*>(aring + size_t(s) * stage_a_bytes + tok * kPitch +
                                        kk * 2) =
                  ph.rms ? mul8<T>(gc[q], uc[q]) : swiglu8<T>(gc[q], uc[q]);
          }
        }
        mbar_arrive(&full[s]);
      }
    }
    return;
  }

  // ---- MMA warps -------------------------------------------------------------------------
  tile::wait_prior_grid();  // before reading C / the norm rows and writing D
  tile::allow_next_grid();
  __shared__ float s_rstd[kSmallMChainMaxM];
  const int g8 = lane >> 2, t = lane & 3;
  const int tid = threadIdx.x;
  int g = 0;
  unsigned target = 0;  // (thread 0) where the last arrival's barrier completes
  for (int f = 0; f < p.phases; ++f) {
    const SmallMChainPhase& ph = p.ph[f];
    if (f > 0) {  // one poller per CTA; the A warps wait on named barrier 3, not on memory
      if (tid == 0) grid_wait(&p.sync[f - 1], target);
      asm volatile("bar.sync 3, %0;" ::"n"(kTailThreads) : "memory");
    }
    const T* ga = static_cast<const T*>(ph.a);
    if (ph.rms)
      row_rstd<T, kMmaWarps, 4>(ga, ph.lda, p.m, ph.k, ph.rms_eps, warp, lane, red, s_rstd,
                                [] { mma_warps_sync(); });
    const Run run = run_of<kStageK>(ph);
    float acc[4] = {};
    for (int i = 0; i < run.count; ++i, ++g) {
      const int s = g % S;
      const int64_t L = run.first + i;
      const int ks = static_cast<int>(L % run.ksn);
      const int kc = min(kStageK, ph.k - ks * kStageK);
      mbar_wait(&full[s], (g / S) & 1);
      const unsigned char* wrow = wring + size_t(s) * kStageWBytes + g8 * kPitch;
      const unsigned char* arow = aring + size_t(s) * stage_a_bytes + g8 * kPitch;
#pragma unroll
      for (int u = 0; u < kWarpK / 32; ++u) {
        const int kk = warp * kWarpK + u * 32 + 8 * t;
        uint4 w0 = make_uint4(0u, 0u, 0u, 0u), w1 = w0, x = w0;
        if (kk < kc) {  // past K the ring holds stale bytes: zero both operands
          w0 = *reinterpret_cast<const uint4*>(wrow + kk * 2);
          w1 = *reinterpret_cast<const uint4*>(wrow + 8 * kPitch + kk * 2);
          if (g8 < p.m) x = *reinterpret_cast<const uint4*>(arow + kk * 2);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
          Mma<T>::run(acc, word(w0, 2 * h), word(w1, 2 * h), word(w0, 2 * h + 1),
                      word(w1, 2 * h + 1), word(x, 2 * h), word(x, 2 * h + 1));
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if (ks != run.ksn - 1) continue;

      // The slab is complete: sum the warps' k parts in warp order (as the ring kernel).
      {
        float* r = red + warp * 8 * kRows;
        r[(2 * t) * kRows + g8] = acc[0];
        r[(2 * t + 1) * kRows + g8] = acc[1];
        r[(2 * t) * kRows + g8 + 8] = acc[2];
        r[(2 * t + 1) * kRows + g8 + 8] = acc[3];
        acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
      }
      mma_warps_sync();
      const int row0 = static_cast<int>(L / run.ksn) * kRows;
      if (tid < p.m * kRows) {
        const int tok = tid / kRows, r = tid % kRows, n = row0 + r;
        if (n < ph.n) {
          float v = 0.f;
          for (int q = 0; q < kMmaWarps; ++q) v += red[(q * 8 + tok) * kRows + r];
          store_result<T>(ph, tok, n, ph.rms ? v * s_rstd[tok] : v);
        }
      }
      mma_warps_sync();  // red is reused by the next slab
    }
    if (f + 1 < p.phases) {
      mma_warps_sync();  // every MMA warp's stores of this phase precede the arrival
      if (tid == 0) target = grid_arrive(&p.sync[f], ctas);
    }
  }
}

template <class T, int kStageK>
cudaError_t launch_t(const SmallMChainParams& p, int grid, cudaStream_t stream) {
  auto kernel = small_m_chain_kernel<T, kStageK>;
  if (cudaError_t e = opt_in_shared_memory(kernel, static_cast<int>(kMaxSmem)); e != cudaSuccess)
    return e;
  return launch_dependent(kernel, dim3(grid), dim3(kThreads), smem_bytes(p.stages, p.m, kStageK),
                          stream, p);
}

}  // namespace

int small_m_chain_stage_k(int m) { return m == 1 ? 2048 : 1024; }

int small_m_chain_stages(int m) {
  int s = 0;
  while (smem_bytes(s + 1, m, small_m_chain_stage_k(m)) <= kMaxSmem) ++s;
  return s;
}

cudaError_t small_m_chain_launch(const SmallMChainParams& p, int grid, bool bf16,
                                 cudaStream_t stream) {
  if (p.m < 1 || p.m > kSmallMChainMaxM || p.phases < 1 || p.phases > kSmallMChainMaxPhases ||
      p.stages < 1 || smem_bytes(p.stages, p.m, small_m_chain_stage_k(p.m)) > kMaxSmem ||
      p.sync == nullptr || grid < 1 || grid > static_cast<int>(kBarrierSpan))
    return cudaErrorInvalidValue;
  for (int f = 0; f < p.phases; ++f)
    if (p.ph[f].grid < 1 || p.ph[f].grid > grid || (p.ph[f].gated && p.ph[f].rms))
      return cudaErrorInvalidValue;
  if (small_m_chain_stage_k(p.m) == 2048)
    return bf16 ? launch_t<__nv_bfloat16, 2048>(p, grid, stream)
                : launch_t<__half, 2048>(p, grid, stream);
  return bf16 ? launch_t<__nv_bfloat16, 1024>(p, grid, stream)
              : launch_t<__half, 1024>(p, grid, stream);
}

}  // namespace tessel::detail
