// Small-M GEMM (decode): a weight-streaming kernel on mma.sync m16n8k16 (see
// gemm_small_m.hpp for the contract).
//
// Roles are swapped: the weight B is the MMA's A operand (16 weight rows n × 16 k) and the
// activations A the MMA's B operand (16 k × 8 tokens), so D is computed as Dᵀ = B · Aᵀ in
// tiles of 16 n × 8 tokens; M <= 8, 16, 32 uses 1, 2, 4 token tiles.
//
// The k order inside a dot product is free, so each thread's 16-byte load of 8 consecutive
// k is used as-is: for k32 chunk c, thread (g = lane/4, t = lane%4) holds k = 32c + 8t … +7,
// mma sub-step s ∈ {0,1} takes its k = 8t + 4s + {0,1,2,3} as the MMA's logical k
// {2t, 2t+1, 2t+8, 2t+9}. The activations use the same permutation, so one 16-byte shared
// load of A[token][32c + 8t … +7] feeds both sub-steps.
//
//   B (N,K) "nk": warp tile 16 rows × 128 k per step; per thread rows g and g+8, 4 chunks:
//                8 × LDG.128 in flight (+8 prefetched for the next step).
//   B (K,N) "kn": warp tile 64 columns × 32 k per step; thread (g,t) loads rows k = 8t + i
//                (i < 8) at columns 8g … 8g+7; pairs of rows are interleaved with PRMT into
//                the (n, k-pair) registers the MMA wants (MMA row g ↔ column 8g + 2q, row
//                g + 8 ↔ column 8g + 2q + 1, q < 4). Same bytes per step, same MMA count.
//
// Block = 8 warps: WN warps along N × WK = 8/WN warps along K (interleaved steps). The
// block's slice of A (all tokens × its k range) is staged once in shared memory, chunk-major
// [chunk][token][32] so a warp's 16-byte reads of 8 tokens × 64 bytes are conflict-free.
// Split-K over gridDim.y; per-warp accumulators are summed in shared memory in warp order,
// then either written (alpha, beta·C, output dtype) or stored as fp32 partials
// [split][M][N]; the last block of a column slab (atomic ticket) sums the partials in split
// order → deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/gemm/gemm_small_m.hpp"
#include "ops/gemm/gemm_small_m_common.cuh"
#include "ops/gemm/gemm_small_m_ring.hpp"
#include "runtime/autotune.hpp"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "tile/tile.cuh"

namespace tessel::detail {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSmemA = 80 * 1024;  // staged A per block (2 blocks per SM)

struct Params {
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  const void* c;
  int64_t ldc;
  float alpha, beta;
  int m, n, k;
  int mtiles;           // ceil(m / 8): token tiles in use
  int wn, wk;           // warps along N and along K (wn * wk = 8)
  int splits;           // gridDim.y
  int steps_per_split;  // k steps per split
  int steps_per_phase;  // k steps whose A slice is staged in shared memory at once
  float* partials;      // [splits][m][n] (splits > 1)
  unsigned* tickets;    // [gridDim.x] (splits > 1), zero between launches
  int out;              // 0 f32, 1 f16, 2 bf16
  int gated;  // A = silu(a[:, :k]) * a[:, k:2k], computed while staging (SwiGLU MLP's down GEMM)
  int rms;    // A = a · norm_w (per k) staged, sums scaled by 1 / sqrt(mean_k a² + rms_eps) per
  float rms_eps;  // token: an RMSNorm fused in front (gemm_small_m_rms)
  const void* norm_w;
};

// Streaming 16-byte weight load (read once: no L1 allocation, 256-byte L2 prefetch).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

using namespace small_m;

template <bool KN>
struct Shape {
  static constexpr int kWarpN = KN ? 64 : 16;   // weight rows (nk) / columns (kn) per warp
  static constexpr int kStepK = KN ? 32 : 128;  // k per warp step
  static constexpr int kChunks = kStepK / 32;   // k32 chunks per step
};

// Weight registers of one warp step: 8 × 16 bytes per thread.
template <bool KN>
__device__ __forceinline__ void load_step(uint4 (&w)[8], const char* b, int64_t ldb_bytes, int n,
                                          int k, int n0, int step, int kend, int g, int t) {
  if constexpr (!KN) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int kk = step * 128 + u * 32 + 8 * t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = n0 + g + 8 * h;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row < n && kk < kend) v = ldg_stream(b + int64_t{row} * ldb_bytes + int64_t{kk} * 2);
        w[u * 2 + h] = v;
      }
    }
  } else {
    const int col = n0 + 8 * g;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int kk = step * 32 + 8 * t + i;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (col < n && kk < kend) v = ldg_stream(b + int64_t{kk} * ldb_bytes + int64_t{col} * 2);
      w[i] = v;
    }
  }
  (void)k;
}

// B (K,N) with 4 token tiles holds 64 accumulators per thread: one block per SM, with
// registers for the prefetch buffer; every other instance fits 2 blocks per SM.
template <bool KN, int MT>
constexpr int kMinBlocks = (KN && MT == 4) ? 1 : 2;

