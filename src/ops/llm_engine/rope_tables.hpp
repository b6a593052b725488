// Device helpers of the LLM engine's GPU backend (src/llm/gpu_backend.cpp) that no public op
// covers: RoPE by caller-given cos/sin tables (the engine builds them on the host, with any
// frequency scaling, so that CPU and GPU rotate by identical angles).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessel::llm_engine {

// x: bf16 (rows, n_heads·head_dim) with row pitch ld (elements), rotated in place; cos/sin: f32
// (rows, rope_dim / 2) on the device. neox pairs (i, i + rope_dim/2), otherwise (gpt-j) pairs (2i,
// 2i + 1).
void rope_tables_bf16(void* x, int64_t rows, int64_t ld, int64_t n_heads, int64_t head_dim,
                      int64_t rope_dim, bool neox, const float* cos, const float* sin,
                      cudaStream_t stream);

}  // namespace tessel::llm_engine
