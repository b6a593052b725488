// tessel rotary position embedding (RoPE), in place on q and k together, one launch.
//
// q (T, Hq, D) and k (T, Hkv, D), same dtype (f32/f16/bf16), same T and D, last axis
// contiguous, any non-negative token/head strides (a slice of a fused qkv buffer works).
// positions (T) i32 or i64, dense. The first rotary_dim (even, <= D) elements of every head
// are rotated, the rest are untouched:
//   neox (half-rotated): pair (i, i + rotary_dim/2), i < rotary_dim/2
//   gptj (interleaved) : pair (2i, 2i + 1)
//   (a, b) -> (a·cos − b·sin, b·cos + a·sin), angle = position · inv_freq[i],
//   inv_freq[i] = theta^(−2i/rotary_dim), optionally Llama-3 scaled (see RopeParams).
// The angle is formed and range-reduced in fp64 (exact for any realistic position), cos/sin
// in fp32, once per (token, frequency), shared by every head of the token.
// rope_backward rotates by the negative angle (the transpose of the rotation): dq, dk in place.
#pragma once

#include <cstdint>

#include "tessel/tensor.hpp"

namespace tessel {

enum class RopeStyle : int32_t { neox = 0, gptj = 1 };

struct RopeParams {
  RopeStyle style = RopeStyle::neox;
  int64_t rotary_dim = 0;  // 0: the head dim D
  double theta = 10000.0;
  // Llama-3 frequency scaling (rope_type "llama3"): wavelengths above
  // original_max_position_embeddings / low_freq_factor are divided by `factor`, below
  // original / high_freq_factor kept, smoothly interpolated in between.
  bool llama3 = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

void rope(Tensor& q, Tensor& k, const Tensor& positions, const RopeParams& params,
          cudaStream_t stream);
void rope_backward(Tensor& dq, Tensor& dk, const Tensor& positions, const RopeParams& params,
                   cudaStream_t stream);

}  // namespace tessel
