// Register epilogue: D = alpha * acc + beta * C, straight from WGMMA accumulators to global
// memory. Accumulator values 2i and 2i+1 of a thread are adjacent columns (GMMA C layout),
// so each store is a 2-element vector (4 bytes for bf16/fp16, 8 for f32); rows and columns
// past (M, N) are skipped, so any M works and N only needs to be even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>

#include <cstdint>

namespace tessel::tile::sm90 {

enum class OutType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct EpilogueParams {
  void* d = nullptr;
  const void* c = nullptr;  // same dtype as d; read only when beta != 0
  int64_t ldd = 0;
  int64_t ldc = 0;
  float alpha = 1.f;
  float beta = 0.f;
  OutType out = OutType::bf16;
};

template <class T2>
__device__ __forceinline__ T2 pack2(float x, float y);
template <>
__device__ __forceinline__ float2 pack2<float2>(float x, float y) { return make_float2(x, y); }
template <>
__device__ __forceinline__ __half2 pack2<__half2>(float x, float y) { return __floats2half2_rn(x, y); }
template <>
__device__ __forceinline__ __nv_bfloat162 pack2<__nv_bfloat162>(float x, float y) {
  return __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ float2 unpack2(float2 v) { return v; }
__device__ __forceinline__ float2 unpack2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 unpack2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

// acc and coords are the thread's accumulator fragment and its (row, col) within the tile.
template <class T2, class Acc, class Coords>
__device__ __forceinline__ void store_tile_as(const Acc& acc, const Coords& coords,
                                              const EpilogueParams& p, int m0, int n0, int M, int N) {
  T2* d = static_cast<T2*>(p.d);
  const T2* c = static_cast<const T2*>(p.c);
  const bool use_c = p.beta != 0.f;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc); i += 2) {
    const int row = m0 + cute::get<0>(coords(i));
    const int col = n0 + cute::get<1>(coords(i));
    if (row < M && col < N) {
      float x = p.alpha * acc(i), y = p.alpha * acc(i + 1);
      if (use_c) {
        const float2 cv = unpack2(c[(row * p.ldc + col) / 2]);
        x = fmaf(p.beta, cv.x, x);
        y = fmaf(p.beta, cv.y, y);
      }
      d[(row * p.ldd + col) / 2] = pack2<T2>(x, y);
    }
  }
}

template <class Acc, class Coords>
__device__ __forceinline__ void store_tile(const Acc& acc, const Coords& coords,
                                           const EpilogueParams& p, int m0, int n0, int M, int N) {
  switch (p.out) {
    case OutType::f32: store_tile_as<float2>(acc, coords, p, m0, n0, M, N); break;
    case OutType::f16: store_tile_as<__half2>(acc, coords, p, m0, n0, M, N); break;
    case OutType::bf16: store_tile_as<__nv_bfloat162>(acc, coords, p, m0, n0, M, N); break;
  }
}

}  // namespace tessel::tile::sm90
