// Device argmax of logits rows for the engine's greedy decode (src/llm/gpu_backend.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessel::llm_engine {

// out[r] (device int32) = the lowest index of the largest non-NaN value of bf16 row r of x
// ((rows, cols), row pitch ld elements, cols < 2^31); 0 when the whole row is NaN. The same
// rule as the host sampler's greedy pick (src/llm/sampler.cpp) on the widened values.
void argmax_rows_bf16(const void* x, int64_t rows, int64_t cols, int64_t ld, int32_t* out,
                      cudaStream_t stream);

}  // namespace tessel::llm_engine
