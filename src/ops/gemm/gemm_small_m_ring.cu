// Small-M GEMM, bulk-copy ring kernel (see gemm_small_m_ring.hpp): D = alpha · A · Bᵀ + beta · C
// for B (N,K) and M <= 32, the decode GEMV of an LLM.
//
// Why: the register-streaming kernel (gemm_small_m.cu) keeps its weight bytes in flight in
// registers, 64 KB per SM at most; the H200 needs more per SM than the H100 (4.8 vs 3.35 TB/s
// over the same 132 SMs) and that kernel fell to 0.83 of copy there (cuBLAS 0.96). Here the
// TMA moves the weight into a ring of `stages` × 32 KB per SM without registers or load
// instructions, and warps specialize:
//
//   warp 8 (producer)     per stage: 16 · row_groups weight rows × 1024 or 2048 k, one
//                         bulk copy per row (rows padded by 64 bytes so the consumers' reads
//                         are conflict-free),
//                         L2 evict-first; never waits for the previous kernel (weights are not
//                         its output), so the ring fills during its tail. (Copies of 512 bytes
//                         — 64 rows × 256 k — ran at 1.57 TB/s on the H200 with 3, 4 or 5
// stages alike, 2 and 4 KB copies at ~3.6: the TMA's cost is per copy more than per
//                         byte. Tensor boxes of 128 rows x 64 k (16 KB, 128-byte swizzle,
//                         cuBLAS's nvjet shape) ran at 3.2 TB/s, slower with more stages.)
//   warps 9, 10 (A)       per stage: the activations' m × stage-k slice — bulk copies, or for
//                         the SwiGLU down projection (m <= 2 or 1) silu(gate) · up computed
//                         into the ring, or for a fused RMSNorm (same m) a · norm weight.
//   warps 0-7 (MMA)       (gemm_small_m_rms: first the tokens' RMS scales, from A in L2)
//                         warp w: row group w % row_groups (16 rows) × the (w / row_groups)-th
//                         part of each stage's k, mma.sync m16n8k16 with the operand roles of
//                         gemm_small_m.cu (weight = A operand, tokens = B operand, one n-tile
//                         of 8 tokens per 8 of M) and its k permutation.
//
// M > 8: every slab re-reads the activations' m × K from L2, m/16 of the weight's bytes per
// row group, so 32-row stages (two row groups sharing one activation slice) halve that
// (H200, M = 16, 1×28672×4096: 73.0 µs with 16-row stages, 63.1 with 32, cuBLAS 62.6). With
// 512-k stages (1 KB copies; room for 64 rows or M = 32 at 32 rows) the copies' cost per copy
// won out (0.55-0.8x cuBLAS): not built. M = 17-32 only fits 16-row stages.
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

constexpr int kRows = 16;  // weight rows of one row group: one MMA tile

constexpr int kMmaWarps = 8;
constexpr int kActWarps = 2;
constexpr int kProducerWarp = kMmaWarps;  // warp 8
constexpr int kThreads = (kMmaWarps + 1 + kActWarps) * 32;
constexpr size_t kMaxSmem = 226 * 1024;  // the opt-in 227 KB less the static s_last, s_rstd
// n-tiles of 8 tokens for m tokens (1, 2 or 4).
constexpr int token_tiles(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : 4; }
// The warps' k-range sums of a slab: per warp, 8 · token_tiles tokens × 16 rows.
constexpr int red_floats(int m) { return kMmaWarps * 8 * token_tiles(m) * kRows; }
// A quarter warp's 16-byte reads cover rows g, g+1 (64 bytes each): a 2112-byte pitch puts
// them on disjoint banks.
// A stage of k extent stage_k: 16 weight rows and m activation rows of this many bytes.
constexpr int pitch_of(int stage_k) { return stage_k * 2 + 64; }
static_assert(pitch_of(1024) % 128 == 64 && pitch_of(2048) % 128 == 64, "pitch: 64 mod 128");

size_t smem_bytes(int stages, int m, int stage_k, int row_groups) {
  return size_t(stages) * (kRows * row_groups + m) * pitch_of(stage_k) +
         red_floats(m) * sizeof(float) + 2 * size_t(stages) * sizeof(uint64_t);
}

