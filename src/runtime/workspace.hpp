// Per-(device, stream) scratch memory for ops that need a little global state (e.g. the
// partial sums and completion ticket of a one-launch reduction). One buffer per stream, so
// ops on different streams never share scratch; ops on one stream are ordered by it.
// Buffers are zeroed when allocated; ops that use them must leave them zeroed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessel::detail {

// At least `bytes` of zeroed device memory owned by (current device, stream). Not for use
// while the stream is being captured into a graph for the first time.
void* stream_workspace(cudaStream_t stream, size_t bytes);

}  // namespace tessel::detail