template <class T, bool KN, int MT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<KN, MT>) small_m_kernel(const Params p) {
  using S = Shape<KN>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int wn_i = warp % p.wn, wk_i = warp / p.wn;
  const int bn = S::kWarpN * p.wn;
  const int nb = blockIdx.x * bn;
  const int n0 = nb + wn_i * S::kWarpN;
  const int nsteps = (p.k + S::kStepK - 1) / S::kStepK;
  const int step0 = blockIdx.y * p.steps_per_split;
  const int step1 = min(step0 + p.steps_per_split, nsteps);
  const int kend = min(step1 * S::kStepK, p.k);
  const int tp = p.mtiles * 8;  // tokens staged (zero-padded past M)
  const char* bbytes = static_cast<const char*>(p.b);
  const int64_t ldb_bytes = p.ldb * 2;

  // Register double buffer (the next step's loads in flight during this step's MMAs),
  // except for B (K,N) with 2 token tiles, where the accumulators need the registers (there
  // 16 warps per SM keep the loads in flight).
  constexpr bool kPrefetch = !(KN && MT == 2);
  // Prologue: this warp's first weight step (and, with registers to spare, its second) goes
  // out before A is staged.
  constexpr bool kDeepPrologue = !KN && MT <= 2;
  uint4 cur[8], nxt[8];
  int step = step0 + wk_i;
  if (step < step1) load_step<KN>(cur, bbytes, ldb_bytes, p.n, p.k, n0, step, kend, g, t);
  bool primed = false;  // nxt already holds step + wk
  if (kDeepPrologue && step + p.wk < step1) {
    load_step<KN>(nxt, bbytes, ldb_bytes, p.n, p.k, n0, step + p.wk, kend, g, t);
    primed = true;
  }
  // Under a dependent launch this block may run while the previous kernel finishes: the
  // weight B is not its output (launch.hpp's contract), so the prologue above went out before
  // the wait; A, C, D and the split-K workspace wait for it. (Prefetching more weight steps
  // into L2 here measured slower: 1B decode 721 -> 677 tok/s with 4 steps, 655 with 8.)
  tile::wait_prior_grid();
  // Let the next kernel launch now: its CTAs take the SMs this grid's CTAs free in its tail
  // (and, when it is a GEMM, start their own weight prologue there). Measured on a chain of
  // an 8B layer's GEMMs (bench gemm_small_m, H100): M = 1 0.854 -> 0.890 of copy with the
  // trigger here; M = 16 lost 5 % with it here and gains a little after the main loop.
  if constexpr (MT == 1) tile::allow_next_grid();

  T* sa = reinterpret_cast<T*>(smem);
  const T* ga = static_cast<const T*>(p.a);
  // The fused RMSNorm's scales (gemm_small_m_rms), while the weight prologue is in flight
  // (the staging area holds the warps' sums until then) — except beside the two weight steps
  // of the 2-token-tile B (N,K) instance, where it spilled: there after the main loop.
  __shared__ float s_rstd[32];
  auto row_scales = [&] {
    row_rstd<T, kWarps, 2>(ga, p.lda, p.m, p.k, p.rms_eps, warp, lane,
                           reinterpret_cast<float*>(smem), s_rstd, [] { __syncthreads(); });
  };
  constexpr bool kScalesFirst = !(kDeepPrologue && MT == 2);
  if (kScalesFirst && p.rms) row_scales();

  constexpr int kQ = KN ? 4 : 1;  // MMAs per (sub-step, token tile)
  float acc[MT][kQ][4];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int q = 0; q < kQ; ++q)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][q][r] = 0.f;

  // Phases: the block's k range in slices of steps_per_phase steps whose A fits in shared
  // memory; each slice of A is staged once (chunk-major, zero-filled past K and M).
  for (int ph0 = step0; ph0 < step1; ph0 += p.steps_per_phase) {
    const int ph1 = min(ph0 + p.steps_per_phase, step1);
    if (ph0 != step0) __syncthreads();  // every warp is done with the previous slice
    {
      const int kb = ph0 * S::kStepK;
      const int pieces = (ph1 - ph0) * S::kChunks * tp * 4;
      if (p.gated || p.rms) {
        // SwiGLU / RMSNorm prologue: gate and up (or a and the norm weight) pieces through
        // registers (L2: the previous kernel just wrote them), the activation staged as A.
#pragma unroll 4
        for (int i = tid; i < pieces; i += kThreads) {
          const int piece = i & 3, row = (i >> 2) % tp, chunk = (i >> 2) / tp;
          const int kk = kb + chunk * 32 + piece * 8;
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (row < p.m && kk < kend) {
            const T* src = ga + int64_t{row} * p.lda + kk;
            const uint4 x = __ldcg(reinterpret_cast<const uint4*>(src));
            const T* ysrc = p.rms ? static_cast<const T*>(p.norm_w) + kk : src + p.k;
            const uint4 y = __ldcg(reinterpret_cast<const uint4*>(ysrc));
            v = p.rms ? mul8<T>(x, y) : swiglu8<T>(x, y);
          }
          *reinterpret_cast<uint4*>(sa + i * 8) = v;
        }
      } else {
        // cp.async: every piece of this thread in flight at once, no registers; src size 0
        // zero-fills (past K, past M).
#pragma unroll 4
        for (int i = tid; i < pieces; i += kThreads) {
          const int piece = i & 3, row = (i >> 2) % tp, chunk = (i >> 2) / tp;
          const int kk = kb + chunk * 32 + piece * 8;
          const bool valid = row < p.m && kk < kend;
          const T* src = valid ? ga + int64_t{row} * p.lda + kk : ga;
          const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(sa + i * 8));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                       "r"(valid ? 16 : 0)
                       : "memory");
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
      }
    }
    __syncthreads();
    while (step < ph1) {
      const int next = step + p.wk;
      if (kPrefetch && !primed && next < step1)
        load_step<KN>(nxt, bbytes, ldb_bytes, p.n, p.k, n0, next, kend, g, t);
      primed = false;
      const int chunk0 = (step - ph0) * S::kChunks;
#pragma unroll
      for (int u = 0; u < S::kChunks; ++u) {
        uint4 act[MT];
#pragma unroll
        for (int j = 0; j < MT; ++j)
          if (j < p.mtiles)
            act[j] =
                *reinterpret_cast<const uint4*>(sa + ((chunk0 + u) * tp + 8 * j + g) * 32 + 8 * t);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          if constexpr (!KN) {
            const uint4 &w0 = cur[u * 2], &w1 = cur[u * 2 + 1];
            const uint32_t a0 = word(w0, 2 * s), a1 = word(w1, 2 * s), a2 = word(w0, 2 * s + 1),
                           a3 = word(w1, 2 * s + 1);
#pragma unroll
            for (int j = 0; j < MT; ++j)
              if (j < p.mtiles)
                Mma<T>::run(acc[j][0], a0, a1, a2, a3, word(act[j], 2 * s),
                            word(act[j], 2 * s + 1));
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint32_t x0 = word(cur[4 * s], q), x1 = word(cur[4 * s + 1], q);
              const uint32_t x2 = word(cur[4 * s + 2], q), x3 = word(cur[4 * s + 3], q);
              const uint32_t a0 = __byte_perm(x0, x1, 0x5410), a1 = __byte_perm(x0, x1, 0x7632);
              const uint32_t a2 = __byte_perm(x2, x3, 0x5410), a3 = __byte_perm(x2, x3, 0x7632);
#pragma unroll
              for (int j = 0; j < MT; ++j)
                if (j < p.mtiles)
                  Mma<T>::run(acc[j][q], a0, a1, a2, a3, word(act[j], 2 * s),
                              word(act[j], 2 * s + 1));
            }
          }
        }
      }
      if constexpr (kPrefetch) {
#pragma unroll
        for (int i = 0; i < 8; ++i) cur[i] = nxt[i];
      } else if (next < step1) {
        load_step<KN>(cur, bbytes, ldb_bytes, p.n, p.k, n0, next, kend, g, t);
      }
      step = next;
    }
  }

  if constexpr (MT > 1) tile::allow_next_grid();  // the weights are consumed
  // Cross-warp (K) reduction in shared memory, fixed warp order. red[wk][token][bn + 1].
  __syncthreads();  // everyone is done with sa
  if (!kScalesFirst && p.rms) row_scales();  // (ends with a barrier)
  float* red = reinterpret_cast<float*>(smem);
  const int ldr = bn + 1;
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    if (j >= p.mtiles) continue;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      // c0,c1: MMA row g; c2,c3: row g + 8; columns (tokens) 2t, 2t + 1.
      const int r0 = KN ? wn_i * 64 + 8 * g + 2 * q : wn_i * 16 + g;
      const int r1 = KN ? r0 + 1 : r0 + 8;
      const int tok = 8 * j + 2 * t;
      float* base = red + int64_t{wk_i} * tp * ldr;
      base[tok * ldr + r0] = acc[j][q][0];
      base[(tok + 1) * ldr + r0] = acc[j][q][1];
      base[tok * ldr + r1] = acc[j][q][2];
      base[(tok + 1) * ldr + r1] = acc[j][q][3];
    }
  }
  __syncthreads();

  const int total = p.m * bn;
  if (p.splits == 1) {
    for (int i = tid; i < total; i += kThreads) {
      const int token = i / bn, nl = i % bn, n = nb + nl;
      if (n >= p.n) continue;
      float v = 0.f;
      for (int w = 0; w < p.wk; ++w) v += red[(w * tp + token) * ldr + nl];
      epilogue(p, token, n, p.rms ? v * s_rstd[token] : v);
    }
    return;
  }

  // Split-K: fp32 partials, then the last block of this column slab reduces in split order.
  for (int i = tid; i < total; i += kThreads) {
    const int token = i / bn, nl = i % bn, n = nb + nl;
    if (n >= p.n) continue;
    float v = 0.f;
    for (int w = 0; w < p.wk; ++w) v += red[(w * tp + token) * ldr + nl];
    p.partials[(int64_t{blockIdx.y} * p.m + token) * p.n + n] = v;
  }
  __threadfence();
  __syncthreads();
  __shared__ unsigned s_last;
  if (tid == 0) s_last = atomicAdd(&p.tickets[blockIdx.x], 1u) == unsigned(p.splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int i = tid; i < total; i += kThreads) {
    const int token = i / bn, nl = i % bn, n = nb + nl;
    if (n >= p.n) continue;
    float v = 0.f;
    for (int s = 0; s < p.splits; ++s)
      v += __ldcg(&p.partials[(int64_t{s} * p.m + token) * p.n + n]);
    epilogue(p, token, n, p.rms ? v * s_rstd[token] : v);
  }
  if (tid == 0) p.tickets[blockIdx.x] = 0;  // leave the workspace zeroed for the next launch
}

