// float64 reference of the attention backward (include/tessel/attention_backward.hpp). Same
// conventions as attention_ref.hpp: dense row-major host arrays, (Tq, Hq, D) queries and
// (Tk, Hkv, D) keys/values, sequences given by cu_q / cu_k.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ref/attention_ref.hpp"

namespace tessel::ref {

struct AttentionBwdResult {
  std::vector<double> dq;       // (Tq, Hq, D); rows not computed are NaN
  std::vector<double> dk, dv;   // (Tk, Hkv, D); rows not computed are NaN
  std::vector<double> d_sinks;  // (Hq) when opt.sinks is given and every q row was computed
};

// Gradients of sum(dout * attention_forward(q, k, v)) with respect to q, k, v (and sinks).
// out (Tq, Hq, D) and lse (Tq, Hq) are the forward's outputs as the backward receives them
// (e.g. rounded to the dtype); empty: computed here in float64. delta_i = dout_i . out_i and
// P_ij = exp(s_ij - lse_i), exactly as the kernel defines them. q_rows / k_rows (optional):
// compute only these dq rows / dk, dv rows (long sequences; needs out and lse given).
AttentionBwdResult attention_backward(std::span<const double> q, std::span<const double> k,
                                      std::span<const double> v, std::span<const double> dout,
                                      std::span<const int64_t> cu_q, std::span<const int64_t> cu_k,
                                      int64_t hq, int64_t hkv, int64_t d,
                                      const AttentionOptions& opt, std::span<const double> out = {},
                                      std::span<const double> lse = {},
                                      std::span<const int64_t> q_rows = {},
                                      std::span<const int64_t> k_rows = {});

}  // namespace tessel::ref
