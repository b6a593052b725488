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
//   el         ld.global.L1::evict_last.L2::cache_hint, an L2 evict_last policy (createpolicy)
//   el1        ld.global.L1::evict_last (no L2 hint)
//   el2        ld.global.L2::cache_hint, an L2 evict_last policy
// (torch.compile's concat kernel loads with Triton's eviction_policy='evict_last'; session 34)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "probe_util.cuh"

enum Ld {
  kLdPlain,
  kLdNc256,
  kLdEvictFirst,
  kLdEvictLast,
  kLdEvictLastL1,
  kLdEvictLastL2,
  kLdEvictUnchanged,
  kLdEvictNormal,
  kLdEvictLastReset,  // el, then each 128-byte line set back to evict_normal (applypriority)
  kLdEvictLastHalf    // an L2 evict_last policy on half the lines (fraction 0.5)
};
enum St { kStPlain, kStCs, kStEvictFirst };

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
  } else if constexpr (L == kLdEvictLast) {
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
  } else if constexpr (L == kLdEvictLastL1) {
    asm volatile("ld.global.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {  // an L2 policy (evict_first / evict_last / unchanged / normal, fraction)
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    if constexpr (L == kLdEvictLastReset)  // each 128-byte line back to evict_normal
      if ((threadIdx.x & 7) == 0)
        asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p) : "memory");
  }
  return v;
}

template <int S>
__device__ __forceinline__ void store16(uint4* p, uint4 v, uint64_t spol = 0) {
  if constexpr (S == kStPlain)
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
  else if constexpr (S == kStCs)
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
  else
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w), "l"(spol)
                 : "memory");
}