// The SwiGLU prologue's registers: 4 pieces of 8 k per A-warp lane and stage.
constexpr int kGatedPieces = 4;
constexpr int max_gated_m(int stage_k) { return kActWarps * 32 * kGatedPieces * 8 / stage_k; }

// The MMA warps' own barrier (named barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void mma_warps_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kMmaWarps * 32) : "memory");
}

template <class T, int kStageK, int kRG, int kNT>
__global__ void __launch_bounds__(kThreads, 1) small_m_ring_kernel(const SmallMRingParams p) {
  constexpr int kPitch = pitch_of(kStageK);
  constexpr int kSlabRows = kRows * kRG;  // weight rows per stage (a slab)
  constexpr int kStageWBytes = kSlabRows * kPitch;
  constexpr int kKParts = kMmaWarps / kRG;   // MMA warps per row group
  constexpr int kWarpK = kStageK / kKParts;  // each MMA warp's k range in a stage
  constexpr int kTokens = 8 * kNT;           // tokens of the MMA tiles
  constexpr int kRedFloats = kMmaWarps * kTokens * kRows;
  static_assert(kMmaWarps % kRG == 0 && kWarpK % 32 == 0, "stage shape");
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
    const unsigned a_arrivals = p.gated || p.rms ? kActWarps * 32 : kActWarps;
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1 + a_arrivals);
      mbar_init(&empty[s], kMmaWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int ksn = (p.k + kStageK - 1) / kStageK;
  const int slabs = (p.n + kSlabRows - 1) / kSlabRows;
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
      const int row0 = static_cast<int>(L / ksn) * kSlabRows;
      const int k0 = static_cast<int>(L % ksn) * kStageK;
      const int kc = min(kStageK, p.k - k0), rows = min(kSlabRows, p.n - row0);
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
    if (!p.gated && !p.rms) {
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
    // RMSNorm: pieces of a and of the norm weight, a·w rounded once (the row scale comes in
    // the epilogue).
    constexpr int kPieces = kGatedPieces;
    uint4 gc[kPieces], uc[kPieces], gn[kPieces], un[kPieces];
    const T* nw = static_cast<const T*>(p.norm_w);
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
          uv[q] = p.rms ? __ldg(reinterpret_cast<const uint4*>(nw + k0 + kk))
                        : __ldcg(reinterpret_cast<const uint4*>(src + p.k));
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
              p.rms ? mul8<T>(gc[q], uc[q]) : swiglu8<T>(gc[q], uc[q]);
      }
      mbar_arrive(&full[s]);
    }
    return;
  }

  // ---- MMA warps -------------------------------------------------------------------------
  tile::wait_prior_grid();  // before writing D / partials / tickets and reading C
  tile::allow_next_grid();
  // The fused RMSNorm's scales, before the first stage: the producer keeps filling the ring
  // meanwhile. `red` is free until the first slab's sums.
  __shared__ float s_rstd[kSmallMRingMaxM];
  if (p.rms) row_rstd<T, kMmaWarps, 4>(ga, p.lda, p.m, p.k, p.rms_eps, warp, lane, red, s_rstd,
                                    [] { mma_warps_sync(); });
  const int g = lane >> 2, t = lane & 3;
  const int tid = threadIdx.x;
  const int rg = warp % kRG, kp = warp / kRG;  // this warp's row group and k part
  float acc[kNT][4] = {};
  int seg_ks0 = 0;  // first stage (k index) of the current slab segment
  for (int i = 0; i < count; ++i) {
    const int s = i % S;
    const int64_t L = L0 + i;
    const int64_t slab = L / ksn;
    const int ks = static_cast<int>(L % ksn);
    const int kc = min(kStageK, p.k - ks * kStageK);
    if (i == 0 || ks == 0) seg_ks0 = ks;
    mbar_wait(&full[s], (i / S) & 1);
    const unsigned char* wrow = wring + size_t(s) * kStageWBytes + (rg * kRows + g) * kPitch;
    const unsigned char* arow = aring + size_t(s) * stage_a_bytes + g * kPitch;
#pragma unroll
    for (int u = 0; u < kWarpK / 32; ++u) {
      const int kk = kp * kWarpK + u * 32 + 8 * t;
      uint4 w0 = make_uint4(0u, 0u, 0u, 0u), w1 = w0, x[kNT];
#pragma unroll
      for (int j = 0; j < kNT; ++j) x[j] = w0;
      if (kk < kc) {  // past K the ring holds stale bytes: zero both operands
        w0 = *reinterpret_cast<const uint4*>(wrow + kk * 2);
        w1 = *reinterpret_cast<const uint4*>(wrow + 8 * kPitch + kk * 2);
#pragma unroll
        for (int j = 0; j < kNT; ++j)
          if (8 * j + g < p.m)
            x[j] = *reinterpret_cast<const uint4*>(arow + 8 * j * kPitch + kk * 2);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < kNT; ++j)
          Mma<T>::run(acc[j], word(w0, 2 * h), word(w1, 2 * h), word(w0, 2 * h + 1),
                      word(w1, 2 * h + 1), word(x[j], 2 * h), word(x[j], 2 * h + 1));
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (ks != ksn - 1 && i != count - 1) continue;

    // End of this CTA's segment of `slab`: sum each row group's k parts in warp order, write
    // or leave a partial.
    {
      float* r = red + warp * kTokens * kRows;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        r[(8 * j + 2 * t) * kRows + g] = acc[j][0];
        r[(8 * j + 2 * t + 1) * kRows + g] = acc[j][1];
        r[(8 * j + 2 * t) * kRows + g + 8] = acc[j][2];
        r[(8 * j + 2 * t + 1) * kRows + g + 8] = acc[j][3];
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
      }
    }
    mma_warps_sync();
    const int row0 = static_cast<int>(slab) * kSlabRows;
    const bool whole = seg_ks0 == 0 && ks == ksn - 1;
    const int slot = split.slot(blockIdx.x, slab);
    for (int e = tid; e < p.m * kSlabRows; e += kMmaWarps * 32) {
      const int tok = e / kSlabRows, r = e % kSlabRows, n = row0 + r;
      if (n >= p.n) continue;
      const int group = r / kRows, rl = r % kRows;
      float v = 0.f;
      for (int q = 0; q < kKParts; ++q) v += red[((q * kRG + group) * kTokens + tok) * kRows + rl];
      if (whole)
        epilogue(p, tok, n, p.rms ? v * s_rstd[tok] : v);
      else
        p.partials[((int64_t{blockIdx.x} * 2 + slot) * p.m + tok) * kSlabRows + r] = v;
    }
    if (!whole) {
      __threadfence();
      mma_warps_sync();
      const int c_first = split.cta_of(slab * ksn), c_last = split.cta_of(slab * ksn + ksn - 1);
      if (tid == 0) s_last = atomicAdd(&p.tickets[slab], 1u) == unsigned(c_last - c_first);
      mma_warps_sync();
      if (s_last) {
        __threadfence();
        for (int e = tid; e < p.m * kSlabRows; e += kMmaWarps * 32) {
          const int tok = e / kSlabRows, r = e % kSlabRows, n = row0 + r;
          if (n >= p.n) continue;
          float v = 0.f;
          for (int c = c_first; c <= c_last; ++c)
            v += __ldcg(
                &p.partials[((int64_t{c} * 2 + split.slot(c, slab)) * p.m + tok) * kSlabRows + r]);
          epilogue(p, tok, n, p.rms ? v * s_rstd[tok] : v);
        }
        if (tid == 0) p.tickets[slab] = 0;  // zero again for the next launch
      }
    }
    mma_warps_sync();  // red and s_last are reused by the next segment
  }
}

