// Small-M GEMM, bulk-copy ring kernel (see gemm_small_m_ring.hpp): D = alpha · A · Bᵀ + beta · C
// for B (N,K) and M <= 8, the decode GEMV of an LLM.
//
// Why: the register-streaming kernel (gemm_small_m.cu) keeps its weight bytes in flight in
// registers, 64 KB per SM at most; the H200 needs more per SM than the H100 (4.8 vs 3.35 TB/s
// over the same 132 SMs) and that kernel fell to 0.83 of copy there (cuBLAS 0.96). Here the
// TMA moves the weight into a ring of `stages` × 32 KB per SM without registers or load
// instructions, and warps specialize:
//
//   warp 8 (producer)     per stage: 16 weight rows × 1024 or 2048 k, one 2 or 4 KB bulk copy
//                         per row (rows padded by 64 bytes so the consumers' reads are
//                         conflict-free),
//                         L2 evict-first; never waits for the previous kernel (weights are not
//                         its output), so the ring fills during its tail. (Copies of 512 bytes
//                         — 64 rows × 256 k — ran at 1.57 TB/s on the H200 with 3, 4 or 5
// stages alike, 2 and 4 KB copies at ~3.6: the TMA's cost is per copy more than per
//                         byte. Tensor boxes of 128 rows x 64 k (16 KB, 128-byte swizzle,
//                         cuBLAS's nvjet shape) ran at 3.2 TB/s, slower with more stages.)
//   warps 9, 10 (A)       per stage: the activations' m × stage-k slice — bulk copies, or for
//                         the SwiGLU down projection (m <= 2 or 1) silu(gate) · up computed
//                         into the ring.
//   warps 0-7 (MMA)       warp w: the 16 rows × the w-th eighth of each stage's k, mma.sync
//                         m16n8k16 with the operand roles of gemm_small_m.cu (weight = A
//                         operand, tokens = B operand) and its k permutation.
//
// Work split: the stages of all column slabs (16 rows × all of K) in slab-major order are cut
// into `grid` contiguous runs, one per CTA (persistent, no tail wave): whole slabs where that
// balances (small_m_ring_slab_runs), else equal runs of stages. A slab that one
// CTA covers is written directly; a slab cut between CTAs leaves fp32 partials and the last CTA
// to finish it (atomic ticket) sums them in CTA order, so results are deterministic. (The cut
// slabs' fence, ticket and partial loads kept CTAs ~3 us past their last stage on the H200.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "ops/bulk_copy.cuh"
#include "ops/gemm/gemm_small_m_common.cuh"
#include "ops/gemm/gemm_small_m_ring.hpp"
#include "runtime/launch.cuh"
#include "tile/tile.cuh"

