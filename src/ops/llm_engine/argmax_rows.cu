// Greedy sampling on the device for the engine's GPU backend: the argmax of each logits row,
// so a greedy decode step downloads one int32 per sequence instead of a whole bf16 row
// (batch 16 x 128k vocabulary = 4 MB plus its widening on the host).
#include <cuda_bf16.h>

#include <climits>

#include "ops/llm_engine/argmax_rows.hpp"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "tile/tile.cuh"

namespace tessel::llm_engine {
namespace {

constexpr int kThreads = 512;

// (value, index) order of the host sampler: a larger value wins, equal values keep the lower
// index, NaN never wins (every comparison with NaN is false).
__device__ __forceinline__ void keep_best(float& best, int& idx, float v, int i) {
  if (v > best || (v == best && i < idx)) {
    best = v;
    idx = i;
  }
}

// One block per row; 16-byte loads when the row start is 16-byte aligned.
__global__ void __launch_bounds__(kThreads)
    argmax_rows_kernel(const __nv_bfloat16* x, int64_t cols, int64_t ld, int32_t* out) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const __nv_bfloat16* row = x + blockIdx.x * ld;
  float best = -INFINITY;
  int idx = INT_MAX;
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  const int64_t nvec = vec ? cols / 8 : 0;
  for (int64_t c = threadIdx.x; c < nvec; c += kThreads) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + c);
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) keep_best(best, idx, __bfloat162float(h[j]), int(c * 8 + j));
  }
  for (int64_t c = nvec * 8 + threadIdx.x; c < cols; c += kThreads)
    keep_best(best, idx, __bfloat162float(row[c]), int(c));
  for (int o = 16; o > 0; o >>= 1) {
    keep_best(best, idx, __shfl_xor_sync(0xffffffffu, best, o),
              __shfl_xor_sync(0xffffffffu, idx, o));
  }
  __shared__ float s_best[kThreads / 32];
  __shared__ int s_idx[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_best[warp] = best;
    s_idx[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? s_best[lane] : -INFINITY;
    idx = lane < kThreads / 32 ? s_idx[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      keep_best(best, idx, __shfl_xor_sync(0xffffffffu, best, o),
                __shfl_xor_sync(0xffffffffu, idx, o));
    }
    if (lane == 0) out[blockIdx.x] = idx == INT_MAX ? 0 : idx;  // every logit NaN: token 0
  }
}

}  // namespace

void argmax_rows_bf16(const void* x, int64_t rows, int64_t cols, int64_t ld, int32_t* out,
                      cudaStream_t stream) {
  if (rows <= 0) return;
  TESSEL_CUDA_CHECK(detail::launch_dependent(argmax_rows_kernel, dim3(static_cast<unsigned>(rows)),
                                             dim3(kThreads), 0, stream,
                                             static_cast<const __nv_bfloat16*>(x), cols, ld, out));
}

}  // namespace tessel::llm_engine
