// Small-M GEMM, TMA ring kernel (see gemm_small_m_ring.hpp): D = alpha · A · Bᵀ + beta · C for
// B (N,K) and M <= 8, the decode GEMV of an LLM.
//
// Why: the register-streaming kernel (gemm_small_m.cu) keeps its weight bytes in flight in
// registers; on the H200 (4.8 TB/s over the same 132 SMs as the H100's 3.35) it streamed the
// 8B gate|up weight at 0.83 of copy while cuBLAS (nvjet_sm90_tst_128x8_64x12: 128 x 64 tensor
// boxes, 12 stages, one CTA per SM) reached 87 % of the DRAM peak. Bulk (1-D) copies were
// tried first: 512-byte row pieces ran at 1.57 TB/s, 2 and 4 KB pieces at ~3.6 TB/s whatever
// the ring depth. Here each stage is one 128-row x 64-k tensor box (16 KB, 128-byte swizzle,
// ragged N and K zero-filled by the copy engine), and warps specialize:
//
//   warp 8 (producer)   one lane: the weight box of each stage (L2 evict-first) and the
//                       activations' 8 x 64 box (or, for the SwiGLU down projection, the gate
//                       and up boxes). Weight boxes of the first `stages` stages go out before
//                       waiting for the previous kernel (weights are not its output).
//   warps 9, 10         SwiGLU only: silu(gate) · up of each stage into the activation box,
//                       rounded as tessel::swiglu rounds.
//   warps 0-7 (MMA)     warp w: rows 16w … 16w+15 of each box, mma.sync m16n8k16 (weight = A
//                       operand through ldmatrix, tokens = B operand), fp32 accumulators.
//
// Work split: the stages of all column slabs (128 rows × all of K) in slab-major order are cut
// into `grid` contiguous, equal runs, one per CTA (persistent, no tail wave). A slab that one
// CTA covers is written directly; a slab cut between CTAs leaves fp32 partials and the last CTA
// to finish it (atomic ticket) sums them in CTA order, so results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cutlass/cuda_host_adapter.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "ops/bulk_copy.cuh"
#include "ops/gemm/gemm_small_m_common.cuh"
#include "ops/gemm/gemm_small_m_ring.hpp"
#include "runtime/launch.cuh"
#include "tessel/tensor.hpp"
#include "tile/tile.cuh"

