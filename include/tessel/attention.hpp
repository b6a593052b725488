// tessel attention: fused scaled-dot-product attention forward (FlashAttention-style) for
// Hopper. Conventions as in ops.hpp: inputs, then outputs, then parameters, then the stream;
// every argument validated (dtype -> shape -> strides -> empty: return -> device pointers)
// before anything is launched.
//
// Layouts (row-major views; the last axis contiguous, every other stride free, so q, k and
// v may be slices of one packed qkv tensor):
//   padded batch : q (B, Sq, Hq, D), k and v (B, Skv, Hkv, D), out like q, lse (B, Hq, Sq)
//   varlen       : q (Tq, Hq, D),    k and v (Tk, Hkv, D),     out like q, lse (Hq, Tq)
//                  where sequence b owns rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q/out
//                  and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k/v.
// q, k, v, out: bf16 or f16 (all the same); D in {64, 128, 256}; Hq a multiple of Hkv
// (MHA Hq == Hkv, GQA, MQA Hkv == 1): q head h reads k/v head h / (Hq / Hkv). lse is f32.
//
// For query i and key j of one sequence (lengths Sq, Skv; offset = Skv - Sq so that the last
// query lines up with the last key, "bottom-right" alignment):
//   s_ij = scale * q_i . k_j, then s_ij = softcap * tanh(s_ij / softcap) when softcap > 0
//   key j is visible iff  j <= i + offset + window_right  (window_right < 0: no limit;
//                                                          causal forces window_right = 0)
//                    and  j >= i + offset - window_left   (window_left < 0: no limit)
//   out_i = sum_j softmax_j(s_i) v_j, where the softmax denominator also holds exp(sink_h)
//           when sinks are given (an "attention sink": a logit with a zero value vector)
//   lse_i = log(sum over visible j of exp(s_ij) [+ exp(sink_h)])   (natural log)
// A query that sees no key has out_i = 0 and lse_i = -inf (or sink_h with sinks).
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

struct AttentionParams {
  float scale = 0.0f;             // <= 0 (default): 1 / sqrt(D)
  bool causal = false;            // bottom-right aligned when Sq != Skv
  int window_left = -1;           // sliding window: keys at most this far left of the diagonal
  int window_right = -1;          // ... and right of it (causal: 0)
  float softcap = 0.0f;           // > 0: logits pass through softcap * tanh(s / softcap)
  const Tensor* sinks = nullptr;  // optional f32 (Hq): one sink logit per q head
  const Tensor* cu_seqlens_q = nullptr;  // varlen: int32 (B+1) cumulative offsets, on device
  const Tensor* cu_seqlens_k = nullptr;  // varlen: both or neither
};

// out = attention(q, k, v); lse (optional, nullptr = not written) receives the log-sum-exp.
// Varlen offsets must be non-decreasing, start at 0 and end at Tq / Tk (not checked on the
// host: they live on the device).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor* lse,
                       const AttentionParams& params, cudaStream_t stream);

}  // namespace tessel
