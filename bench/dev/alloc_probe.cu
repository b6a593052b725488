// Development probe (not part of the build): does where cudaMalloc places a buffer change the
// rate of a streaming kernel? The suites' concat (sessions 10, 27, 34) and GroupNorm backward
// (session 34) read a few microseconds slower in some processes or after earlier cases had
// allocated and freed gigabytes. A plain 16-byte copy of 192 MiB is timed (read flush of 2x L2
// before each run, median of 25 after 3 warm-ups) on buffers from:
//   fresh    cudaMalloc in a fresh process
//   churned  cudaMalloc after 320 buffers of 8 MiB were allocated, written and freed
//   vmm      cuMemCreate / cuMemMap with the recommended granularity (2 MiB), after the churn
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/dev/alloc_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_util.cuh"

__global__ void __launch_bounds__(256)
    copy4(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  const int64_t base = int64_t{blockIdx.x} * 1024 + threadIdx.x;
  uint4 v[4];
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (base + u * 256 < n) v[u] = in[base + u * 256];
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (base + u * 256 < n) out[base + u * 256] = v[u];
}

static void* vmm_alloc(size_t bytes) {
  int dev = 0;
  cudaGetDevice(&dev);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  bytes = (bytes + gran - 1) / gran * gran;
  CUdeviceptr p = 0;
  CUmemGenericAllocationHandle h;
  if (cuMemAddressReserve(&p, bytes, gran, 0, 0) != CUDA_SUCCESS) return nullptr;
  if (cuMemCreate(&h, bytes, &prop, 0) != CUDA_SUCCESS) return nullptr;
  if (cuMemMap(p, bytes, 0, h, 0) != CUDA_SUCCESS) return nullptr;
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cuMemSetAccess(p, bytes, &acc, 1) != CUDA_SUCCESS) return nullptr;
  std::printf("  vmm granularity %zu KiB\n", gran >> 10);
  return reinterpret_cast<void*>(p);
}

int main() {
  const size_t bytes = size_t{192} << 20;
  const int64_t n = bytes / 16;
  ReadFlush flush;
  CK(flush.init());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto time_copy = [&](const char* tag, void* in, void* out) {
    cudaMemset(in, 3, bytes);
    cudaMemset(out, 0, bytes);
    const int grid = static_cast<int>((n + 1023) / 1024);
    for (int round = 0; round < 3; ++round) {
      const float ms = median_ms_after([&](int) { flush.run(); },
                                       [&](int) {
                                         copy4<<<grid, 256>>>(static_cast<const uint4*>(in),
                                                              static_cast<uint4*>(out), n);
                                       },
                                       a, b, 25);
      std::printf("%-8s %p %p  %7.1f GB/s  %.2f us\n", tag, in, out,
                  2.0 * bytes / (ms * 1e-3) / 1e9, ms * 1e3);
    }
  };
  void *in = nullptr, *out = nullptr;
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  time_copy("fresh", in, out);
  CK(cudaFree(in));
  CK(cudaFree(out));
  std::vector<void*> junk(320);
  for (auto& p : junk) {
    CK(cudaMalloc(&p, size_t{8} << 20));
    CK(cudaMemset(p, 7, size_t{8} << 20));
  }
  CK(cudaDeviceSynchronize());
  for (auto p : junk) CK(cudaFree(p));
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  time_copy("churned", in, out);
  void* vin = vmm_alloc(bytes);
  void* vout = vmm_alloc(bytes);
  if (vin && vout) time_copy("vmm", vin, vout);
  CK(cudaFree(in));
  CK(cudaFree(out));
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  time_copy("again", in, out);
  // the 2 GiB case: one big buffer allocated and freed first
  CK(cudaFree(in));
  CK(cudaFree(out));
  void* big = nullptr;
  CK(cudaMalloc(&big, size_t{2} << 30));
  CK(cudaMemset(big, 9, size_t{2} << 30));
  CK(cudaFree(big));
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  time_copy("after2g", in, out);
  CK(cudaGetLastError());
  return 0;
}
