#include "runtime/workspace.hpp"

#include <map>
#include <mutex>
#include <utility>

#include "runtime/check.hpp"

namespace tessel::detail {

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return st != cudaStreamCaptureStatusNone;
}

void* stream_workspace(cudaStream_t stream, size_t bytes, bool may_allocate) {
  struct Slot {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Slot> slots;  // process lifetime
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Slot& s = slots[{dev, stream}];
  if (s.bytes < bytes) {
    if (!may_allocate) return nullptr;
    if (s.ptr) {
      TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
      TESSEL_CUDA_CHECK(cudaFree(s.ptr));
      s = Slot{};
    }
    const size_t want = bytes < 4096 ? 4096 : bytes;
    TESSEL_CUDA_CHECK(cudaMalloc(&s.ptr, want));
    TESSEL_CUDA_CHECK(cudaMemset(s.ptr, 0, want));
    s.bytes = want;
  }
  return s.ptr;
}

}  // namespace tessel::detail
