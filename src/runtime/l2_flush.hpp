// L2 flush for timing (the autotuner's measurements): read a zero-filled buffer of >= 2x the L2
// size, leaving only clean lines behind.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessel::detail {

// buffer: device memory, zero-filled once by the caller; bytes: its size (16-byte multiple).
void l2_flush_read(void* buffer, size_t bytes, cudaStream_t stream);

}  // namespace tessel::detail