template <class T, int kStageK, int kRG, int kNT>
cudaError_t launch_t(const SmallMRingParams& p, int grid, cudaStream_t stream) {
  auto kernel = small_m_ring_kernel<T, kStageK, kRG, kNT>;
  if (cudaError_t e = opt_in_shared_memory(kernel, static_cast<int>(kMaxSmem)); e != cudaSuccess)
    return e;
  return launch_dependent(kernel, dim3(grid), dim3(kThreads),
                          smem_bytes(p.stages, p.m, kStageK, kRG), stream, p);
}

template <class T, int kStageK, int kRG>
cudaError_t launch_nt(const SmallMRingParams& p, int grid, cudaStream_t stream) {
  switch (token_tiles(p.m)) {
    case 1: return launch_t<T, kStageK, kRG, 1>(p, grid, stream);
    case 2: return launch_t<T, kStageK, kRG, 2>(p, grid, stream);
    default: return launch_t<T, kStageK, kRG, 4>(p, grid, stream);
  }
}

// The stage shapes built: {k per stage, row groups}, and the most tokens each is built for
// ({2048, 1} only for M <= 8: a 16-token slice of 2048 k leaves no room for two stages).
struct RingShape {
  int stage_k, row_groups, max_m;
};
constexpr RingShape kShapes[] = {{1024, 1, 32}, {2048, 1, 8}, {1024, 2, 32}};