// ---- configs ----------------------------------------------------------------------------

constexpr int kSplitChoices[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr int kNumSplitChoices = 8;
constexpr int kNumLdgConfigs = 4 * kNumSplitChoices;  // wn ∈ {1, 2, 4, 8} × splits
// Then the bulk-copy ring kernel (gemm_small_m_ring.cu), {k per stage, stages, 16-row groups
// per stage}: B (N,K) and M <= 32 where the stage shape leaves room for two stages
// (ring_applies); for other problems these ids run the default register-streaming config. The
// ring depth barely matters alone (H200: 3, 4, 5 stages within 2 %); 2 stages leave shared
// memory for the neighbouring kernels' CTAs under a dependent launch. 32-row stages share one
// activation slice between two row groups (M = 9-16: the L2 reads of A halve).
constexpr int kRingShapes[][3] = {{1024, 2, 1}, {1024, 4, 1}, {2048, 2, 1}, {1024, 2, 2}};
constexpr int kNumRingConfigs = 4;
constexpr int kRing32Rows = kNumLdgConfigs + 3;  // 32 rows x 1024 k x 2 stages
constexpr int kNumConfigs = kNumLdgConfigs + kNumRingConfigs;
bool is_ring_config(int id) { return id >= kNumLdgConfigs; }
int ring_stage_k(int id) { return kRingShapes[id - kNumLdgConfigs][0]; }
int ring_stages(int id) { return kRingShapes[id - kNumLdgConfigs][1]; }
int ring_row_groups(int id) { return kRingShapes[id - kNumLdgConfigs][2]; }

struct Config {
  int wn, splits;
};
Config config_of(int id) {
  return {1 << (id / kNumSplitChoices), kSplitChoices[id % kNumSplitChoices]};
}
int config_id(int wn_log2, int split_index) { return wn_log2 * kNumSplitChoices + split_index; }

// Deterministic default: 64 weight rows (nk) / columns (kn) per block, enough K splits
// for about 2 blocks per SM.
int default_config(bool kn, int64_t n, int sms) {
  const int wn_log2 = kn ? 0 : 2;
  const int64_t bn = (kn ? 64 : 16) << wn_log2;
  const int64_t blocks_n = (n + bn - 1) / bn;
  const int64_t want = 2 * int64_t{sms};
  for (int i = 0; i < kNumSplitChoices; ++i)
    if (blocks_n * kSplitChoices[i] >= want) return config_id(wn_log2, i);
  return config_id(wn_log2, kNumSplitChoices - 1);
}

// ---- workspace (split-K partials + tickets), one per (device, stream) --------------------

struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  size_t tickets = 0;  // capacity of the ticket region at the start (always zero at rest)
};

