#include <algorithm>
#include <cstdint>

#include "ops/llm_engine/l2_prefetch.hpp"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "tile/tile.cuh"

namespace tessel::llm_engine {
namespace {

constexpr size_t kChunk = size_t{64} << 10;  // bytes per bulk prefetch instruction
constexpr int kThreads = 32;

// Thread t of block b prefetches chunks b·32 + t, + gridDim·32, ...: one instruction each.
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const char* p, size_t bytes) {
  const size_t stride = size_t{gridDim.x} * kThreads * kChunk;
  for (size_t off = (size_t{blockIdx.x} * kThreads + threadIdx.x) * kChunk; off < bytes;
       off += stride) {
    const size_t rest = bytes - off;
    const uint32_t n = static_cast<uint32_t>(rest < kChunk ? rest : kChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
  // The next kernel may launch now; this one completes only after the kernel before it, so a
  // kernel that waits on this one also waits on that one.
  ::tessel::tile::allow_next_grid();
  ::tessel::tile::wait_prior_grid();
}

}  // namespace

void l2_prefetch(const void* p, size_t bytes, cudaStream_t stream) {
  bytes &= ~size_t{15};
  if (p == nullptr || bytes == 0) return;
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>((chunks + kThreads - 1) / kThreads, 16));
  TESSEL_CUDA_CHECK(detail::launch_dependent(l2_prefetch_kernel, dim3(blocks), dim3(kThreads), 0,
                                             stream, static_cast<const char*>(p), bytes));
}

}  // namespace tessel::llm_engine
