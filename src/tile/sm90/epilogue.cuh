// GEMM epilogue through shared memory and TMA stores:
//
//   D = act(alpha · acc + bias) + beta · C        (bias (N,), C (M, N), act elementwise)
//
// act(alpha·acc + bias) is computed in fp32 from the accumulators and rounded once into the
// staged box; the residual beta·C is then added to the staged (rounded) values with
// coalesced 16-byte loads of C — for 16-bit outputs the same two roundings as PyTorch's
// `x + linear(h)`, for f32 outputs exact fp32 arithmetic.
//
// Each consumer warpgroup owns 64 rows of the tile and two staging boxes of 64 rows x 128
// bytes (tma.cuh: 64 bf16/f16 or 32 f32 columns, 128B swizzle). Per box: wait until the copy
// engine has read the box written two boxes ago, write this box's values from the WGMMA
// accumulators (one rounding, straight into the swizzled layout: conflict-free 4/8-byte
// stores), fence the async proxy, sync the warpgroup, and one thread issues the bulk tensor
// store. The warpgroup then goes on (next box, or the next tile's MMAs) while the copy engine
// drains the box: the epilogue costs a few register->shared stores per value instead of
// ~40 instructions of 64-bit address arithmetic per global store, and the copy engine clips
// rows and columns past (M, N).
//
// Accumulator layout (PTX ISA, wgmma .m64nNk16 D fragment; CuTe CLayout_64xN): thread
// (warp w, lane l) holds, for n8 block j, values 4j+{0,1} at row 16w + l/4, columns
// 8j + 2(l%4) + {0,1}, and values 4j+{2,3} eight rows below.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "tile/sm90/tma.cuh"

namespace tessel::tile::sm90 {

enum class OutType : int { f32 = 0, f16 = 1, bf16 = 2 };
// Elementwise activation after alpha and bias. gelu_tanh uses x·σ(2z) = 0.5·x·(1 + tanh z).
enum class Act : int { none = 0, relu = 1, gelu_tanh = 2, gelu = 3, silu = 4 };

struct EpilogueParams {
  const void* c = nullptr;  // same dtype as d; read only when beta != 0
  int64_t ldc = 0;
  int64_t c_batch = 0;         // elements between batches of c
  const void* bias = nullptr;  // (N,): f32, or d's dtype
  bool bias_f32 = false;
  float alpha = 1.f;
  float beta = 0.f;
  OutType out = OutType::bf16;
  Act act = Act::none;
  // D itself, for the columns of a tile that fill no whole store box (BN % box width, e.g. the
  // last 32 of a 96-wide tile of 16-bit outputs): stored directly from registers.
  void* d = nullptr;
  int64_t ldd = 0;
  int64_t d_batch = 0;
};

// Bias of column `col` as f32 (bias is f32 or d's dtype).
__device__ __forceinline__ float load_bias(const EpilogueParams& p, int col) {
  if (p.bias_f32) return static_cast<const float*>(p.bias)[col];
  if (p.out == OutType::f16) return __half2float(static_cast<const __half*>(p.bias)[col]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[col]);
}

// Scalar activation (K = 0 path and references; the tile epilogue uses the modes below).
__device__ __forceinline__ float activate(float x, Act a) {
  switch (a) {
    case Act::relu: return fmaxf(x, 0.f);
    case Act::gelu_tanh: {
      // 2·sqrt(2/pi)·(x + 0.044715·x^3)
      const float u = x * fmaf(0.07135481627260025f, x * x, 1.5957691216057308f);
      return __fdividef(x, 1.f + __expf(-u));
    }
    case Act::gelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case Act::silu: return __fdividef(x, 1.f + __expf(-x));
    default: return x;
  }
}

// Per-tile epilogue modes: one straight-line loop body each, chosen once per tile (a switch
// per element compiled to indirect branches and cost more than the MMAs it followed).
//   linear : alpha·acc + bias         relu : max(., 0)
//   sigmoid: v·σ(k1·v + k3·v³)  (gelu_tanh: k1 = 2·sqrt(2/pi), k3 = k1·0.044715; silu: 1, 0)
//   erf    : 0.5·v·(1 + erf(v/√2))
enum class EpiMode : int { linear = 0, relu = 1, sigmoid = 2, erf = 3 };

template <class TOut>
struct OutPair;
template <>
struct OutPair<float> {
  __device__ static void store(char* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  }
  __device__ static float2 load(const void* p) { return *static_cast<const float2*>(p); }
  // 16 bytes of the box (4 values) += beta · 16 bytes of C
  __device__ static uint4 axpy(uint4 box, uint4 c, float beta) {
    float4 v = *reinterpret_cast<float4*>(&box);
    const float4 w = *reinterpret_cast<float4*>(&c);
    v.x = fmaf(beta, w.x, v.x);
    v.y = fmaf(beta, w.y, v.y);
    v.z = fmaf(beta, w.z, v.z);
    v.w = fmaf(beta, w.w, v.w);
    return *reinterpret_cast<uint4*>(&v);
  }
};
template <class T2, float2 (*Unpack)(T2), T2 (*Pack)(float2)>
__device__ __forceinline__ uint4 axpy16(uint4 box, uint4 c, float beta) {
  uint32_t* b = reinterpret_cast<uint32_t*>(&box);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&c);
  CUTE_UNROLL
  for (int i = 0; i < 4; ++i) {
    const float2 x = Unpack(*reinterpret_cast<const T2*>(b + i));
    const float2 y = Unpack(*reinterpret_cast<const T2*>(w + i));
    const T2 r = Pack(make_float2(fmaf(beta, y.x, x.x), fmaf(beta, y.y, x.y)));
    b[i] = *reinterpret_cast<const uint32_t*>(&r);
  }
  return box;
}
__device__ __forceinline__ float2 unpack_h2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ __half2 pack_h2(float2 v) { return __float22half2_rn(v); }
__device__ __forceinline__ float2 unpack_b2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ __nv_bfloat162 pack_b2(float2 v) { return __float22bfloat162_rn(v); }
template <>
struct OutPair<__half> {
  __device__ static void store(char* p, float x, float y) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
  }
  __device__ static float2 load(const void* p) {
    return __half22float2(*static_cast<const __half2*>(p));
  }
  __device__ static uint4 axpy(uint4 box, uint4 c, float beta) {
    return axpy16<__half2, unpack_h2, pack_h2>(box, c, beta);
  }
};
template <>
struct OutPair<__nv_bfloat16> {
  __device__ static void store(char* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
  }
  __device__ static float2 load(const void* p) {
    return __bfloat1622float2(*static_cast<const __nv_bfloat162*>(p));
  }
  __device__ static uint4 axpy(uint4 box, uint4 c, float beta) {
    return axpy16<__nv_bfloat162, unpack_b2, pack_b2>(box, c, beta);
  }
};

