// decode_attention with RoPE and the KV-cache append fused in front: the LLM engine's decode
// step in one launch where it would take two (llm_engine::rope_append, then decode_attention).
// Not public API: the engine's GPU backend and the tests call it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessel/decode_attention.hpp"
#include "tessel/tensor.hpp"

namespace tessel::detail {

struct DecodeRopeAppend {
  const Tensor* k_new = nullptr;  // (B, Sq, Hkv, D): the new tokens' k, not rotated
  const Tensor* v_new = nullptr;  // (B, Sq, Hkv, D)
  const Tensor* cos = nullptr;    // (B·Sq, rope_dim / 2) f32, contiguous: row b·Sq + s
  const Tensor* sin = nullptr;
  int64_t rope_dim = 0;  // rotated dims per head: a multiple of 16, <= D
  bool neox = true;      // pairs (i, i + rope_dim/2); false: gpt-j (2i, 2i + 1)
};

// q (B, Sq, Hq, D) holds the new tokens' q before rotation. The q and k heads are rotated as
// llm_engine::rope_append rotates them (its bits), k_new (rotated) and v_new are written into
// the caches at positions seqlens[b] − Sq + s as append_kv writes them (out-of-range pages
// skipped), and out / lse are decode_attention's over the updated caches — bit for bit the
// two-launch sequence. q and k_new themselves are left unrotated. Same layouts, errors and
// bad-input behaviour as decode_attention (check_inputs included), plus the checks of the
// arguments above; an error leaves every output and both caches untouched.
void decode_attention_rope_append(const Tensor& q, const DecodeRopeAppend& rope, Tensor& k_cache,
                                  Tensor& v_cache, const Tensor& seqlens, Tensor& out, Tensor* lse,
                                  const DecodeParams& params, cudaStream_t stream);

}  // namespace tessel::detail