struct WorkspaceView {
  unsigned* tickets = nullptr;
  float* partials = nullptr;
};

size_t ticket_bytes(size_t count) { return (count * sizeof(unsigned) + 255) / 256 * 256; }

// [tickets (zero between launches: the last block of each slab resets its ticket)]
// [partials (scratch)]. Returns {nullptr, nullptr} if the workspace must grow but cannot
// (stream capture).
WorkspaceView workspace(cudaStream_t stream, size_t tickets, size_t partial_bytes, bool capturing) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Workspace> slots;  // process lifetime
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Workspace& w = slots[{dev, stream}];
  if (w.tickets < tickets || w.bytes < ticket_bytes(w.tickets) + partial_bytes) {
    if (capturing) return {};
    const size_t cap = std::max({w.tickets, tickets, size_t{8192}});
    const size_t want = std::max({w.bytes, ticket_bytes(cap) + partial_bytes, size_t{1} << 20});
    if (w.ptr) {
      TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
      TESSEL_CUDA_CHECK(cudaFree(w.ptr));
      w = Workspace{};
    }
    TESSEL_CUDA_CHECK(cudaMalloc(&w.ptr, want));
    TESSEL_CUDA_CHECK(cudaMemsetAsync(w.ptr, 0, ticket_bytes(cap), stream));  // tickets at zero
    w.bytes = want;
    w.tickets = cap;
  }
  WorkspaceView v;
  v.tickets = static_cast<unsigned*>(w.ptr);
  v.partials = reinterpret_cast<float*>(static_cast<char*>(w.ptr) + ticket_bytes(w.tickets));
  return v;
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return true;  // unknown: behave as under capture (no allocation, no tuning)
  }
  return st != cudaStreamCaptureStatusNone;
}

// ---- problem description ---------------------------------------------------------------

struct Problem {
  bool ok = false;
  bool kn = false;
  bool bf16 = true;
  int m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0, ldc = 0;
  int out = 0;
  bool gated = false;  // A is the gate half of a (M, 2K) [gate | up] buffer (see Params::gated)
  bool rms = false;    // an RMSNorm fused in front (see Params::rms)
  float rms_eps = 0.f;
  const void* norm_w = nullptr;
  const Tensor* c = nullptr;
};

int64_t pitch_of(const Tensor& t, int64_t dense) { return t.shape[0] > 1 ? t.strides[0] : dense; }

// Fused epilogue options this kernel does not implement (bias, activation): refuse them.
// Written against the option names so it compiles with headers that lack them.
template <class O>
bool has_fused_epilogue(const O& o) {
  if constexpr (requires { o.bias; })
    if (o.bias != nullptr) return true;
  if constexpr (requires { o.activation; })
    if (static_cast<int>(o.activation) != 0) return true;
  return false;
}

