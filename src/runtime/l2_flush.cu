#include "runtime/check.hpp"
#include "runtime/l2_flush.hpp"

namespace tessel::detail {
namespace {

// Reads the buffer so that L2 holds only clean lines of it afterwards. A memset would leave
// L2 full of dirty lines whose write-back lands inside the next timed kernel (about twice the
// DRAM traffic of a 32 MB weight read). The store never happens (the buffer is zero-filled
// once) but keeps the loads alive.
__global__ void l2_flush_read_kernel(const uint4* __restrict__ p, size_t n, uint4* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xdeadbeefu) sink[0] = make_uint4(acc, acc, acc, acc);
}

}  // namespace

void l2_flush_read(void* buffer, size_t bytes, cudaStream_t stream) {
  const size_t n = bytes / sizeof(uint4);
  if (n == 0) return;
  l2_flush_read_kernel<<<132 * 4, 512, 0, stream>>>(static_cast<const uint4*>(buffer), n,
                                                    static_cast<uint4*>(buffer));
  TESSEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessel::detail
