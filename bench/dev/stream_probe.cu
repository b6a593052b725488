// Development probe (not part of the build): which load / store forms stream fastest on this
// GPU. A plain 16-byte copy kernel in several variants against cudaMemcpy on the same 512 MiB
// buffers (bigger than L2 tenfold), CUDA events, median of 25 after warm-up.
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/dev/stream_probe.cu
//
// Variants (loads / stores; U = 16-byte vectors per thread per iteration, in flight together):
//   plain      ld.global.v4 / st.global.v4
//   nc256      ld.global.nc.L1::no_allocate.L2::256B (L2 fetches 256-byte lines ahead)
//   cs         plain loads, st.global.cs (streaming: evict-first in L2)
//   nc256cs    both
//   ef         ld.global.L2::evict_first (createpolicy) / plain stores
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "probe_util.cuh"

enum Ld { kLdPlain, kLdNc256, kLdEvictFirst };
enum St { kStPlain, kStCs };

template <int L>
__device__ __forceinline__ uint4 load16(const uint4* p, uint64_t pol) {
  uint4 v;
  if constexpr (L == kLdPlain) {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else if constexpr (L == kLdNc256) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
  }
  return v;
}

template <int S>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
  if constexpr (S == kStPlain)
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
  else
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}

// Grid-stride over chunks of U vectors per thread (the U loads issue before any store).
template <int L, int S, int U>
__global__ void __launch_bounds__(256)
    copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  uint64_t pol = 0;
  if constexpr (L == kLdEvictFirst)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * U;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x * U + threadIdx.x; base < n;
       base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t{u} * blockDim.x;
      if (i < n) v[u] = load16<L>(in + i, pol);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t{u} * blockDim.x;
      if (i < n) store16<S>(out + i, v[u]);
    }
  }
}

int main() {
  const size_t bytes = size_t{512} << 20;
  const int64_t n = bytes / 16;
  void *in = nullptr, *out = nullptr;
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  CK(cudaMemset(in, 1, bytes));
  CK(cudaMemset(out, 0, bytes));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto gbs = [&](float ms) { return 2.0 * bytes / (ms * 1e-3) / 1e9; };
  const float memcpy_ms =
      median_ms([&] { cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice); }, a, b);
  std::printf("cudaMemcpy                 %8.1f GB/s\n", gbs(memcpy_ms));
  auto run = [&](const char* name, auto kernel, int U) {
    for (int per_sm : {4, 8, 16, 0}) {  // 0: one thread per U vectors (no grid stride)
      const int64_t full = (n + 256 * U - 1) / (256 * U);
      const int grid = per_sm ? sms * per_sm : static_cast<int>(full);
      const float ms = median_ms(
          [&] {
            kernel<<<grid, 256>>>(static_cast<const uint4*>(in), static_cast<uint4*>(out), n);
          },
          a, b);
      std::printf("%-10s U=%d ctas/SM %-4s %8.1f GB/s  %.3f of memcpy\n", name, U,
                  per_sm ? std::to_string(per_sm).c_str() : "all", gbs(ms), memcpy_ms / ms);
    }
  };
  run("plain", copy_kernel<kLdPlain, kStPlain, 1>, 1);
  run("plain", copy_kernel<kLdPlain, kStPlain, 4>, 4);
  run("nc256", copy_kernel<kLdNc256, kStPlain, 1>, 1);
  run("nc256", copy_kernel<kLdNc256, kStPlain, 4>, 4);
  run("cs", copy_kernel<kLdPlain, kStCs, 4>, 4);
  run("nc256cs", copy_kernel<kLdNc256, kStCs, 4>, 4);
  run("ef", copy_kernel<kLdEvictFirst, kStPlain, 4>, 4);
  run("efcs", copy_kernel<kLdEvictFirst, kStCs, 4>, 4);
  CK(cudaGetLastError());
  std::printf(
      "memcpy again               %8.1f GB/s\n",
      gbs(median_ms([&] { cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice); }, a, b)));
  return 0;
}
