// RoPE from host-built tables for the engine's GPU backend: one thread per rotated pair.
#include <cuda_bf16.h>

#include <algorithm>

#include "ops/llm_engine/rope_tables.hpp"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "tile/tile.cuh"

namespace tessel::llm_engine {
namespace {

__global__ void rope_tables_kernel(__nv_bfloat16* x, int64_t rows, int64_t ld, int n_heads,
                                   int head_dim, int half, bool neox, const float* cos,
                                   const float* sin) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const int64_t total = rows * n_heads * half;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int64_t rh = t / half;  // row · n_heads + head
    const int64_t r = rh / n_heads;
    __nv_bfloat16* v = x + r * ld + (rh - r * n_heads) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float c = cos[r * half + i], s = sin[r * half + i];
    const float x0 = __bfloat162float(v[a]), x1 = __bfloat162float(v[b]);
    v[a] = __float2bfloat16(x0 * c - x1 * s);
    v[b] = __float2bfloat16(x0 * s + x1 * c);
  }
}

}  // namespace

void rope_tables_bf16(void* x, int64_t rows, int64_t ld, int64_t n_heads, int64_t head_dim,
                      int64_t rope_dim, bool neox, const float* cos, const float* sin,
                      cudaStream_t stream) {
  const int64_t half = rope_dim / 2;
  const int64_t total = rows * n_heads * half;
  if (total == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535);
  TESSEL_CUDA_CHECK(detail::launch_dependent(
      rope_tables_kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, stream,
      static_cast<__nv_bfloat16*>(x), rows, ld, static_cast<int>(n_heads),
      static_cast<int>(head_dim), static_cast<int>(half), neox, cos, sin));
}

}  // namespace tessel::llm_engine
