#include "ops/llm_engine/hold_stream.hpp"
#include "runtime/check.hpp"

namespace tessel::llm_engine {
namespace {

__global__ void hold_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void hold_stream(double microseconds, cudaStream_t stream) {
  int dev = 0, khz = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  hold_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(microseconds * khz * 1e-3));
  TESSEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessel::llm_engine
