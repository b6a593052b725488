// Device pieces shared by the small-M GEMM kernels (gemm_small_m.cu: register-streaming;
// gemm_small_m_ring.cu: bulk-copy ring): the m16n8k16 MMA, the fused SwiGLU activation of the
// down projection, and the epilogue (alpha, beta·C, output dtype). P is a kernel parameter
// struct with fields d, ldd, c, ldc, alpha, beta and out (0 f32, 1 f16, 2 bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace tessel::detail::small_m {

template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// 8 SwiGLU activations silu(g) * u of a 16-byte gate and up vector, rounded to T once: the
// same arithmetic as tessel::swiglu (src/ops/activation/activation.cu), so the fused down GEMM
// sees the bits the unfused activation would have written.
template <class T>
__device__ __forceinline__ uint4 swiglu8(const uint4& g, const uint4& u) {
  uint4 r;
  const T* gv = reinterpret_cast<const T*>(&g);
  const T* uv = reinterpret_cast<const T*>(&u);
  T* rv = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float x = static_cast<float>(gv[j]);
    const float f = x * __fdividef(1.f, 1.f + __expf(-x));
    rv[j] = static_cast<T>(f * static_cast<float>(uv[j]));
  }
  return r;
}

// 8 products x · w of a 16-byte activation and norm-weight vector, rounded to T once: the fused
// RMSNorm's A operand (its row scale is applied to the sums, gemm_small_m_rms).
template <class T>
__device__ __forceinline__ uint4 mul8(const uint4& x, const uint4& w) {
  uint4 r;
  const T* xv = reinterpret_cast<const T*>(&x);
  const T* wv = reinterpret_cast<const T*>(&w);
  T* rv = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int j = 0; j < 8; ++j) rv[j] = static_cast<T>(static_cast<float>(xv[j]) * static_cast<float>(wv[j]));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The fused RMSNorm's row scales (gemm_small_m_rms): s_r[i] = 1 / sqrt(mean_k a[i,k]² + eps)
// for i < m <= 32, computed by warps 0 … kWarps-1 of the CTA (`warp`, `lane`), which all call
// this; `sync` is a barrier of exactly those warps. Tokens are spread over the warps (several
// warps per token when m < kWarps), each warp's lanes sum 16-byte pieces (L2 reads: the
// previous kernel just wrote a), and each token's warp sums are added in warp order through
// s_part (32 · kWarps floats), so the result is deterministic. k % 8 == 0, rows 16-byte aligned.
// kUnroll: 16-byte loads in flight per lane (registers permitting).
template <class T, int kWarps, int kUnroll, class Sync>
__device__ __forceinline__ void row_rstd(const T* a, int64_t lda, int m, int k, float eps,
                                         int warp, int lane, float* s_part, float* s_r,
                                         Sync sync) {
  const int wpt = kWarps / (m < kWarps ? m : kWarps);  // warps per token
  const int groups = kWarps / wpt;
  const int sub = warp % wpt;
  const int pieces = k / 8;
  for (int tok = warp / wpt; tok < m; tok += groups) {
    const uint4* row = reinterpret_cast<const uint4*>(a + int64_t{tok} * lda);
    float s = 0.f;
#pragma unroll kUnroll
    for (int q = sub * 32 + lane; q < pieces; q += wpt * 32) {
      const uint4 v = __ldcg(row + q);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = static_cast<float>(e[j]);
        s = fmaf(f, f, s);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) s_part[tok * kWarps + sub] = s;
  }
  sync();
  if (warp == 0 && lane < m) {
    float s = 0.f;
    for (int j = 0; j < wpt; ++j) s += s_part[lane * kWarps + j];
    s_r[lane] = rsqrtf(s / static_cast<float>(k) + eps);
  }
  sync();
}

template <class P>
__device__ __forceinline__ void store_out(const P& p, int64_t idx_d, float v) {
  if (p.out == 0)
    static_cast<float*>(p.d)[idx_d] = v;
  else if (p.out == 1)
    static_cast<__half*>(p.d)[idx_d] = __float2half_rn(v);
  else
    static_cast<__nv_bfloat16*>(p.d)[idx_d] = __float2bfloat16_rn(v);
}

template <class P>
__device__ __forceinline__ float load_c(const P& p, int64_t idx) {
  if (p.out == 0) return static_cast<const float*>(p.c)[idx];
  if (p.out == 1) return __half2float(static_cast<const __half*>(p.c)[idx]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p.c)[idx]);
}

template <class P>
__device__ __forceinline__ void epilogue(const P& p, int token, int n, float v) {
  float r = p.alpha * v;
  if (p.c != nullptr) r += p.beta * load_c(p, int64_t{token} * p.ldc + n);
  store_out(p, int64_t{token} * p.ldd + n, r);
}

}  // namespace tessel::detail::small_m