Problem describe(const Tensor& a, const Tensor& b, const Tensor& d, const GemmOptions& opt) {
  Problem pr;
  if (has_fused_epilogue(opt)) return pr;
  if (a.ndim != 2 || b.ndim != 2 || d.ndim != 2) return pr;
  if (a.dtype != DType::bf16 && a.dtype != DType::f16) return pr;
  if (b.dtype != a.dtype) return pr;
  if (d.dtype != DType::f32 && d.dtype != DType::f16 && d.dtype != DType::bf16) return pr;
  pr.kn = opt.b_layout == BLayout::kn;
  if (opt.b_layout != BLayout::nk && opt.b_layout != BLayout::kn) return pr;
  const int64_t M = a.shape[0], K = a.shape[1];
  const int64_t N = pr.kn ? b.shape[1] : b.shape[0];
  if ((pr.kn ? b.shape[0] : b.shape[1]) != K) return pr;
  if (d.shape[0] != M || d.shape[1] != N) return pr;
  if (M < 1 || M > 32 || N < 1 || K < 1) return pr;
  if (N % 8 != 0 || K % 8 != 0 || N >= (int64_t{1} << 30) || K >= (int64_t{1} << 30)) return pr;
  const Tensor* c = opt.beta != 0.f ? opt.c : nullptr;
  if (opt.beta != 0.f && c == nullptr) return pr;
  if (c && (c->ndim != 2 || c->dtype != d.dtype || c->shape[0] != M || c->shape[1] != N)) return pr;
  auto rows_ok = [](const Tensor& t, bool need16) {
    if (t.shape[1] > 1 && t.strides[1] != 1) return false;
    if (t.shape[0] > 1 && (t.strides[0] < t.shape[1] || (need16 && t.strides[0] % 8 != 0)))
      return false;
    return !need16 || reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  };
  if (!rows_ok(a, true) || !rows_ok(b, true) || !rows_ok(d, false) || (c && !rows_ok(*c, false)))
    return pr;
  pr.bf16 = a.dtype == DType::bf16;
  pr.m = static_cast<int>(M);
  pr.n = static_cast<int>(N);
  pr.k = static_cast<int>(K);
  pr.lda = pitch_of(a, K);
  pr.ldb = pitch_of(b, pr.kn ? N : K);
  pr.ldd = pitch_of(d, N);
  pr.ldc = c ? pitch_of(*c, N) : 0;
  pr.out = d.dtype == DType::f32 ? 0 : d.dtype == DType::f16 ? 1 : 2;
  pr.c = c;
  pr.ok = true;
  return pr;
}

template <class T, bool KN, int MT>
cudaError_t launch_t(const Params& p, dim3 grid, size_t smem, cudaStream_t stream) {
  auto kernel = small_m_kernel<T, KN, MT>;
  if (cudaError_t e = opt_in_shared_memory(kernel, kMaxSmemA + 16 * 1024); e != cudaSuccess)
    return e;
  return launch_dependent(kernel, grid, dim3(kThreads), smem, stream, p);
}

template <class T, bool KN>
cudaError_t launch_mt(const Params& p, dim3 grid, size_t smem, cudaStream_t stream) {
  if (p.mtiles <= 1) return launch_t<T, KN, 1>(p, grid, smem, stream);
  if (p.mtiles <= 2) return launch_t<T, KN, 2>(p, grid, smem, stream);
  return launch_t<T, KN, 4>(p, grid, smem, stream);
}

// Whether ring config `cfg_id` runs this problem (B (N,K), a stage shape built for M tokens
// with room for two stages; the SwiGLU-fused problem up to the tokens its A warps hold).
bool ring_applies(const Problem& pr, int cfg_id) {
  const int stage_k = ring_stage_k(cfg_id), groups = ring_row_groups(cfg_id);
  return !pr.kn && pr.m <= kSmallMRingMaxM && small_m_ring_shape_supported(pr.m, stage_k, groups) &&
         small_m_ring_max_stages(pr.m, stage_k, groups) >= 2 &&
         ((!pr.gated && !pr.rms) || pr.m <= small_m_ring_max_gated_m(stage_k));
}

