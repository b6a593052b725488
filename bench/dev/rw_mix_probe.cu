// Development probe (not part of the build): the DRAM bandwidth a plain streaming kernel gets
// as a function of its read : write mix, against cudaMemcpy on the same GPU. Copy bandwidth is
// the denominator of every memory-bound target (peak_fraction); ops whose bytes are mostly
// writes (the embedding backward writes V x D and reads N x D) or mostly reads (reductions)
// meet a different ceiling, which this measures.
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/dev/rw_mix_probe.cu
//
// Each thread reads R 16-byte vectors (one from each of R input planes, coalesced) and writes
// W (one into each of W output planes); ~1.5 GiB moved per run (30x the H200's L2), CUDA
// events, median of 25 after warm-up. Also cudaMemsetAsync (write-only) and cudaMemcpyAsync.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_util.cuh"

template <int R, int W>
__global__ void __launch_bounds__(256)
    mix_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t m, int* sink) {
  const int64_t u = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (u >= m) return;
  uint4 acc = make_uint4(u, 1, 2, 3);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint4 v = in[int64_t{r} * m + u];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if constexpr (W == 0) {
    if ((acc.x & acc.y & acc.z & acc.w) == 0xdeadbeefu) *sink = 1;  // keeps the loads
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) {
      uint4 o = acc;
      o.x += w;
      out[int64_t{w} * m + u] = o;
    }
  }
}

// The same mix with the stores independent of the loads (a zero-row store does not wait for
// a load): loads are folded into a predicated sink store, the W planes get constants.
template <int R, int W>
__global__ void __launch_bounds__(256)
    mix_indep_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t m, int* sink) {
  const int64_t u = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (u >= m) return;
#pragma unroll
  for (int w = 0; w < W; ++w) out[int64_t{w} * m + u] = make_uint4(w, 0, 0, 0);
  uint4 acc = make_uint4(u, 1, 2, 3);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint4 v = in[int64_t{r} * m + u];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0xdeadbeefu) *sink = 1;
}

int main() {
  const size_t total = size_t{3} << 29;  // 1.5 GiB moved per run
  void *in = nullptr, *out = nullptr;
  int* sink = nullptr;
  CK(cudaMalloc(&in, total));
  CK(cudaMalloc(&out, total));
  CK(cudaMalloc(&sink, sizeof(int)));
  CK(cudaMemset(in, 1, total));
  CK(cudaMemset(out, 0, total));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t half = total / 2;
  const float memcpy_ms =
      median_ms([&] { cudaMemcpyAsync(out, in, half, cudaMemcpyDeviceToDevice); }, a, b);
  const double copy_gbs = 2.0 * half / (memcpy_ms * 1e-3) / 1e9;
  std::printf("device %s\n", prop.name);
  std::printf("%-24s %9.1f GB/s  1.000 of copy\n", "cudaMemcpy (read 1 : write 1)", copy_gbs);
  const float memset_ms = median_ms([&] { cudaMemsetAsync(out, 0, total); }, a, b);
  const double memset_gbs = total / (memset_ms * 1e-3) / 1e9;
  std::printf("%-24s %9.1f GB/s  %.3f of copy\n", "cudaMemset (write only)", memset_gbs,
              memset_gbs / copy_gbs);
  auto run = [&](auto kernel, int r, int w, const char* tag = "") {
    const int64_t m = static_cast<int64_t>(total / 16 / (r + w));
    const unsigned grid = static_cast<unsigned>((m + 255) / 256);
    const float ms = median_ms(
        [&] {
          kernel<<<grid, 256>>>(static_cast<const uint4*>(in), static_cast<uint4*>(out), m, sink);
        },
        a, b);
    const double gbs = 16.0 * m * (r + w) / (ms * 1e-3) / 1e9;
    std::printf("kernel read %d : write %d%s %9.1f GB/s  %.3f of copy  (writes %.0f%% of bytes)\n",
                r, w, tag, gbs, gbs / copy_gbs, 100.0 * w / (r + w));
  };
  run(mix_kernel<1, 0>, 1, 0);
  run(mix_kernel<4, 1>, 4, 1);
  run(mix_kernel<2, 1>, 2, 1);
  run(mix_kernel<1, 1>, 1, 1);
  run(mix_kernel<1, 2>, 1, 2);
  run(mix_kernel<1, 8>, 1, 8);
  run(mix_kernel<1, 16>, 1, 16);
  run(mix_kernel<0, 1>, 0, 1);
  run(mix_indep_kernel<1, 2>, 1, 2, " (independent stores)");
  run(mix_indep_kernel<1, 8>, 1, 8, " (independent stores)");
  run(mix_indep_kernel<1, 16>, 1, 16, " (independent stores)");
  CK(cudaGetLastError());
  const float again =
      median_ms([&] { cudaMemcpyAsync(out, in, half, cudaMemcpyDeviceToDevice); }, a, b);
  std::printf("%-24s %9.1f GB/s\n", "cudaMemcpy again", 2.0 * half / (again * 1e-3) / 1e9);
  return 0;
}