namespace tessel::detail {
namespace {

using namespace small_m;

constexpr int kRows = 16;  // weight rows per stage: one MMA tile

constexpr int kTokens = kSmallMRingMaxM;  // the MMA's n: 8 tokens
constexpr int kMmaWarps = 8;
constexpr int kActWarps = 2;
constexpr int kProducerWarp = kMmaWarps;  // warp 8
constexpr int kThreads = (kMmaWarps + 1 + kActWarps) * 32;
constexpr int kRedFloats = kMmaWarps * kTokens * kRows;  // the warps' k-range sums of a slab
constexpr size_t kMaxSmem = 226 * 1024;                  // the opt-in 227 KB less the static s_last
// A quarter warp's 16-byte reads cover rows g, g+1 (64 bytes each): a 2112-byte pitch puts
// them on disjoint banks.
// A stage of k extent stage_k: 16 weight rows and m activation rows of this many bytes.
constexpr int pitch_of(int stage_k) { return stage_k * 2 + 64; }
static_assert(pitch_of(1024) % 128 == 64 && pitch_of(2048) % 128 == 64, "pitch: 64 mod 128");

size_t smem_bytes(int stages, int m, int stage_k) {
  return size_t(stages) * (kRows + m) * pitch_of(stage_k) + kRedFloats * sizeof(float) +
         2 * size_t(stages) * sizeof(uint64_t);
}

// The SwiGLU prologue's registers: 4 pieces of 8 k per A-warp lane and stage.
constexpr int kGatedPieces = 4;
constexpr int max_gated_m(int stage_k) { return kActWarps * 32 * kGatedPieces * 8 / stage_k; }

// The MMA warps' own barrier (named barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void mma_warps_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kMmaWarps * 32) : "memory");
}

template <class T, int kStageK>
__global__ void __launch_bounds__(kThreads, 1) small_m_ring_kernel(const SmallMRingParams p) {
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
  __shared__ unsigned s_last;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // full: the producer's expect-tx arrival + the A warps' (every lane when they store with
    // st.shared, lane 0 when they issue bulk copies); empty: one arrival per MMA warp.
    const unsigned a_arrivals = p.gated ? kActWarps * 32 : kActWarps;
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1 + a_arrivals);
      mbar_init(&empty[s], kMmaWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int ksn = (p.k + kStageK - 1) / kStageK;
  const int slabs = (p.n + kRows - 1) / kRows;
  const SmallMRingSplit split{int64_t{slabs} * ksn, ksn, static_cast<int>(gridDim.x),
                              p.slab_runs ? ksn : 1};
  const int64_t L0 = split.start(blockIdx.x);
  const int count = static_cast<int>(split.start(blockIdx.x + 1) - L0);
  const T* ga = static_cast<const T*>(p.a);

  if (warp == kProducerWarp) {
    const uint64_t policy = l2_evict_first_policy();
    const char* b = static_cast<const char*>(p.b);
    for (int i = 0; i < count; ++i) {
      const int s = i % S;
      if (i >= S) mbar_wait(&empty[s], ((i / S) + 1) & 1);
      const int64_t L = L0 + i;
      const int row0 = static_cast<int>(L / ksn) * kRows, k0 = static_cast<int>(L % ksn) * kStageK;
      const int kc = min(kStageK, p.k - k0), rows = min(kRows, p.n - row0);
      if (lane == 0) mbar_arrive_expect_tx(&full[s], uint32_t(rows) * kc * 2);
      __syncwarp();
      for (int r = lane; r < rows; r += 32)
        bulk_copy_g2s_hint(wring + size_t(s) * kStageWBytes + r * kPitch,
                           b + (int64_t{row0} + r) * p.ldb * 2 + int64_t{k0} * 2, kc * 2, &full[s],
                           policy);
    }
    return;
  }

  if (warp > kProducerWarp) {
    const int aw = warp - kProducerWarp - 1;
    tile::wait_prior_grid();  // A is the previous kernel's output
    if (!p.gated) {
      if (lane != 0) return;
      int tokens = 0;
      for (int tok = aw; tok < p.m; tok += kActWarps) ++tokens;
      for (int i = 0; i < count; ++i) {
        const int s = i % S;
        if (i >= S) mbar_wait(&empty[s], ((i / S) + 1) & 1);
        const int k0 = static_cast<int>((L0 + i) % ksn) * kStageK, kc = min(kStageK, p.k - k0);
        mbar_arrive_expect_tx(&full[s], uint32_t(tokens) * kc * 2);
        for (int tok = aw; tok < p.m; tok += kActWarps)
          bulk_copy_g2s(aring + size_t(s) * stage_a_bytes + tok * kPitch,
                        ga + int64_t{tok} * p.lda + k0, kc * 2, &full[s]);
      }
      return;
    }
    // SwiGLU: 16-byte pieces (8 k of one token) of gate and up, one stage ahead in registers
    // (L2: the previous kernel just wrote them), silu(g)·u rounded as tessel::swiglu rounds.
    constexpr int kPieces = kGatedPieces;
    uint4 gc[kPieces], uc[kPieces], gn[kPieces], un[kPieces];
    auto piece = [&](int q, int& tok, int& kk) {
      const int id = lane + 32 * aw + 32 * kActWarps * q;
      tok = id / (kStageK / 8);
      kk = (id % (kStageK / 8)) * 8;
    };
    auto load = [&](int i, uint4(&gv)[kPieces], uint4(&uv)[kPieces]) {
      const int k0 = static_cast<int>((L0 + i) % ksn) * kStageK, kc = min(kStageK, p.k - k0);
#pragma unroll
      for (int q = 0; q < kPieces; ++q) {
        int tok, kk;
        piece(q, tok, kk);
        gv[q] = uv[q] = make_uint4(0u, 0u, 0u, 0u);
        if (tok < p.m && kk < kc) {
          const T* src = ga + int64_t{tok} * p.lda + k0 + kk;
          gv[q] = __ldcg(reinterpret_cast<const uint4*>(src));
          uv[q] = __ldcg(reinterpret_cast<const uint4*>(src + p.k));
        }
      }
    };
    if (count > 0) load(0, gn, un);
    for (int i = 0; i < count; ++i) {
#pragma unroll
      for (int q = 0; q < kPieces; ++q) gc[q] = gn[q], uc[q] = un[q];
      if (i + 1 < count) load(i + 1, gn, un);
      const int s = i % S;
      if (i >= S) mbar_wait(&empty[s], ((i / S) + 1) & 1);
      const int k0 = static_cast<int>((L0 + i) % ksn) * kStageK, kc = min(kStageK, p.k - k0);
#pragma unroll
      for (int q = 0; q < kPieces; ++q) {
        int tok, kk;
        piece(q, tok, kk);
        if (tok < p.m && kk < kc)
          *reinterpret_cast<uint4*>(aring + size_t(s) * stage_a_bytes + tok * kPitch + kk * 2) =
              swiglu8<T>(gc[q], uc[q]);
      }
      mbar_arrive(&full[s]);
    }
    return;
  }

  // ---- MMA warps -------------------------------------------------------------------------
  tile::wait_prior_grid();  // before writing D / partials / tickets and reading C
  tile::allow_next_grid();
  const int g = lane >> 2, t = lane & 3;
  const int tid = threadIdx.x;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int seg_ks0 = 0;  // first stage (k index) of the current slab segment
  for (int i = 0; i < count; ++i) {
    const int s = i % S;
    const int64_t L = L0 + i;
    const int64_t slab = L / ksn;
    const int ks = static_cast<int>(L % ksn);
    const int kc = min(kStageK, p.k - ks * kStageK);
    if (i == 0 || ks == 0) seg_ks0 = ks;
    mbar_wait(&full[s], (i / S) & 1);
    const unsigned char* wrow = wring + size_t(s) * kStageWBytes + g * kPitch;
    const unsigned char* arow = aring + size_t(s) * stage_a_bytes + g * kPitch;
#pragma unroll
    for (int u = 0; u < kWarpK / 32; ++u) {
      const int kk = warp * kWarpK + u * 32 + 8 * t;
      uint4 w0 = make_uint4(0u, 0u, 0u, 0u), w1 = w0, x = w0;
      if (kk < kc) {  // past K the ring holds stale bytes: zero both operands
        w0 = *reinterpret_cast<const uint4*>(wrow + kk * 2);
        w1 = *reinterpret_cast<const uint4*>(wrow + 8 * kPitch + kk * 2);
        if (g < p.m) x = *reinterpret_cast<const uint4*>(arow + kk * 2);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
        Mma<T>::run(acc, word(w0, 2 * h), word(w1, 2 * h), word(w0, 2 * h + 1), word(w1, 2 * h + 1),
                    word(x, 2 * h), word(x, 2 * h + 1));
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (ks != ksn - 1 && i != count - 1) continue;

    // End of this CTA's segment of `slab`: sum the warps' k ranges in warp order, write or
    // leave a partial.
    {
      float* r = red + warp * kTokens * kRows;
      r[(2 * t) * kRows + g] = acc[0];
      r[(2 * t + 1) * kRows + g] = acc[1];
      r[(2 * t) * kRows + g + 8] = acc[2];
      r[(2 * t + 1) * kRows + g + 8] = acc[3];
      acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    }
    mma_warps_sync();
    const int row0 = static_cast<int>(slab) * kRows;
    const bool whole = seg_ks0 == 0 && ks == ksn - 1;
    const int slot = split.slot(blockIdx.x, slab);
    for (int e = tid; e < p.m * kRows; e += kMmaWarps * 32) {
      const int tok = e / kRows, rl = e % kRows, n = row0 + rl;
      if (n >= p.n) continue;
      float v = 0.f;
      for (int w = 0; w < kMmaWarps; ++w) v += red[(w * kTokens + tok) * kRows + rl];
      if (whole)
        epilogue(p, tok, n, v);
      else
        p.partials[((int64_t{blockIdx.x} * 2 + slot) * p.m + tok) * kRows + rl] = v;
    }
    if (!whole) {
      __threadfence();
      mma_warps_sync();
      const int c_first = split.cta_of(slab * ksn), c_last = split.cta_of(slab * ksn + ksn - 1);
      if (tid == 0) s_last = atomicAdd(&p.tickets[slab], 1u) == unsigned(c_last - c_first);
      mma_warps_sync();
      if (s_last) {
        __threadfence();
        for (int e = tid; e < p.m * kRows; e += kMmaWarps * 32) {
          const int tok = e / kRows, rl = e % kRows, n = row0 + rl;
          if (n >= p.n) continue;
          float v = 0.f;
          for (int c = c_first; c <= c_last; ++c)
            v += __ldcg(
                &p.partials[((int64_t{c} * 2 + split.slot(c, slab)) * p.m + tok) * kRows + rl]);
          epilogue(p, tok, n, v);
        }
        if (tid == 0) p.tickets[slab] = 0;  // zero again for the next launch
      }
    }
    mma_warps_sync();  // red and s_last are reused by the next segment
  }
}

template <class T, int kStageK>
cudaError_t launch_t(const SmallMRingParams& p, int grid, cudaStream_t stream) {
  auto kernel = small_m_ring_kernel<T, kStageK>;
  if (cudaError_t e = opt_in_shared_memory(kernel, static_cast<int>(kMaxSmem)); e != cudaSuccess)
    return e;
  return launch_dependent(kernel, dim3(grid), dim3(kThreads), smem_bytes(p.stages, p.m, kStageK),
                          stream, p);
}

}  // namespace

int small_m_ring_slabs(int n) { return (n + kRows - 1) / kRows; }

namespace {
// CTAs for runs of whole slabs, 0 where the even stage split is kept: all SMs when the busiest
// CTA gets at most ~10 % more than an even share; else the fewest CTAs whose busiest has no
// more slabs than on all SMs (192 slabs: 96 CTAs of 2, not 132 of 1-2) if that keeps >= 60 % of
// the SMs streaming.
int slab_grid(int n, int sms) {
  static const bool on = [] {
    const char* v = std::getenv("TESSEL_GEMM_SMALL_M_RING_SLABS");
    return v == nullptr || v[0] != '0';
  }();
  if (!on) return 0;
  const int64_t slabs = small_m_ring_slabs(n);
  const int64_t most = (slabs + sms - 1) / sms;  // slabs of the busiest CTA
  if (slabs * 10 >= int64_t{sms} * most * 9) return static_cast<int>(std::min<int64_t>(sms, slabs));
  const int64_t fewer = (slabs + most - 1) / most;
  return fewer * 10 >= int64_t{sms} * 6 ? static_cast<int>(fewer) : 0;
}
}  // namespace

bool small_m_ring_slab_runs(int n, int sms) { return slab_grid(n, sms) > 0; }

int small_m_ring_grid(int n, int k, int stage_k, int sms) {
  if (const int g = slab_grid(n, sms); g > 0) return g;
  const int64_t total = int64_t{small_m_ring_slabs(n)} * ((k + stage_k - 1) / stage_k);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(sms, total)));
}