// Grid-stride over chunks of U vectors per thread (the U loads issue before any store).
template <int L, int S, int U>
__global__ void __launch_bounds__(256)
    copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  uint64_t pol = 0, spol = 0;
  if constexpr (S == kStEvictFirst)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(spol));
  if constexpr (L == kLdEvictFirst)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  if constexpr (L == kLdEvictLast || L == kLdEvictLastL2 || L == kLdEvictLastReset)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  if constexpr (L == kLdEvictLastHalf)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 0.5;" : "=l"(pol));
  if constexpr (L == kLdEvictUnchanged)
    asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(pol));
  if constexpr (L == kLdEvictNormal)
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
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
      if (i < n) store16<S>(out + i, v[u], spol);
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
  run("el", copy_kernel<kLdEvictLast, kStPlain, 1>, 1);
  run("el", copy_kernel<kLdEvictLast, kStPlain, 4>, 4);
  run("el1", copy_kernel<kLdEvictLastL1, kStPlain, 1>, 1);
  run("el1", copy_kernel<kLdEvictLastL1, kStPlain, 4>, 4);
  run("el2", copy_kernel<kLdEvictLastL2, kStPlain, 4>, 4);
  run("elcs", copy_kernel<kLdEvictLast, kStCs, 4>, 4);
  run("plain", copy_kernel<kLdPlain, kStPlain, 4>, 4);  // again: drift within the run
  CK(cudaGetLastError());
  // Do evict_last loads survive the harness's read flush (L2 hits in the next timed run)? A
  // 128 MiB copy timed (a) after a 2x-L2 read flush, on one buffer pair; (b) rotating over 8
  // pairs (1 GiB each way: no reuse within L2). An advantage of el in (a) only is an artifact.
  {
    const size_t cb = size_t{128} << 20;
    const int64_t cn = cb / 16;
    const int kPairs = 8;
    std::vector<uint4*> ins(kPairs), outs(kPairs);
    for (int p = 0; p < kPairs; ++p) {
      CK(cudaMalloc(&ins[p], cb));
      CK(cudaMalloc(&outs[p], cb));
      CK(cudaMemset(ins[p], 3, cb));
    }
    ReadFlush flush;
    CK(flush.init());
    const int grid = static_cast<int>((cn + 256 * 4 - 1) / (256 * 4));
    auto timed = [&](auto kernel, bool rotate) {
      const float ms = median_ms_after(
          [&](int) {
            if (!rotate) flush.run();
          },
          [&](int i) {
            const int p = rotate ? i % kPairs : 0;
            kernel<<<grid, 256>>>(ins[p], outs[p], cn);
          },
          a, b, 40);
      return 2.0 * cb / (ms * 1e-3) / 1e9;
    };
    for (int round = 0; round < 2; ++round)
      for (bool rotate : {false, true}) {
        const double p4 = timed(copy_kernel<kLdPlain, kStPlain, 4>, rotate);
        const double e4 = timed(copy_kernel<kLdEvictLast, kStPlain, 4>, rotate);
        const double e2 = timed(copy_kernel<kLdEvictLastL2, kStPlain, 4>, rotate);
        const double r4 = timed(copy_kernel<kLdEvictLastReset, kStPlain, 4>, rotate);
        const double h4 = timed(copy_kernel<kLdEvictLastHalf, kStPlain, 4>, rotate);
        const double f4 = timed(copy_kernel<kLdPlain, kStEvictFirst, 4>, rotate);
        std::printf(
            "128 MiB %-8s plain %7.1f  el %7.1f (%.3f)  el2 %7.1f (%.3f)  el+reset %7.1f (%.3f)  "
            "el0.5 %7.1f (%.3f)  st-ef %7.1f (%.3f) GB/s\n",
            rotate ? "rotate" : "flushed", p4, e4, e4 / p4, e2, e2 / p4, r4, r4 / p4, h4, h4 / p4,
            f4, f4 / p4);
      }
    // Side effect: after a 128 MiB copy, a 24 MiB buffer is read twice; the second read's rate
    // says how much of it stayed in L2 (lines the copy left marked evict_last may crowd it out).
    int64_t wn = (int64_t{24} << 20) / 16;
    // reset: cudaCtxResetPersistingL2Cache() between the copy and the first read.
    auto reread = [&](auto kernel, bool copy, bool reset = false) {
      const float ms = median_ms_after(
          [&](int i) {
            if (copy) kernel<<<grid, 256>>>(ins[i % kPairs], outs[i % kPairs], cn);
            if (reset) cudaCtxResetPersistingL2Cache();
            flush.run(wn);
          },
          [&](int) { flush.run(wn); }, a, b);
      return 16.0 * wn / (ms * 1e-3) / 1e9;
    };
    for (int mib : {12, 24, 12, 24})
      wn = (int64_t{mib} << 20) / 16, std::printf("%d MiB re-read GB/s:", mib),
      std::printf(
          " alone %7.1f  after plain copy %7.1f  after el copy %7.1f  "
          "after el+reset %7.1f  after el0.5 %7.1f  after st-ef %7.1f\n",
          reread(copy_kernel<kLdPlain, kStPlain, 4>, false),
          reread(copy_kernel<kLdPlain, kStPlain, 4>, true),
          reread(copy_kernel<kLdEvictLast, kStPlain, 4>, true),
          reread(copy_kernel<kLdEvictLastReset, kStPlain, 4>, true),
          reread(copy_kernel<kLdEvictLastHalf, kStPlain, 4>, true),
          reread(copy_kernel<kLdPlain, kStEvictFirst, 4>, true));
    // Does a streaming copy itself slow down after a kernel that left evict_last lines behind
    // (the harness's read flush does not evict them)? A plain 128 MiB copy timed after the read
    // flush, preceded by: a plain copy of another pair; an el copy; an el copy and
    // cudaCtxResetPersistingL2Cache().
    auto after = [&](int pre) {
      const float ms = median_ms_after(
          [&](int) {
            if (pre == 0) copy_kernel<kLdPlain, kStPlain, 4><<<grid, 256>>>(ins[1], outs[1], cn);
            if (pre >= 1)
              copy_kernel<kLdEvictLast, kStPlain, 4><<<grid, 256>>>(ins[1], outs[1], cn);
            if (pre == 2) cudaCtxResetPersistingL2Cache();
            flush.run();
          },
          [&](int) { copy_kernel<kLdPlain, kStPlain, 4><<<grid, 256>>>(ins[0], outs[0], cn); }, a,
          b);
      return 2.0 * cb / (ms * 1e-3) / 1e9;
    };
    for (int round = 0; round < 2; ++round)
      std::printf(
          "plain 128 MiB copy after: a plain copy %7.1f  an el copy %7.1f  an el copy + "
          "reset persisting %7.1f GB/s\n",
          after(0), after(1), after(2));
    for (int round = 0; round < 2; ++round)
      std::printf("24 MiB re-read after el copy %7.1f  with reset persisting %7.1f GB/s\n",
                  reread(copy_kernel<kLdEvictLast, kStPlain, 4>, true),
                  reread(copy_kernel<kLdEvictLast, kStPlain, 4>, true, true));
    CK(cudaGetLastError());
  }
  std::printf(
      "memcpy again               %8.1f GB/s\n",
      gbs(median_ms([&] { cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice); }, a, b)));
  return 0;
}
