// RoPE from host-built tables for the engine's GPU backend: one thread per rotated pair.
#include <cuda_bf16.h>

#include <algorithm>

#include "ops/llm_engine/rope_tables.hpp"
#include "ops/rope_rotate.cuh"
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
    const float2 y = ::tessel::detail::rope_rotate(__bfloat162float(v[a]), __bfloat162float(v[b]),
                                                   cos[r * half + i], sin[r * half + i]);
    v[a] = __float2bfloat16(y.x);
    v[b] = __float2bfloat16(y.y);
  }
}

// Cache row (page·page_size + token) of call row r, or -1 when it is not stored.
__device__ __forceinline__ int64_t cache_row(const RopeAppendArgs& a, int64_t r) {
  const int b = static_cast<int>(r / a.sq);
  const int64_t pos = static_cast<int64_t>(a.seqlens[b]) - a.sq + (r - int64_t{b} * a.sq);
  if (pos < 0) return -1;
  const int64_t j = pos / a.page_size;
  if (j >= a.max_pages) return -1;
  const int pg = a.block_table[b * a.table_stride + j];
  if (pg < 0 || pg >= a.num_pages) return -1;
  return int64_t{pg} * a.page_size + (pos - j * a.page_size);
}

// Threads [0, rot): one rotated pair of a q or k head (k pairs also go to the cache);
// threads [rot, rot + copy): one element of v, or of k past rope_dim, copied to the cache.
__global__ void rope_append_kernel(const __grid_constant__ RopeAppendArgs a) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const int half = a.rope_dim / 2, heads = a.hq + a.hkv;
  const int64_t kv_dim = int64_t{a.hkv} * a.head_dim;
  const int64_t rot = a.rows * heads * half;
  const int tail = a.head_dim - a.rope_dim;  // k elements past the rotary ones
  const int64_t copy = a.rows * a.hkv * (a.head_dim + tail);
  auto* qk = static_cast<__nv_bfloat16*>(a.qk);
  auto* kc = static_cast<__nv_bfloat16*>(a.k_cache);
  auto* vc = static_cast<__nv_bfloat16*>(a.v_cache);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < rot + copy;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (t < rot) {
      const int i = static_cast<int>(t % half);
      const int64_t rh = t / half;
      const int64_t r = rh / heads;
      const int h = static_cast<int>(rh - r * heads);
      __nv_bfloat16* x = qk + r * a.ld + int64_t{h} * a.head_dim;
      const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
      const float2 y =
          ::tessel::detail::rope_rotate(__bfloat162float(x[ia]), __bfloat162float(x[ib]),
                                        a.cos[r * half + i], a.sin[r * half + i]);
      const __nv_bfloat16 y0 = __float2bfloat16(y.x), y1 = __float2bfloat16(y.y);
      x[ia] = y0;
      x[ib] = y1;
      if (h >= a.hq) {
        const int64_t row = cache_row(a, r);
        if (row >= 0) {
          __nv_bfloat16* dst = kc + row * kv_dim + int64_t{h - a.hq} * a.head_dim;
          dst[ia] = y0;
          dst[ib] = y1;
        }
      }
    } else {
      const int64_t u = t - rot;
      const int per_head = a.head_dim + tail;
      const int e = static_cast<int>(u % per_head);
      const int64_t rh = u / per_head;
      const int64_t r = rh / a.hkv;
      const int h = static_cast<int>(rh - r * a.hkv);
      const int64_t row = cache_row(a, r);
      if (row < 0) continue;
      if (e < a.head_dim) {
        vc[row * kv_dim + int64_t{h} * a.head_dim + e] =
            v[r * a.v_ld + int64_t{h} * a.head_dim + e];
      } else {
        const int d = a.rope_dim + (e - a.head_dim);
        kc[row * kv_dim + int64_t{h} * a.head_dim + d] =
            qk[r * a.ld + int64_t{a.hq + h} * a.head_dim + d];
      }
    }
  }
}

}  // namespace

void rope_append_bf16(const RopeAppendArgs& a, cudaStream_t stream) {
  const int64_t tail = a.head_dim - a.rope_dim;
  const int64_t total =
      a.rows * (a.hq + a.hkv) * (a.rope_dim / 2) + a.rows * a.hkv * (a.head_dim + tail);
  if (total == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535);
  TESSEL_CUDA_CHECK(detail::launch_dependent(
      rope_append_kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, stream, a));
}

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
