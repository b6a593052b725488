// float64 reference of the attention forward (include/tessel/attention.hpp). Same conventions
// as reference.hpp: dense row-major host arrays, sizes checked (std::invalid_argument naming
// the function and argument), IEEE semantics.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessel::ref {

struct AttentionOptions {
  double scale = 0.0;  // the scale itself (callers resolve the 1/sqrt(D) default)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // < 0: unlimited
  double softcap = 0.0;                         // > 0: softcap * tanh(s / softcap)
  std::span<const double> sinks;                // empty, or one logit per q head
};

struct AttentionResult {
  std::vector<double> out;  // (Tq, Hq, D); rows not computed are NaN
  std::vector<double> lse;  // (Tq, Hq), natural log; -inf for a row that sees nothing
};

// q (Tq, Hq, D), k and v (Tk, Hkv, D); sequence b owns q rows [cu_q[b], cu_q[b+1]) and key
// rows [cu_k[b], cu_k[b+1]) (a padded batch of B sequences: cu = 0, S, 2S, ...). Masking,
// softcap and sinks as documented in attention.hpp. `rows` (optional): compute only these q
// rows (indices into Tq), for long sequences; others are left NaN.
AttentionResult attention_forward(std::span<const double> q, std::span<const double> k,
                                  std::span<const double> v, std::span<const int64_t> cu_q,
                                  std::span<const int64_t> cu_k, int64_t hq, int64_t hkv, int64_t d,
                                  const AttentionOptions& opt, std::span<const int64_t> rows = {});

}  // namespace tessel::ref
