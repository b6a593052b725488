// tessel attention backward: the gradients of attention_forward (include/tessel/attention.hpp)
// with respect to q, k and v (and optionally the sinks), FlashAttention-2 style: the
// probabilities are recomputed from q, k and the forward's lse, never stored.
//
// Layouts and variants exactly as the forward (padded batch or varlen, GQA/MQA, causal
// bottom-right aligned, sliding window, softcap, sinks, D in {64, 128, 256}, bf16 / f16):
//   inputs : q, k, v, out (the forward's output), dout (d loss / d out, like out),
//            lse (f32, (B, Hq, Sq) or (Hq, Tq): the forward's natural-log log-sum-exp)
//   outputs: dq like q, dk and dv like k (for GQA a kv head's gradient sums over its q heads)
// With delta_i = dout_i . out_i and P_ij = exp(s_ij - lse_i):
//   dv_j = sum_i P_ij dout_i,  dS_ij = P_ij (dout_i . v_j - delta_i),
//   dq_i = sum_j dS_ij s'_ij k_j,  dk_j = sum_i dS_ij s'_ij q_i,
// where s'_ij = d s_ij / d (q_i . k_j) = scale (times 1 - tanh^2 with a softcap), and
//   d_sinks_h = -sum_i exp(sink_h - lse_i) delta_i   (summed over the batch).
// Keys that no query sees get dk = dv = 0; queries that see no key get dq = 0.
#pragma once

#include "tessel/attention.hpp"

namespace tessel {

struct AttentionBackwardParams : AttentionParams {
  // true: bitwise reproducible run to run (no float atomics: dq by its own kernel pass);
  // false (default): dq accumulated with f32 atomics in a stream workspace (faster).
  bool deterministic = false;
  Tensor* d_sinks = nullptr;  // optional f32 (Hq) output; needs sinks
};

// Workspace: stream-ordered device memory (cudaMallocAsync on `stream`), freed on the stream.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& dout, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionBackwardParams& params, cudaStream_t stream);

}  // namespace tessel