// Out of line: erff inlined 128 times per tile variant tripled the kernels' code and compile
// time for a rarely used mode.
static __device__ __noinline__ float gelu_erf(float v) {
  return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
}

// tanh.approx.f32 (one MUFU op, relative error ~2^-11): below the rounding of 16-bit outputs.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// kTanh (16-bit outputs): v·σ(u) = h + h·tanh(u/2) with h = v/2 — one MUFU op and ~6
// instructions; k1, k3 are then already halved. Else (f32 outputs) __expf + __fdividef, two
// MUFU ops, accurate to a few fp32 ulps.
template <EpiMode MODE, bool kTanh>
__device__ __forceinline__ float apply(float v, float k1, float k3) {
  if constexpr (MODE == EpiMode::relu)
    return fmaxf(v, 0.f);
  else if constexpr (MODE == EpiMode::sigmoid) {
    if constexpr (kTanh) {
      const float h = 0.5f * v;
      return fmaf(h, tanh_approx(v * fmaf(k3, v * v, k1)), h);
    } else {
      return __fdividef(v, 1.f + __expf(-v * fmaf(k3, v * v, k1)));
    }
  } else if constexpr (MODE == EpiMode::erf)
    return gelu_erf(v);
  else
    return v;
}

// Named barrier over the 128 threads of one warpgroup (ids 1.. ; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// Per consumer warpgroup state of the store pipeline.
struct EpilogueCtx {
  const CUtensorMap* desc;  // D: (L, M, N), boxes of 64 rows x 128 bytes
  char* buf;                // this warpgroup's two boxes (shared memory, 1024-aligned)
  int parity;               // box to write next
  int tid;                  // thread in the warpgroup
  int barrier;              // named barrier id of the warpgroup
};

