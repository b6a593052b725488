#include "runtime/workspace.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

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
  // Outgrown buffers are kept, not freed: a CUDA graph captured earlier on this stream still
  // holds their addresses. Growth at least doubles, so they add up to less than the live one.
  static std::vector<void*> retired;
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Slot& s = slots[{dev, stream}];
  if (s.bytes < bytes) {
    if (!may_allocate) return nullptr;
    const size_t want = std::max<size_t>({bytes, size_t{4096}, 2 * s.bytes});
    void* p = nullptr;
    TESSEL_CUDA_CHECK(cudaMalloc(&p, want));
    // Zeroed in the stream's order (a plain cudaMemset runs on the legacy default stream,
    // which does not order against non-blocking streams).
    TESSEL_CUDA_CHECK(cudaMemsetAsync(p, 0, want, stream));
    if (s.ptr) retired.push_back(s.ptr);
    s.ptr = p;
    s.bytes = want;
  }
  return s.ptr;
}

AsyncBuffer::AsyncBuffer(size_t bytes, cudaStream_t stream) : s(stream) {
  if (bytes) TESSEL_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
}

AsyncBuffer::~AsyncBuffer() {
  if (p) cudaFreeAsync(p, s);  // no throw from a destructor; a failed free only leaks
}

}  // namespace tessel::detail
