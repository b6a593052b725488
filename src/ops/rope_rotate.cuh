// The rotation of one RoPE pair, shared by the kernels that rotate the engine's q / k heads
// (llm_engine::rope_append, decode attention with the fused append) so that they give the same
// bits: f32, each product and sum rounded on its own (no FMA contraction, which the compiler
// would otherwise choose per call site).
#pragma once

#include <cuda_runtime.h>

namespace tessel::detail {

// (x0, x1) rotated by the angle of cosine c and sine s: (x0·c − x1·s, x0·s + x1·c).
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)),
                     __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
}

}  // namespace tessel::detail