// sbias: the tile's BN bias values as f32 in shared memory (0 past N), or nullptr.
template <class TOut, int BN, EpiMode MODE, class Acc>
__device__ __forceinline__ void store_tile_as(const Acc& acc, const EpilogueParams& p,
                                              EpilogueCtx& e, int row0, int col0, int batch, int M,
                                              int N, const float* sbias, float k1, float k3) {
  constexpr int ES = sizeof(TOut);
  constexpr int CW = 128 / ES;  // columns per box
  constexpr int VE = 16 / ES;   // elements per 16-byte vector
  static_assert(BN % 8 == 0, "tile width a multiple of the fragment's 8 columns");
  const int lane = e.tid & 31;
  const int r = 16 * (e.tid >> 5) + (lane >> 2);  // row in the box of values 4j, 4j+1
  const int sw = lane >> 2;                       // r % 8: the swizzle of rows r and r + 8
  const int q4 = lane & 3;
  const bool use_c = p.beta != 0.f;
  constexpr bool kTanh = ES == 2;
  if constexpr (kTanh) {
    k1 *= 0.5f;
    k3 *= 0.5f;
  }
  CUTE_UNROLL
  for (int c = 0; c < BN / CW; ++c) {
    const int cc0 = col0 + c * CW;
    if (cc0 >= N) break;
    // Loads first (bias pairs from shared memory; C vectors: coalesced rows of 128 bytes),
    // so their latency overlaps the wait for the box.
    float2 bv[CW / 8];
    CUTE_UNROLL
    for (int jl = 0; jl < CW / 8; ++jl)
      bv[jl] = sbias ? *reinterpret_cast<const float2*>(sbias + c * CW + 8 * jl + 2 * q4)
                     : make_float2(0.f, 0.f);
    uint4 cvec[4];
    if (use_c) {
      CUTE_UNROLL
      for (int it = 0; it < 4; ++it) {
        const int idx = e.tid + 128 * it, vr = idx >> 3, vq = idx & 7;
        const int row = row0 + vr, col = cc0 + vq * VE;
        cvec[it] = make_uint4(0u, 0u, 0u, 0u);
        if (row < M && col < N)
          cvec[it] =
              *reinterpret_cast<const uint4*>(static_cast<const TOut*>(p.c) + batch * p.c_batch +
                                              static_cast<int64_t>(row) * p.ldc + col);
      }
    }
    if (e.tid == 0) cute::tma_store_wait<1>();  // the box written two boxes ago was read
    warpgroup_sync(e.barrier);
    char* b = e.buf + e.parity * kStoreBoxBytes;
    CUTE_UNROLL
    for (int jl = 0; jl < CW / 8; ++jl) {
      const int j = c * (CW / 8) + jl;
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const float x = apply<MODE, kTanh>(fmaf(p.alpha, acc(4 * j + 2 * h), bv[jl].x), k1, k3);
        const float y = apply<MODE, kTanh>(fmaf(p.alpha, acc(4 * j + 2 * h + 1), bv[jl].y), k1, k3);
        const int rr = r + 8 * h;
        int off;
        if constexpr (ES == 2)
          off = rr * 128 + ((jl ^ sw) << 4) + 4 * q4;
        else
          off = rr * 128 + (((2 * jl + (q4 >> 1)) ^ sw) << 4) + 8 * (q4 & 1);
        OutPair<TOut>::store(b + off, x, y);
      }
    }
    if (use_c) {  // residual: box += beta · C, 16 bytes per thread and step
      warpgroup_sync(e.barrier);
      CUTE_UNROLL
      for (int it = 0; it < 4; ++it) {
        const int idx = e.tid + 128 * it, vr = idx >> 3, vq = idx & 7;
        uint4* v = reinterpret_cast<uint4*>(b + vr * 128 + ((vq ^ (vr & 7)) << 4));
        *v = OutPair<TOut>::axpy(*v, cvec[it], p.beta);
      }
    }
    cute::tma_store_fence();  // generic-proxy smem writes -> visible to the copy engine
    warpgroup_sync(e.barrier);
    if (e.tid == 0) {
      tma_store_box(e.desc, b, cc0, row0, batch);
      cute::tma_store_arrive();
    }
    e.parity ^= 1;
  }
  if constexpr (BN % CW != 0) {
    // The columns past the last whole box: a box there would overwrite the next tile's
    // columns, so each thread stores its pairs (rows r, r + 8; columns 8j + 2q4, + 1) directly.
    // Rounding as above: alpha·acc + bias, the activation, rounded to TOut; then + beta·C.
    TOut* dbase = static_cast<TOut*>(p.d) + batch * p.d_batch;
    const TOut* cbase = static_cast<const TOut*>(p.c) + batch * p.c_batch;
    CUTE_UNROLL
    for (int j = (BN / CW) * (CW / 8); j < BN / 8; ++j) {
      const int col = col0 + 8 * j + 2 * q4;  // N is a multiple of 8: col + 1 < N too
      if (col >= N) continue;
      const float2 bj =
          sbias ? *reinterpret_cast<const float2*>(sbias + 8 * j + 2 * q4) : make_float2(0.f, 0.f);
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + r + 8 * h;
        if (row >= M) continue;
        const float x = apply<MODE, kTanh>(fmaf(p.alpha, acc(4 * j + 2 * h), bj.x), k1, k3);
        const float y = apply<MODE, kTanh>(fmaf(p.alpha, acc(4 * j + 2 * h + 1), bj.y), k1, k3);
        static_assert(ES == 2, "f32 tiles are whole 32-column boxes");
        uint32_t pair;  // the two rounded outputs
        OutPair<TOut>::store(reinterpret_cast<char*>(&pair), x, y);
        if (use_c) {
          const float2 v = OutPair<TOut>::load(&pair);
          const float2 cv = OutPair<TOut>::load(cbase + static_cast<int64_t>(row) * p.ldc + col);
          OutPair<TOut>::store(reinterpret_cast<char*>(&pair), fmaf(p.beta, cv.x, v.x),
                               fmaf(p.beta, cv.y, v.y));
        }
        *reinterpret_cast<uint32_t*>(dbase + static_cast<int64_t>(row) * p.ldd + col) = pair;
      }
    }
  }
}