namespace tessel::detail {
namespace {

using namespace small_m;

constexpr int kRows = 128;   // weight rows per stage: 8 MMA warps x 16
constexpr int kStageK = 64;  // k per stage: 128 bytes, the swizzle span
constexpr int kTokens = kSmallMRingMaxM;
constexpr int kMmaWarps = 8;
constexpr int kActWarps = 2;
constexpr int kProducerWarp = kMmaWarps;
constexpr int kThreads = (kMmaWarps + 1 + kActWarps) * 32;
constexpr int kWBytes = kRows * 128;    // 16 KB weight box
constexpr int kABytes = kTokens * 128;  // 1 KB activation box (tokens past M zero-filled)
constexpr size_t kMaxSmem = 226 * 1024;

// Shared memory: 1 KB alignment slack (128-byte swizzled boxes), then per stage the weight
// box, the activation box and (gated) the gate and up boxes, then full/empty/raw barriers.
size_t smem_bytes(int stages, bool gated) {
  return 1024 + size_t(stages) * (kWBytes + kABytes + (gated ? 2 * kABytes : 0)) +
         3 * size_t(stages) * sizeof(uint64_t);
}

struct Params {
  CUtensorMap wmap;  // B: (K, N) box 64 x 128
  CUtensorMap amap;  // A or gate: (K, M) box 64 x 8
  CUtensorMap umap;  // up (gated)
  void* d;
  int64_t ldd;
  const void* c;
  int64_t ldc;
  float alpha, beta;
  int m, n, k, out, gated, stages;
  float* partials;
  unsigned* tickets;
};

// The 16-byte chunk q of row r of a 128-byte-swizzled box lives at chunk q ^ (r % 8).
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ void tma_box(void* dst, const CUtensorMap* map, int c0, int c1,
                                        uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ void tma_box_hint(void* dst, const CUtensorMap* map, int c0, int c1,
                                             uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// The MMA warps' own barrier (named barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void mma_warps_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kMmaWarps * 32) : "memory");
}

struct Split {
  int64_t total;  // stages of all slabs
  int ksn;        // stages per slab
  int grid;
  __device__ int64_t start(int c) const { return int64_t{c} * total / grid; }
  // The CTA whose run holds stage L.
  __device__ int cta_of(int64_t L) const { return static_cast<int>(((L + 1) * grid - 1) / total); }
  // Where CTA c keeps its partial of `slab`: 0 for its first slab, 1 for its last.
  __device__ int slot(int c, int64_t slab) const { return slab == start(c) / ksn ? 0 : 1; }
};

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    small_m_ring_kernel(const __grid_constant__ Params p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int S = p.stages;
  unsigned char* wring = smem;
  unsigned char* aring = wring + size_t(S) * kWBytes;
  unsigned char* rawring = aring + size_t(S) * kABytes;  // gated: [gate box | up box] per stage
  uint64_t* full = reinterpret_cast<uint64_t*>(rawring + (p.gated ? size_t(S) * 2 * kABytes : 0));
  uint64_t* empty = full + S;
  uint64_t* raw = empty + S;
  __shared__ unsigned s_last;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // full: the producer's expect-tx arrival (+ every SwiGLU lane's, after its stores);
    // empty: one arrival per MMA warp; raw: the producer's (gate and up boxes).
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1 + (p.gated ? kActWarps * 32 : 0));
      mbar_init(&empty[s], kMmaWarps);
      mbar_init(&raw[s], 1);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int ksn = (p.k + kStageK - 1) / kStageK;
  const int slabs = (p.n + kRows - 1) / kRows;
  const Split split{int64_t{slabs} * ksn, ksn, static_cast<int>(gridDim.x)};
  const int64_t L0 = split.start(blockIdx.x);
  const int count = static_cast<int>(split.start(blockIdx.x + 1) - L0);

  if (warp == kProducerWarp) {
    if (lane != 0) return;
    const uint64_t policy = l2_evict_first_policy();
    auto issue_act = [&](int i) {  // A is the previous kernel's output: after the grid wait
      const int s = i % S, k0 = static_cast<int>((L0 + i) % ksn) * kStageK;
      if (!p.gated) {
        tma_box(aring + size_t(s) * kABytes, &p.amap, k0, 0, &full[s]);
      } else {
        mbar_arrive_expect_tx(&raw[s], 2 * kABytes);
        tma_box(rawring + size_t(s) * 2 * kABytes, &p.amap, k0, 0, &raw[s]);
        tma_box(rawring + size_t(s) * 2 * kABytes + kABytes, &p.umap, k0, 0, &raw[s]);
      }
    };
    const int prologue = min(S, count);
    for (int i = 0; i < count; ++i) {
      const int s = i % S;
      if (i >= S) mbar_wait(&empty[s], ((i / S) + 1) & 1);
      const int64_t L = L0 + i;
      const int row0 = static_cast<int>(L / ksn) * kRows, k0 = static_cast<int>(L % ksn) * kStageK;
      mbar_arrive_expect_tx(&full[s], kWBytes + (p.gated ? 0 : kABytes));
      tma_box_hint(wring + size_t(s) * kWBytes, &p.wmap, k0, row0, &full[s], policy);
      if (i == prologue - 1) {
        tile::wait_prior_grid();
        for (int j = 0; j < prologue; ++j) issue_act(j);
      } else if (i >= prologue) {
        issue_act(i);
      }
    }
    return;
  }

  if (warp > kProducerWarp) {
    if (!p.gated) return;
    // Lane id of the two warps: token id / 8, 16-byte chunk id % 8 of the stage's 64 k.
    const int id = lane + 32 * (warp - kProducerWarp - 1);
    const int at = swz(id / 8, id % 8);
    for (int i = 0; i < count; ++i) {
      const int s = i % S;
      mbar_wait(&raw[s], (i / S) & 1);
      const unsigned char* r = rawring + size_t(s) * 2 * kABytes;
      // Zero-filled past M and K: silu(0) · 0 = 0 there.
      *reinterpret_cast<uint4*>(aring + size_t(s) * kABytes + at) =
          swiglu8<T>(*reinterpret_cast<const uint4*>(r + at),
                     *reinterpret_cast<const uint4*>(r + kABytes + at));
      mbar_arrive(&full[s]);
    }
    return;
  }

  // ---- MMA warps -------------------------------------------------------------------------
  tile::wait_prior_grid();  // before writing D / partials / tickets and reading C
  tile::allow_next_grid();
  const int g = lane >> 2, t = lane & 3, tid = threadIdx.x;
  // ldmatrix.x4 of a 16 x 16 tile: lanes 8i … 8i+7 address matrix i = (row half i & 1,
  // k half i >> 1), which lands as the m16n8k16 A fragment {a0, a1, a2, a3}.
  const int lrow = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), lhalf = lane >> 4;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int seg_ks0 = 0;  // first stage (k index) of the current slab segment
  for (int i = 0; i < count; ++i) {
    const int s = i % S;
    const int64_t L = L0 + i;
    const int64_t slab = L / ksn;
    const int ks = static_cast<int>(L % ksn);
    if (i == 0 || ks == 0) seg_ks0 = ks;
    mbar_wait(&full[s], (i / S) & 1);
    const unsigned char* wbox = wring + size_t(s) * kWBytes;
    const unsigned char* abox = aring + size_t(s) * kABytes;
#pragma unroll
    for (int j = 0; j < kStageK / 16; ++j) {
      uint32_t a[4];
      ldmatrix_x4(a, wbox + swz(lrow, 2 * j + lhalf));
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(abox + swz(g, 2 * j) + 4 * t);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(abox + swz(g, 2 * j + 1) + 4 * t);
      Mma<T>::run(acc, a[0], a[1], a[2], a[3], b0, b1);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (ks != ksn - 1 && i != count - 1) continue;

    // End of this CTA's segment of `slab`: c0, c1 are row g, tokens 2t, 2t + 1; c2, c3 row g + 8.
    const int rl0 = warp * 16 + g;  // row within the slab
    const int row0 = static_cast<int>(slab) * kRows;
    if (seg_ks0 == 0 && ks == ksn - 1) {  // the whole slab: write
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tok = 2 * t + (r & 1), n = row0 + rl0 + 8 * (r >> 1);
        if (tok < p.m && n < p.n) epilogue(p, tok, n, acc[r]);
      }
    } else {  // a piece: partials, then the slab's last CTA sums them in CTA order
      const int slot = split.slot(blockIdx.x, slab);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tok = 2 * t + (r & 1);
        if (tok < p.m)
          p.partials[((int64_t{blockIdx.x} * 2 + slot) * p.m + tok) * kRows + rl0 + 8 * (r >> 1)] =
              acc[r];
      }
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
      mma_warps_sync();  // s_last is reused by the next piece
    }
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
  }
}