// TESSEL_GEMM_SMALL_M_RING=0 keeps the ring kernel out of the autotuner's candidates (A/B).
bool ring_tunable() {
  static const bool on = [] {
    const char* v = std::getenv("TESSEL_GEMM_SMALL_M_RING");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// The operands and epilogue of a launch, shared by both kernels' parameter blocks.
template <class P>
void set_problem(P& p, const Problem& pr, const void* a, const void* b, void* dptr, int64_t ldd,
                 const void* cptr, float alpha, float beta) {
  p.a = a;
  p.lda = pr.lda;
  p.b = b;
  p.ldb = pr.ldb;
  p.d = dptr;
  p.ldd = ldd;
  p.c = cptr;
  p.ldc = pr.ldc;
  p.alpha = alpha;
  p.beta = beta;
  p.m = pr.m;
  p.n = pr.n;
  p.k = pr.k;
  p.out = pr.out;
  p.gated = pr.gated ? 1 : 0;
  p.rms = pr.rms ? 1 : 0;
  p.rms_eps = pr.rms_eps;
  p.norm_w = pr.norm_w;
}

// The ring kernel; false (nothing launched) when its workspace cannot be allocated (capture).
bool launch_ring(const Problem& pr, const void* a, const void* b, void* dptr, int64_t ldd,
                 const void* cptr, float alpha, float beta, int cfg_id, cudaStream_t stream) {
  const int stage_k = ring_stage_k(cfg_id), groups = ring_row_groups(cfg_id);
  const int sms = current_sm_count();
  const int grid = small_m_ring_grid(pr.n, pr.k, stage_k, sms, groups);
  const WorkspaceView ws =
      workspace(stream, size_t(small_m_ring_slabs(pr.n, groups)),
                small_m_ring_partial_bytes(pr.m, grid, groups), is_capturing(stream));
  if (ws.tickets == nullptr) return false;
  SmallMRingParams p{};
  set_problem(p, pr, a, b, dptr, ldd, cptr, alpha, beta);
  p.stage_k = stage_k;
  p.row_groups = groups;
  p.stages = std::min(ring_stages(cfg_id), small_m_ring_max_stages(pr.m, stage_k, groups));
  p.slab_runs = small_m_ring_slab_runs(pr.n, sms, groups) ? 1 : 0;
  p.partials = ws.partials;
  p.tickets = ws.tickets;
  TESSEL_CUDA_CHECK(small_m_ring_launch(p, grid, pr.bf16, stream));
  return true;
}

// Launches with config `cfg_id` into d_ptr/ldd (beta·C as given). Falls back to one split
// when the split-K workspace cannot be allocated (graph capture), and from a ring config the
// problem cannot take (or whose workspace cannot be allocated) to the default config.
void launch(const Problem& pr, const void* a, const void* b, void* dptr, int64_t ldd,
            const void* cptr, float alpha, float beta, int cfg_id, cudaStream_t stream) {
  if (is_ring_config(cfg_id)) {
    if (ring_applies(pr, cfg_id) &&
        launch_ring(pr, a, b, dptr, ldd, cptr, alpha, beta, cfg_id, stream))
      return;
    cfg_id = default_config(pr.kn, pr.n, current_sm_count());
  }
  const Config cfg = config_of(cfg_id);
  const int stepk = pr.kn ? 32 : 128;
  const int warp_n = pr.kn ? 64 : 16;
  Params p{};
  set_problem(p, pr, a, b, dptr, ldd, cptr, alpha, beta);
  p.mtiles = (pr.m + 7) / 8;  // kernel instances for up to 1, 2, 4 tiles (3 runs in the 4)
  const int tp = p.mtiles * 8;
  p.wn = cfg.wn;
  p.wk = kWarps / cfg.wn;
  const int bn = warp_n * cfg.wn;
  const int blocks_n = (pr.n + bn - 1) / bn;
  const int nsteps = (pr.k + stepk - 1) / stepk;
  // Splits: at most one per step; A is staged in phases of at most max_steps_smem steps.
  const int max_steps_smem = std::max(1, kMaxSmemA / (stepk * tp * 2));
  int splits = std::min(cfg.splits, nsteps);
  int per = (nsteps + splits - 1) / splits;
  splits = (nsteps + per - 1) / per;  // no empty splits
  const bool capturing = is_capturing(stream);
  if (splits > 1) {
    const size_t part_bytes = size_t(splits) * pr.m * pr.n * sizeof(float);
    const WorkspaceView ws = workspace(stream, size_t(blocks_n), part_bytes, capturing);
    if (ws.tickets == nullptr) {
      // Cannot allocate during graph capture: one split (same result up to rounding).
      splits = 1;
      per = nsteps;
    } else {
      p.partials = ws.partials;
      p.tickets = ws.tickets;
    }
  }
  p.splits = splits;
  p.steps_per_split = per;
  // Phases of equal length (a multiple of the warps along K where possible).
  const int phases = (per + max_steps_smem - 1) / max_steps_smem;
  p.steps_per_phase = (per + phases - 1) / phases;
  const size_t smem_a = size_t(p.steps_per_phase) * stepk * tp * 2;
  const size_t smem_red = size_t(p.wk) * tp * (bn + 1) * sizeof(float);
  const size_t smem = (std::max(smem_a, smem_red) + 15) / 16 * 16;
  const dim3 grid(static_cast<unsigned>(blocks_n), static_cast<unsigned>(splits));
  cudaError_t err;
  if (pr.bf16)
    err = pr.kn ? launch_mt<__nv_bfloat16, true>(p, grid, smem, stream)
                : launch_mt<__nv_bfloat16, false>(p, grid, smem, stream);
  else
    err = pr.kn ? launch_mt<__half, true>(p, grid, smem, stream)
                : launch_mt<__half, false>(p, grid, smem, stream);
  TESSEL_CUDA_CHECK(err);
}

std::string dtype_key(const Tensor& a, const Tensor& d) {
  return std::string(dtype_name(a.dtype)) + "->" + dtype_name(d.dtype);
}

// The autotuner's choice for this problem (measures all configs on first use of a key).
// Choices made outside graph capture are memoized per exact problem, so the steady-state
// cost per call is one map lookup.
int choose(const Problem& pr, const Tensor& a, const Tensor& b, const Tensor& d,
           cudaStream_t stream) {
  // Untuned: the register kernel's default, or for M = 9-16 (B (N,K)) the 32-row ring, which
  // beats it on every Llama decode weight (H200: 0.72-0.99x cuBLAS against 0.61-0.87x).
  int fallback = default_config(pr.kn, pr.n, current_sm_count());
  if (pr.m > 8 && ring_tunable() && ring_applies(pr, kRing32Rows)) fallback = kRing32Rows;
  if (!autotune::enabled()) return fallback;
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  using MemoKey = std::tuple<int, int, int, bool, bool, bool, int, int, int>;
  static std::mutex memo_mu;
  static std::map<MemoKey, int> memo;
  const MemoKey mk{
      dev,    static_cast<int>(a.dtype), static_cast<int>(d.dtype), pr.kn, pr.gated, pr.rms, pr.m,
      pr.n,   pr.k};
  {
    std::lock_guard<std::mutex> lock(memo_mu);
    if (auto it = memo.find(mk); it != memo.end()) return it->second;
  }
  std::vector<int> candidates;
  for (int i = 0; i < kNumConfigs; ++i)
    if (!is_ring_config(i) || (ring_applies(pr, i) && ring_tunable())) candidates.push_back(i);
  // The SwiGLU- and RMSNorm-fused problems are tuned on their own: their A prologue costs
  // differ by kernel (the register kernel stages A through registers before its loop, the ring
  // kernel's A warps run ahead instead of issuing bulk copies).
  const char* family = pr.gated ? "gemm_small_m_swiglu" : pr.rms ? "gemm_small_m_rms" : "gemm_small_m";
  const std::string key = autotune::make_key(family,
                                             autotune::current_gpu_name(), dtype_key(a, d),
                                             pr.kn ? "kn" : "nk", pr.m, pr.n, pr.k);
  // Timing writes a scratch output (d may be C, and must not be clobbered), no C.
  DeviceBuffer scratch;
  auto measure = [&](int cfg) -> double {
    if (scratch.data() == nullptr)
      scratch = DeviceBuffer(size_t(pr.m) * pr.n * dtype_size(d.dtype));
    return autotune::time_on_stream(stream, [&] {
      launch(pr, a.data, b.data, scratch.data(), pr.n, nullptr, 1.f, 0.f, cfg, stream);
    });
  };
  const int cfg = autotune::select_for_stream(stream, key, candidates, fallback, measure);
  if (!is_capturing(stream)) {
    std::lock_guard<std::mutex> lock(memo_mu);
    memo[mk] = cfg;
  }
  return cfg;
}

// ---- ahead-of-time tuning (`tessel tune --family gemm_small_m`) ----------------------------

void pretune_small_m(const std::vector<std::vector<int64_t>>& shapes_in,
                     std::vector<std::string>& report) {
  std::vector<std::vector<int64_t>> shapes = shapes_in;
  if (shapes.empty()) {
    const int64_t nk[][2] = {
        {4096, 4096}, {6144, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    for (int64_t m : {1, 2, 4, 8, 16, 32})
      for (const auto& x : nk) shapes.push_back({m, x[0], x[1]});
  }
  if (!autotune::enabled()) {
    report.push_back("TESSEL_AUTOTUNE=0: tuning is off, nothing to do");
    return;
  }
  cudaStream_t stream = nullptr;
  TESSEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Guard {
    cudaStream_t s;
    ~Guard() { cudaStreamDestroy(s); }
  } guard{stream};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    DeviceBuffer a(size_t(M * K) * 2), b(size_t(N * K) * 2), d(size_t(M * N) * 2);
    TESSEL_CUDA_CHECK(cudaMemsetAsync(a.data(), 0x3C, a.bytes(), stream));
    TESSEL_CUDA_CHECK(cudaMemsetAsync(b.data(), 0x3C, b.bytes(), stream));
    const Tensor ta = Tensor::contiguous(a.data(), DType::bf16, {M, K});
    const Tensor tb = Tensor::contiguous(b.data(), DType::bf16, {N, K});
    Tensor td = Tensor::contiguous(d.data(), DType::bf16, {M, N});
    GemmOptions opt;
    const Problem pr = describe(ta, tb, td, opt);
    std::string line =
        std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " bf16 nk: ";
    if (!pr.ok) {
      report.push_back(line + "not a small-M problem (M must be 1..32, N and K multiples of 8)");
      continue;
    }
    const int cfg = choose(pr, ta, tb, td, stream);
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
    report.push_back(line + gemm_small_m_config_name(cfg));
  }
}

[[maybe_unused]] const bool g_pretune_registered = [] {
  autotune::register_pretune("gemm_small_m", pretune_small_m);
  return true;
}();

}  // namespace

bool gemm_small_m_preferred(int64_t m, int64_t n, bool kn, int sms) {
  static const int forced = [] {
    const char* v = std::getenv("TESSEL_GEMM_SMALL_M");
    return v == nullptr ? -1 : v[0] == '0' ? 0 : 1;
  }();
  if (m < 1 || m > 32) return false;
  if (forced >= 0) return forced == 1;
  return kn || m <= 8 || (m <= 16 && ring_tunable()) || (n + 63) / 64 > sms;
}

int gemm_small_m_num_configs() { return kNumConfigs; }

bool gemm_small_m_is_ring_config(int config) {
  return config >= 0 && config < kNumConfigs && is_ring_config(config);
}

std::string gemm_small_m_config_name(int config) {
  if (config < 0 || config >= kNumConfigs) return "config " + std::to_string(config) + " (invalid)";
  if (is_ring_config(config))
    return "config " + std::to_string(config) + " (bulk-copy ring, " +
           std::to_string(16 * ring_row_groups(config)) + " rows x " +
           std::to_string(ring_stage_k(config)) + " k x " + std::to_string(ring_stages(config)) +
           " stages)";
  const Config c = config_of(config);
  return "config " + std::to_string(config) + " (warps N x K = " + std::to_string(c.wn) + " x " +
         std::to_string(kWarps / c.wn) + ", splits >= " + std::to_string(c.splits) + ")";
}

int gemm_small_m_choice(const Tensor& a, const Tensor& b, const Tensor& d, const GemmOptions& opt,
                        cudaStream_t stream) {
  const Problem pr = describe(a, b, d, opt);
  if (!pr.ok) return -1;
  return choose(pr, a, b, d, stream);
}

bool gemm_small_m_with_config(const Tensor& a, const Tensor& b, Tensor& d, const GemmOptions& opt,
                              cudaStream_t stream, int config) {
  const Problem pr = describe(a, b, d, opt);
  if (!pr.ok) return false;
  if (config < 0 || config >= kNumConfigs) config = choose(pr, a, b, d, stream);
  launch(pr, a.data, b.data, d.data, pr.ldd, pr.c ? pr.c->data : nullptr, opt.alpha,
         pr.c ? opt.beta : 0.f, config, stream);
  return true;
}

bool gemm_small_m(const Tensor& a, const Tensor& b, Tensor& d, const GemmOptions& opt,
                  cudaStream_t stream) {
  return gemm_small_m_with_config(a, b, d, opt, stream, -1);
}

bool gemm_small_m_rms(const Tensor& a, const Tensor& norm_w, float eps, const Tensor& b,
                      Tensor& d, const GemmOptions& opt, cudaStream_t stream, int config) {
  Problem pr = describe(a, b, d, opt);
  if (!pr.ok || !(eps >= 0.f) || !std::isfinite(eps)) return false;
  // The norm weight: K contiguous elements of A's dtype, 16-byte aligned (16-byte loads).
  if (norm_w.dtype != a.dtype || norm_w.numel() != pr.k ||
      (norm_w.ndim >= 1 && norm_w.strides[norm_w.ndim - 1] != 1 && pr.k > 1) ||
      reinterpret_cast<uintptr_t>(norm_w.data) % 16 != 0)
    return false;
  Problem fused = pr;
  fused.rms = true;
  fused.rms_eps = eps;
  fused.norm_w = norm_w.data;
  // Where the plain problem runs a ring config whose A warps cannot stage m tokens (more than
  // 2048 / stage_k), refuse: rms_norm + the ring then beat the fused register kernel (as for
  // the SwiGLU prologue). Otherwise the fused problem's own tuning (key "gemm_small_m_rms").
  if (config < 0 || config >= kNumConfigs) {
    if (const int plain_cfg = choose(pr, a, b, d, stream);
        is_ring_config(plain_cfg) && ring_applies(pr, plain_cfg) && !ring_applies(fused, plain_cfg))
      return false;
    config = choose(fused, a, b, d, stream);
  } else if (is_ring_config(config) && ring_applies(pr, config) && !ring_applies(fused, config)) {
    return false;
  }
  launch(fused, a.data, b.data, d.data, pr.ldd, pr.c ? pr.c->data : nullptr, opt.alpha,
         pr.c ? opt.beta : 0.f, config, stream);
  return true;
}

bool gemm_small_m_swiglu(const Tensor& gate_up, const Tensor& b, Tensor& d, const GemmOptions& opt,
                         cudaStream_t stream, int config) {
  if (gate_up.ndim != 2 || b.ndim != 2 || gate_up.strides[1] != 1) return false;
  const int64_t k = opt.b_layout == BLayout::nk ? b.shape[1] : b.shape[0];
  if (gate_up.shape[1] != 2 * k || k % 8 != 0) return false;
  Tensor a = gate_up;  // the gate half, (M, K) with gate_up's row pitch
  a.shape[1] = k;
  Problem pr = describe(a, b, d, opt);
  if (!pr.ok) return false;
  pr.gated = true;
  if (config < 0 || config >= kNumConfigs) {
    // Where the plain problem runs the ring kernel and the SwiGLU prologue cannot (more tokens
    // than its A warps hold), swiglu + the ring beats the fused register kernel (H200, M = 16,
    // 4096x14336: 35.3 µs for the ring alone against 47.2 for the register kernel): refuse.
    Problem plain = pr;
    plain.gated = false;
    if (const int plain_cfg = choose(plain, a, b, d, stream);
        is_ring_config(plain_cfg) && !ring_applies(pr, plain_cfg))
      return false;
    config = choose(pr, a, b, d, stream);
  } else if (is_ring_config(config) && !ring_applies(pr, config)) {
    // The ring kernel's SwiGLU prologue holds 2048 / stage_k tokens: where the plain
    // problem would run the ring and this one cannot, refuse (swiglu + gemm then give the
    // plain problem's bits).
    Problem plain = pr;
    plain.gated = false;
    if (ring_applies(plain, config)) return false;
  }
  launch(pr, a.data, b.data, d.data, pr.ldd, pr.c ? pr.c->data : nullptr, opt.alpha,
         pr.c ? opt.beta : 0.f, config, stream);
  return true;
}

}  // namespace tessel::detail