template <class TOut, int BN, class Acc>
__device__ __forceinline__ void store_tile_out(const Acc& acc, const EpilogueParams& p,
                                               EpilogueCtx& e, int row0, int col0, int batch, int M,
                                               int N, const float* sb) {
  switch (p.act) {
    case Act::none:
      store_tile_as<TOut, BN, EpiMode::linear>(acc, p, e, row0, col0, batch, M, N, sb, 0.f, 0.f);
      break;
    case Act::relu:
      store_tile_as<TOut, BN, EpiMode::relu>(acc, p, e, row0, col0, batch, M, N, sb, 0.f, 0.f);
      break;
    case Act::gelu_tanh:
      store_tile_as<TOut, BN, EpiMode::sigmoid>(acc, p, e, row0, col0, batch, M, N, sb,
                                                1.5957691216057308f, 0.07135481627260025f);
      break;
    case Act::silu:
      store_tile_as<TOut, BN, EpiMode::sigmoid>(acc, p, e, row0, col0, batch, M, N, sb, 1.f, 0.f);
      break;
    case Act::gelu:
      store_tile_as<TOut, BN, EpiMode::erf>(acc, p, e, row0, col0, batch, M, N, sb, 0.f, 0.f);
      break;
  }
}

// acc: the warpgroup's 64 x BN fp32 accumulators; row0/col0: the warpgroup's first output
// row and column (row0 < M); sbias: the tile's bias (shared memory, f32) or nullptr.
template <int BN, class Acc>
__device__ __forceinline__ void store_tile(const Acc& acc, const EpilogueParams& p, EpilogueCtx& e,
                                           int row0, int col0, int batch, int M, int N,
                                           const float* sbias) {
  switch (p.out) {
    case OutType::f32: store_tile_out<float, BN>(acc, p, e, row0, col0, batch, M, N, sbias); break;
    case OutType::f16: store_tile_out<__half, BN>(acc, p, e, row0, col0, batch, M, N, sbias); break;
    case OutType::bf16:
      store_tile_out<__nv_bfloat16, BN>(acc, p, e, row0, col0, batch, M, N, sbias);
      break;
  }
}

// Before the CTA exits: the copy engine has finished reading every staged box.
__device__ __forceinline__ void store_drain(const EpilogueCtx& e) {
  if (e.tid == 0) cute::tma_store_wait<0>();
}

}  // namespace tessel::tile::sm90
