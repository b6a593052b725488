// Dropout with an in-kernel Philox 4x32-10: one call gives eight 16-bit uniforms, one per
// element (see dropout.hpp for the exact mask definition). Forward and backward are the same
// map: out = in · keep · scale, the mask regenerated from (seed, offset). Bytes: read n·s,
// write n·s (+ n with the u8 mask).
//
// Instruction budget: on an H200 (4.25 TB/s into 132 SMs) a bf16 element has ~14 issue slots
// at the copy rate. With one 32-bit word per element (4 elements per call) Philox alone took
// ~10 per element and the kernel ~30: issue-bound at 0.76 of copy. Eight elements per call,
// the round keys shared by a thread's calls, and a per-element select of the scale cut it to
// ~12.
#include <cmath>
#include <string>

#include "ops/rows.cuh"
#include "runtime/check.hpp"
#include "tessel/dropout.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 256;
constexpr int kGroup = 8;   // elements per Philox call
constexpr int kGroups = 2;  // groups per thread (their calls share the round keys)

struct DropParams {
  uint32_t k0, k1, o0, o1;  // key (seed) and the high counter words (offset)
  uint32_t thr;             // threshold << 16: w >= thr tests the high half of a word w,
                            // (w << 16) >= thr its low half
  float scale;
};

// N Philox 4x32-10 calls on counters {lo(g), hi(g), o0, o1}, the key schedule computed once.
template <int N>
__device__ __forceinline__ void philox(const DropParams& prm, const uint64_t (&g)[N], uint4 (&out)[N]) {
  uint32_t c0[N], c1[N], c2[N], c3[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    c0[i] = static_cast<uint32_t>(g[i]);
    c1[i] = static_cast<uint32_t>(g[i] >> 32);
    c2[i] = prm.o0;
    c3[i] = prm.o1;
  }
  uint32_t a = prm.k0, b = prm.k1;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      a += 0x9E3779B9u;
      b += 0xBB67AE85u;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const uint32_t hi0 = __umulhi(0xD2511F53u, c0[i]), lo0 = 0xD2511F53u * c0[i];
      const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2[i]), lo1 = 0xCD9E8D57u * c2[i];
      c0[i] = hi1 ^ c1[i] ^ a;
      c1[i] = lo1;
      c2[i] = hi0 ^ c3[i] ^ b;
      c3[i] = lo0;
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = make_uint4(c0[i], c1[i], c2[i], c3[i]);
}

__device__ __forceinline__ uint32_t word(const uint4& r, int k) {
  return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
}

// Element j (0..7) of a group: the low (j even) or high (j odd) 16 bits of word j / 2.
__device__ __forceinline__ bool keep_of(const DropParams& prm, const uint4& r, int j) {
  const uint32_t w = word(r, j >> 1);
  return ((j & 1) ? w : w << 16) >= prm.thr;
}

// The element at logical index e (scalar path and tails).
__device__ __forceinline__ bool keep_at(const DropParams& prm, uint64_t e) {
  const uint64_t g[1] = {e >> 3};
  uint4 r[1];
  philox<1>(prm, g, r);
  return keep_of(prm, r[0], static_cast<int>(e & 7));
}

// VEC: elements per 16-byte fragment (vector path: groups of 8 aligned elements) or 1.
template <class T, int VEC, bool MASK>
__global__ void __launch_bounds__(kBlock)
    dropout_kernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                   int64_t n, DropParams prm) {
  if constexpr (VEC > 1) {
    constexpr int F = kGroup / VEC;  // fragments per group
    const int64_t ngroups = n / kGroup;
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kGroups * kBlock + threadIdx.x;
    Frag<T, VEC> f[kGroups][F];
    uint64_t g[kGroups];
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      g[u] = static_cast<uint64_t>(g0 + u * kBlock);
      if (g0 + u * kBlock < ngroups) {
#pragma unroll
        for (int q = 0; q < F; ++q) f[u][q] = load_frag<VEC>(x + (g0 + u * kBlock) * kGroup + q * VEC);
      }
    }
    uint4 r[kGroups];
    philox<kGroups>(prm, g, r);
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      const int64_t gi = g0 + u * kBlock;
      if (gi >= ngroups) continue;
      Frag<uint8_t, kGroup> m;
#pragma unroll
      for (int q = 0; q < F; ++q) {
        Frag<T, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const bool keep = keep_of(prm, r[u], q * VEC + j);
          o.v[j] = from_f32<T>(to_f32(f[u][q].v[j]) * (keep ? prm.scale : 0.f));
          m.v[q * VEC + j] = keep ? 1 : 0;
        }
        store_frag<VEC>(y + gi * kGroup + q * VEC, o);
      }
      if constexpr (MASK) store_frag<kGroup>(mask + gi * kGroup, m);  // 8-byte aligned (checked)
    }
    // Tail of fewer than 8 elements.
    const int64_t t = ngroups * kGroup + threadIdx.x;
    if (blockIdx.x == 0 && t < n) {
      const bool keep = keep_at(prm, static_cast<uint64_t>(t));
      y[t] = from_f32<T>(to_f32(x[t]) * (keep ? prm.scale : 0.f));
      if constexpr (MASK) mask[t] = keep ? 1 : 0;
    }
  } else {
    const int64_t e = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
    if (e >= n) return;
    const bool keep = keep_at(prm, static_cast<uint64_t>(e));
    y[e] = from_f32<T>(to_f32(x[e]) * (keep ? prm.scale : 0.f));
    if constexpr (MASK) mask[e] = keep ? 1 : 0;
  }
}