template <class T>
cudaError_t launch_shape(const SmallMRingParams& p, int grid, cudaStream_t stream) {
  if (p.stage_k == 1024 && p.row_groups == 1) return launch_nt<T, 1024, 1>(p, grid, stream);
  if (p.stage_k == 1024 && p.row_groups == 2) return launch_nt<T, 1024, 2>(p, grid, stream);
  return launch_t<T, 2048, 1, 1>(p, grid, stream);
}

}  // namespace

int small_m_ring_slabs(int n, int row_groups) {
  const int rows = kRows * row_groups;
  return (n + rows - 1) / rows;
}

namespace {
// CTAs for runs of whole slabs, 0 where the even stage split is kept: all SMs when the busiest
// CTA gets at most ~10 % more than an even share; else the fewest CTAs whose busiest has no
// more slabs than on all SMs (192 slabs: 96 CTAs of 2, not 132 of 1-2) if that keeps >= 60 % of
// the SMs streaming.
int slab_grid(int n, int sms, int row_groups) {
  static const bool on = [] {
    const char* v = std::getenv("TESSEL_GEMM_SMALL_M_RING_SLABS");
    return v == nullptr || v[0] != '0';
  }();
  if (!on) return 0;
  const int64_t slabs = small_m_ring_slabs(n, row_groups);
  const int64_t most = (slabs + sms - 1) / sms;  // slabs of the busiest CTA
  if (slabs * 10 >= int64_t{sms} * most * 9) return static_cast<int>(std::min<int64_t>(sms, slabs));
  const int64_t fewer = (slabs + most - 1) / most;
  return fewer * 10 >= int64_t{sms} * 6 ? static_cast<int>(fewer) : 0;
}
}  // namespace

bool small_m_ring_slab_runs(int n, int sms, int row_groups) {
  return slab_grid(n, sms, row_groups) > 0;
}

int small_m_ring_grid(int n, int k, int stage_k, int sms, int row_groups) {
  if (const int g = slab_grid(n, sms, row_groups); g > 0) return g;
  const int64_t total = int64_t{small_m_ring_slabs(n, row_groups)} * ((k + stage_k - 1) / stage_k);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(sms, total)));
}

int small_m_ring_max_stages(int m, int stage_k, int row_groups) {
  int s = 0;
  while (smem_bytes(s + 1, m, stage_k, row_groups) <= kMaxSmem) ++s;
  return s;
}

bool small_m_ring_shape_supported(int m, int stage_k, int row_groups) {
  if (m < 1) return false;
  for (const RingShape& sh : kShapes)
    if (sh.stage_k == stage_k && sh.row_groups == row_groups) return m <= sh.max_m;
  return false;
}

int small_m_ring_max_gated_m(int stage_k) { return max_gated_m(stage_k); }

size_t small_m_ring_partial_bytes(int m, int grid, int row_groups) {
  return size_t(grid) * 2 * m * kRows * row_groups * sizeof(float);
}

cudaError_t small_m_ring_launch(const SmallMRingParams& p, int grid, bool bf16,
                                cudaStream_t stream) {
  if (!small_m_ring_shape_supported(p.m, p.stage_k, p.row_groups) ||
      ((p.gated || p.rms) && p.m > max_gated_m(p.stage_k)) || (p.gated && p.rms) ||
      p.stages < 1 ||
      smem_bytes(p.stages, p.m, p.stage_k, p.row_groups) > kMaxSmem)
    return cudaErrorInvalidValue;
  return bf16 ? launch_shape<__nv_bfloat16>(p, grid, stream)
              : launch_shape<__half>(p, grid, stream);
}

}  // namespace tessel::detail
