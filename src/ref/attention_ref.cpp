// float64 attention forward: per query row, the visible keys' logits, a two-pass softmax
// (max, then sum) including the sink, and the weighted sum of values.
#include "ref/attention_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tessel::ref {

namespace {

[[noreturn]] void bad(const char* arg, const std::string& why) {
  throw std::invalid_argument(std::string("tessel::ref::attention_forward: ") + arg + ": " + why);
}

}  // namespace

AttentionResult attention_forward(std::span<const double> q, std::span<const double> k,
                                  std::span<const double> v, std::span<const int64_t> cu_q,
                                  std::span<const int64_t> cu_k, int64_t hq, int64_t hkv, int64_t d,
                                  const AttentionOptions& opt, std::span<const int64_t> rows) {
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0) bad("hq/hkv", "positive, hq a multiple of hkv");
  if (d <= 0) bad("d", "positive");
  if (cu_q.size() < 1 || cu_q.size() != cu_k.size()) bad("cu_q/cu_k", "same size >= 1");
  const size_t batches = cu_q.size() - 1;
  for (size_t b = 0; b < batches; ++b)
    if (cu_q[b + 1] < cu_q[b] || cu_k[b + 1] < cu_k[b]) bad("cu_q/cu_k", "non-decreasing");
  if (cu_q[0] != 0 || cu_k[0] != 0) bad("cu_q/cu_k", "start at 0");
  const int64_t tq = cu_q[batches], tk = cu_k[batches];
  if (static_cast<int64_t>(q.size()) != tq * hq * d) bad("q", "size Tq*Hq*D");
  if (static_cast<int64_t>(k.size()) != tk * hkv * d) bad("k", "size Tk*Hkv*D");
  if (static_cast<int64_t>(v.size()) != tk * hkv * d) bad("v", "size Tk*Hkv*D");
  if (!opt.sinks.empty() && static_cast<int64_t>(opt.sinks.size()) != hq) bad("sinks", "size Hq");

  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  AttentionResult r;
  r.out.assign(static_cast<size_t>(tq * hq * d), nan);
  r.lse.assign(static_cast<size_t>(tq * hq), nan);
  const int64_t right = opt.causal ? 0 : opt.window_right;
  const int64_t group = hq / hkv;

  std::vector<double> s, acc(static_cast<size_t>(d));
  auto one_row = [&](int64_t row) {
    size_t b = 0;
    while (b + 1 < batches && row >= cu_q[b + 1]) ++b;
    const int64_t sq = cu_q[b + 1] - cu_q[b], skv = cu_k[b + 1] - cu_k[b];
    const int64_t i = row - cu_q[b], offset = skv - sq;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t hk = h / group;
      const double* qi = &q[static_cast<size_t>((row * hq + h) * d)];
      s.assign(static_cast<size_t>(skv), -inf);
      double m = opt.sinks.empty() ? -inf : opt.sinks[h];
      for (int64_t j = 0; j < skv; ++j) {
        if (right >= 0 && j > i + offset + right) continue;
        if (opt.window_left >= 0 && j < i + offset - opt.window_left) continue;
        const double* kj = &k[static_cast<size_t>(((cu_k[b] + j) * hkv + hk) * d)];
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
        double x = opt.scale * dot;
        if (opt.softcap > 0) x = opt.softcap * std::tanh(x / opt.softcap);
        s[j] = x;
        m = std::max(m, x);
      }
      double* o = &r.out[static_cast<size_t>((row * hq + h) * d)];
      double& lse = r.lse[static_cast<size_t>(row * hq + h)];
      if (m == -inf) {  // sees nothing, no sink
        for (int64_t c = 0; c < d; ++c) o[c] = 0;
        lse = -inf;
        continue;
      }
      double sum = opt.sinks.empty() ? 0.0 : std::exp(opt.sinks[h] - m);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < skv; ++j) {
        if (s[j] == -inf) continue;
        const double p = std::exp(s[j] - m);
        sum += p;
        const double* vj = &v[static_cast<size_t>(((cu_k[b] + j) * hkv + hk) * d)];
        for (int64_t c = 0; c < d; ++c) acc[c] += p * vj[c];
      }
      for (int64_t c = 0; c < d; ++c) o[c] = acc[c] / sum;
      lse = m + std::log(sum);
    }
  };
  if (rows.empty()) {
    for (int64_t row = 0; row < tq; ++row) one_row(row);
  } else {
    for (int64_t row : rows) {
      if (row < 0 || row >= tq) bad("rows", "indices in [0, Tq)");
      one_row(row);
    }
  }
  return r;
}

}  // namespace tessel::ref