void run(const char* op, const char* in_name, const char* out_name, const Tensor& x, Tensor& y,
         Tensor* mask, double p, uint64_t seed, uint64_t offset, cudaStream_t stream) {
  detail::OpCheck chk(op);
  if (!(p >= 0.0 && p <= 1.0))
    chk.fail("p", "a probability in [0, 1]", std::to_string(p));
  chk.dtype_in(in_name, x, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in(out_name, y, {DType::f32, DType::f16, DType::bf16});
  if (mask) chk.dtype_in("mask", *mask, {DType::u8});
  chk.same_dtype(out_name, y, in_name, x);
  chk.same_shape(out_name, y, in_name, x);
  if (mask) chk.same_shape("mask", *mask, in_name, x);
  chk.contiguous(in_name, x);
  chk.contiguous(out_name, y);
  if (mask) chk.contiguous("mask", *mask);
  const int64_t n = x.numel();
  if (n == 0) return;
  chk.device_pointer(in_name, x);
  chk.device_pointer(out_name, y);
  if (mask) chk.device_pointer("mask", *mask);
  uint8_t* mp = mask ? static_cast<uint8_t*>(mask->data) : nullptr;
  const int64_t thr = std::llround(p * 65536.0);
  if (thr >= 65536) {  // nothing kept (p = 1, or within 2^-17 of it): zeros, no RNG
    TESSEL_CUDA_CHECK(cudaMemsetAsync(y.data, 0, static_cast<size_t>(n) * dtype_size(y.dtype), stream));
    if (mask) TESSEL_CUDA_CHECK(cudaMemsetAsync(mp, 0, static_cast<size_t>(n), stream));
    return;
  }
  DropParams prm;
  prm.k0 = static_cast<uint32_t>(seed);
  prm.k1 = static_cast<uint32_t>(seed >> 32);
  prm.o0 = static_cast<uint32_t>(offset);
  prm.o1 = static_cast<uint32_t>(offset >> 32);
  prm.thr = static_cast<uint32_t>(thr) << 16;
  prm.scale = static_cast<float>(1.0 / (1.0 - p));
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const bool vec_ok = detail::aligned(x.data, 16) && detail::aligned(y.data, 16) &&
                        (!mask || detail::aligned(mp, kGroup));
    const T* xp = static_cast<const T*>(x.data);
    T* yp = static_cast<T*>(y.data);
    if (vec_ok) {
      const auto grid = static_cast<unsigned>(
          std::max<int64_t>(1, tile::ceil_div(n / kGroup, int64_t{kBlock} * kGroups)));
      if (mask) dropout_kernel<T, V, true><<<grid, kBlock, 0, stream>>>(xp, yp, mp, n, prm);
      else dropout_kernel<T, V, false><<<grid, kBlock, 0, stream>>>(xp, yp, mp, n, prm);
    } else {
      const auto grid = static_cast<unsigned>(tile::ceil_div(n, int64_t{kBlock}));
      if (mask) dropout_kernel<T, 1, true><<<grid, kBlock, 0, stream>>>(xp, yp, mp, n, prm);
      else dropout_kernel<T, 1, false><<<grid, kBlock, 0, stream>>>(xp, yp, mp, n, prm);
    }
  });
  detail::check_launch(op);
}

}  // namespace

void dropout(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t offset,
             cudaStream_t stream) {
  run("dropout", "x", "y", x, y, nullptr, p, seed, offset, stream);
}

void dropout_with_mask(const Tensor& x, Tensor& y, Tensor& mask, double p, uint64_t seed,
                       uint64_t offset, cudaStream_t stream) {
  run("dropout_with_mask", "x", "y", x, y, &mask, p, seed, offset, stream);
}

void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t offset,
                      cudaStream_t stream) {
  run("dropout_backward", "dy", "dx", dy, dx, nullptr, p, seed, offset, stream);
}

}  // namespace tessel