// A (cols, rows) row-major 16-bit tensor as 64-column x box_rows boxes, 128-byte swizzle.
void encode(CUtensorMap* map, const void* base, bool bf16, int64_t rows, int64_t cols, int64_t ld,
            int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * 2)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kStageK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult cr = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
      const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (cr != CUDA_SUCCESS)
    throw Error(TESSEL_ERROR_CUDA,
                "tessel::gemm (small-M TMA ring): cuTensorMapEncodeTiled failed "
                "(CUresult " +
                    std::to_string(static_cast<int>(cr)) + ")");
}

template <class T>
cudaError_t launch_t(const Params& p, int grid, cudaStream_t stream) {
  auto kernel = small_m_ring_kernel<T>;
  static std::mutex mu;
  static std::vector<bool> done;  // opted in to the large shared memory, per device
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<int>(done.size()) <= dev) done.resize(dev + 1, false);
    if (!done[dev]) {
      if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMaxSmem));
          e != cudaSuccess)
        return e;
      done[dev] = true;
    }
  }
  return launch_dependent(kernel, dim3(grid), dim3(kThreads), smem_bytes(p.stages, p.gated != 0),
                          stream, p);
}

}  // namespace

int small_m_ring_slabs(int n) { return (n + kRows - 1) / kRows; }

int small_m_ring_grid(int n, int k, int sms) {
  const int64_t total = int64_t{small_m_ring_slabs(n)} * ((k + kStageK - 1) / kStageK);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(sms, total)));
}

int small_m_ring_max_stages(bool gated) {
  int s = 1;
  while (smem_bytes(s + 1, gated) <= kMaxSmem) ++s;
  return s;
}

size_t small_m_ring_partial_bytes(int m, int grid) {
  return size_t(grid) * 2 * m * kRows * sizeof(float);
}

cudaError_t small_m_ring_launch(const SmallMRingProblem& q, int grid, cudaStream_t stream) {
  if (q.m < 1 || q.m > kSmallMRingMaxM || q.stages < 1 ||
      smem_bytes(q.stages, q.gated != 0) > kMaxSmem)
    return cudaErrorInvalidValue;
  Params p{};
  encode(&p.wmap, q.b, q.bf16, q.n, q.k, q.ldb, kRows);
  encode(&p.amap, q.a, q.bf16, q.m, q.k, q.lda, kTokens);
  if (q.gated)
    encode(&p.umap, static_cast<const char*>(q.a) + int64_t{q.k} * 2, q.bf16, q.m, q.k, q.lda,
           kTokens);
  p.d = q.d;
  p.ldd = q.ldd;
  p.c = q.c;
  p.ldc = q.ldc;
  p.alpha = q.alpha;
  p.beta = q.beta;
  p.m = q.m;
  p.n = q.n;
  p.k = q.k;
  p.out = q.out;
  p.gated = q.gated;
  p.stages = q.stages;
  p.partials = q.partials;
  p.tickets = q.tickets;
  return q.bf16 ? launch_t<__nv_bfloat16>(p, grid, stream) : launch_t<__half>(p, grid, stream);
}

}  // namespace tessel::detail
