#include "ops/llm_engine/l2_prefetch.hpp"
#include "runtime/check.hpp"

#include <string>

namespace tessel::llm_engine {
namespace {

// 16 KB per bulk prefetch: 2048 of them for a 32 MB weight, a few per thread.
constexpr uint32_t kChunk = 16 * 1024;
constexpr int kThreads = 64;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const char* p, size_t bytes,
                                                               bool evict_last) {
  uint64_t policy = 0;
  if (evict_last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  for (size_t c = blockIdx.x * size_t{kThreads} + threadIdx.x; c < chunks;
       c += size_t{gridDim.x} * kThreads) {
    const size_t off = c * kChunk;
    // The bulk prefetch takes a multiple of 16 bytes from a 16-byte aligned address: the
    // caller's range is rounded out to 16 bytes (it lies inside one allocation, itself
    // 256-byte aligned, so the rounded range stays inside it).
    const size_t left = bytes - off;
    const uint32_t n = static_cast<uint32_t>(((left < kChunk ? left : kChunk) + 15) & ~size_t{15});
    if (evict_last)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + off),
                   "r"(n), "l"(policy)
                   : "memory");
    else
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
}

}  // namespace

void l2_prefetch(const void* p, size_t bytes, bool evict_last, int ctas, cudaStream_t stream) {
  if (bytes == 0) return;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % 16 != 0)
    detail::OpCheck("l2_prefetch")
        .fail("p", "a 16-byte aligned address", "address % 16 = " + std::to_string(addr % 16));
  if (ctas <= 0) {
    int dev = 0;
    TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
    TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, dev));
  }
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  const size_t need = (chunks + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(need < size_t(ctas) ? need : size_t(ctas));
  l2_prefetch_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const char*>(p), bytes,
                                                    evict_last);
  TESSEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessel::llm_engine