int small_m_ring_max_stages(int m, int stage_k) {
  int s = 1;
  while (smem_bytes(s + 1, m, stage_k) <= kMaxSmem) ++s;
  return s;
}

int small_m_ring_max_gated_m(int stage_k) { return max_gated_m(stage_k); }

size_t small_m_ring_partial_bytes(int m, int grid) {
  return size_t(grid) * 2 * m * kRows * sizeof(float);
}

cudaError_t small_m_ring_launch(const SmallMRingParams& p, int grid, bool bf16,
                                cudaStream_t stream) {
  if ((p.stage_k != 1024 && p.stage_k != 2048) || p.m < 1 || p.m > kSmallMRingMaxM ||
      (p.gated && p.m > max_gated_m(p.stage_k)) || p.stages < 1 ||
      smem_bytes(p.stages, p.m, p.stage_k) > kMaxSmem)
    return cudaErrorInvalidValue;
  if (p.stage_k == 1024)
    return bf16 ? launch_t<__nv_bfloat16, 1024>(p, grid, stream)
                : launch_t<__half, 1024>(p, grid, stream);
  return bf16 ? launch_t<__nv_bfloat16, 2048>(p, grid, stream)
              : launch_t<__half, 2048>(p, grid, stream);
}

}  // namespace tessel::detail
