// Dropout with an in-kernel Philox 4x32-10 (one call per 4 elements; see dropout.hpp for the
// exact mask definition). Forward and backward are the same map: out = in · keep · scale,
// the mask regenerated from (seed, offset). Bytes: read n·s, write n·s (+ n with the u8 mask).
#include <cmath>
#include <string>

#include "ops/rows.cuh"
#include "tessel/dropout.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 256;
constexpr int kUnroll = 2;

struct Philox {
  uint32_t k0, k1, o0, o1;  // key (seed) and the high counter words (offset)
  __device__ __forceinline__ uint4 operator()(uint64_t g) const {
    uint32_t c0 = static_cast<uint32_t>(g), c1 = static_cast<uint32_t>(g >> 32), c2 = o0, c3 = o1;
    uint32_t a = k0, b = k1;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
      if (r > 0) {
        a += 0x9E3779B9u;
        b += 0xBB67AE85u;
      }
      const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
      const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
      c0 = hi1 ^ c1 ^ a;
      c1 = lo1;
      c2 = hi0 ^ c3 ^ b;
      c3 = lo0;
    }
    return make_uint4(c0, c1, c2, c3);
  }
};

__device__ __forceinline__ uint32_t word(const uint4& r, int k) {
  return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
}

struct DropParams {
  Philox rng;
  uint32_t threshold;  // keep iff (r >> 8) >= threshold
  float scale;
};

// VEC is a multiple of 4 (vector path: one Philox call per 4 elements, aligned groups) or 1.
template <class T, int VEC, bool MASK>
__global__ void __launch_bounds__(kBlock)
    dropout_kernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                   int64_t n, DropParams prm) {
  const int64_t nvec = n / VEC;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kUnroll * kBlock + threadIdx.x;
  Frag<T, VEC> f[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = base + u * kBlock;
    if (v < nvec) f[u] = load_frag<VEC>(x + v * VEC);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = base + u * kBlock;
    if (v >= nvec) continue;
    const int64_t e0 = v * VEC;
    uint32_t keep_bits = 0;
    if constexpr (VEC % 4 == 0) {
#pragma unroll
      for (int q = 0; q < VEC / 4; ++q) {
        const uint4 r = prm.rng(static_cast<uint64_t>(e0 / 4 + q));
#pragma unroll
        for (int k = 0; k < 4; ++k) keep_bits |= uint32_t((word(r, k) >> 8) >= prm.threshold) << (q * 4 + k);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint64_t e = static_cast<uint64_t>(e0 + j);
        keep_bits |= uint32_t((word(prm.rng(e >> 2), static_cast<int>(e & 3)) >> 8) >= prm.threshold) << j;
      }
    }
    Frag<T, VEC> o;
    Frag<uint8_t, VEC> m;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const bool keep = (keep_bits >> j) & 1u;
      o.v[j] = from_f32<T>(keep ? to_f32(f[u].v[j]) * prm.scale : 0.f);
      m.v[j] = keep ? 1 : 0;
    }
    store_frag<VEC>(y + e0, o);
    if constexpr (MASK) {
      if constexpr (VEC >= 4) store_frag<VEC>(mask + e0, m);  // VEC-byte aligned (checked)
      else mask[e0] = m.v[0];
    }
  }
  // Tail of fewer than VEC elements (vector path only).
  if constexpr (VEC > 1) {
    const int64_t t = nvec * VEC + threadIdx.x;
    if (blockIdx.x == 0 && t < n) {
      const bool keep = (word(prm.rng(static_cast<uint64_t>(t) >> 2), static_cast<int>(t & 3)) >> 8) >= prm.threshold;
      y[t] = from_f32<T>(keep ? to_f32(x[t]) * prm.scale : 0.f);
      if constexpr (MASK) mask[t] = keep ? 1 : 0;
    }
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
  DropParams prm;
  prm.rng = Philox{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                   static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  prm.threshold = static_cast<uint32_t>(std::llround(p * 16777216.0));
  prm.scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.f;
  uint8_t* mp = mask ? static_cast<uint8_t*>(mask->data) : nullptr;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const bool vec_ok = detail::aligned(x.data, 16) && detail::aligned(y.data, 16) &&
                        (!mask || detail::aligned(mp, V));
    const T* xp = static_cast<const T*>(x.data);
    T* yp = static_cast<T*>(y.data);
    auto grid = [&](int vec) {
      return static_cast<unsigned>(std::max<int64_t>(1, tile::ceil_div(n / vec, int64_t{kBlock} * kUnroll)));
    };
    if (vec_ok) {
      if (mask) dropout_kernel<T, V, true><<<grid(V), kBlock, 0, stream>>>(xp, yp, mp, n, prm);
      else dropout_kernel<T, V, false><<<grid(V), kBlock, 0, stream>>>(xp, yp, mp, n, prm);
    } else {
      if (mask) dropout_kernel<T, 1, true><<<grid(1), kBlock, 0, stream>>>(xp, yp, mp, n, prm);
      else dropout_kernel<T, 1, false><<<grid(1), kBlock, 0, stream>>>(xp, yp, mp, n, prm);
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
