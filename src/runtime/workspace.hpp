// Per-(device, stream) scratch memory for ops that need a little global state (e.g. the
// partial sums and completion ticket of a one-launch reduction). One buffer per stream, so
// ops on different streams never share scratch; ops on one stream are ordered by it.
// Buffers are zeroed when allocated; ops that use them must leave them zeroed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessel::detail {

// At least `bytes` of zeroed device memory owned by (current device, stream). Growing it
// allocates a new buffer (zeroed in the stream's order; the old one stays allocated for graphs
// that captured it), which graph capture forbids: with may_allocate = false it returns
// nullptr instead when the buffer is too small.
void* stream_workspace(cudaStream_t stream, size_t bytes, bool may_allocate = true);

// Stream-ordered scratch that needs no zeroing (cudaMallocAsync): freed on the same stream when
// it goes out of scope, i.e. after the work enqueued while it lived. 0 bytes: no allocation.
struct AsyncBuffer {
  void* p = nullptr;
  cudaStream_t s = nullptr;
  AsyncBuffer(size_t bytes, cudaStream_t stream);  // throws tessel::Error when it cannot
  ~AsyncBuffer();
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  AsyncBuffer(const AsyncBuffer&) = delete;
  AsyncBuffer& operator=(const AsyncBuffer&) = delete;
};

// Whether `stream` is being captured into a CUDA graph (true when the query fails).
bool stream_capturing(cudaStream_t stream);

}  // namespace tessel::detail
