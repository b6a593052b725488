// float64 attention backward: per (query row, head) the visible keys' probabilities
// P = exp(s - lse), dP = dout . v, dS = P (dP - delta), chained through the softcap's tanh
// and the scale; dq by rows, dk / dv by key rows (each walking the queries that see it).
#include "ref/attention_bwd_ref.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tessel::ref {

namespace {

[[noreturn]] void bad(const char* arg, const std::string& why) {
  throw std::invalid_argument(std::string("tessel::ref::attention_backward: ") + arg + ": " + why);
}

}  // namespace

AttentionBwdResult attention_backward(std::span<const double> q, std::span<const double> k,
                                      std::span<const double> v, std::span<const double> dout,
                                      std::span<const int64_t> cu_q, std::span<const int64_t> cu_k,
                                      int64_t hq, int64_t hkv, int64_t d,
                                      const AttentionOptions& opt, std::span<const double> out,
                                      std::span<const double> lse, std::span<const int64_t> q_rows,
                                      std::span<const int64_t> k_rows) {
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0) bad("hq/hkv", "positive, hq a multiple of hkv");
  if (cu_q.size() < 1 || cu_q.size() != cu_k.size()) bad("cu_q/cu_k", "same size >= 1");
  const size_t batches = cu_q.size() - 1;
  const int64_t tq = cu_q[batches], tk = cu_k[batches];
  if (static_cast<int64_t>(q.size()) != tq * hq * d) bad("q", "size Tq*Hq*D");
  if (static_cast<int64_t>(dout.size()) != tq * hq * d) bad("dout", "size Tq*Hq*D");
  if (static_cast<int64_t>(k.size()) != tk * hkv * d) bad("k", "size Tk*Hkv*D");
  if (static_cast<int64_t>(v.size()) != tk * hkv * d) bad("v", "size Tk*Hkv*D");
  if (out.empty() != lse.empty()) bad("out/lse", "both or neither");
  if ((!q_rows.empty() || !k_rows.empty()) && out.empty()) bad("out/lse", "given with rows");
  AttentionResult fwd;
  if (out.empty()) {
    fwd = attention_forward(q, k, v, cu_q, cu_k, hq, hkv, d, opt);
    out = fwd.out;
    lse = fwd.lse;
  }
  if (static_cast<int64_t>(out.size()) != tq * hq * d) bad("out", "size Tq*Hq*D");
  if (static_cast<int64_t>(lse.size()) != tq * hq) bad("lse", "size Tq*Hq");

  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t right = opt.causal ? 0 : opt.window_right;
  const int64_t group = hq / hkv;
  auto seq_of = [&](std::span<const int64_t> cu, int64_t row) {
    size_t b = 0;
    while (b + 1 < batches && row >= cu[b + 1]) ++b;
    return b;
  };
  auto visible = [&](int64_t i, int64_t j, int64_t offset) {
    if (right >= 0 && j > i + offset + right) return false;
    if (opt.window_left >= 0 && j < i + offset - opt.window_left) return false;
    return true;
  };
  auto at = [&](int64_t row, int64_t heads, int64_t h) {
    return static_cast<size_t>((row * heads + h) * d);
  };
  auto delta_of = [&](int64_t row, int64_t h) {
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += dout[at(row, hq, h) + c] * out[at(row, hq, h) + c];
    return s;
  };
  // P_ij and dRaw_ij = d loss / d (q_i . k_j) for query row `row`, head h, key row `krow`.
  auto grad_pair = [&](int64_t row, int64_t h, int64_t krow, double delta, double& p,
                       double& draw) {
    const int64_t hk = h / group;
    const double* qi = &q[at(row, hq, h)];
    const double* kj = &k[at(krow, hkv, hk)];
    const double* vj = &v[at(krow, hkv, hk)];
    const double* gi = &dout[at(row, hq, h)];
    double dot = 0, dp = 0;
    for (int64_t c = 0; c < d; ++c) {
      dot += qi[c] * kj[c];
      dp += gi[c] * vj[c];
    }
    double x = opt.scale * dot, dx = opt.scale;
    if (opt.softcap > 0) {
      const double t = std::tanh(x / opt.softcap);
      x = opt.softcap * t;
      dx *= 1 - t * t;
    }
    const double l = lse[static_cast<size_t>(row * hq + h)];
    p = l == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(x - l);
    draw = p * (dp - delta) * dx;
  };

  AttentionBwdResult r;
  r.dq.assign(static_cast<size_t>(tq * hq * d), nan);
  r.dk.assign(static_cast<size_t>(tk * hkv * d), nan);
  r.dv.assign(static_cast<size_t>(tk * hkv * d), nan);
  auto dq_row = [&](int64_t row) {
    const size_t b = seq_of(cu_q, row);
    const int64_t sq = cu_q[b + 1] - cu_q[b], skv = cu_k[b + 1] - cu_k[b];
    const int64_t i = row - cu_q[b];
    for (int64_t h = 0; h < hq; ++h) {
      double* g = &r.dq[at(row, hq, h)];
      for (int64_t c = 0; c < d; ++c) g[c] = 0;
      const double delta = delta_of(row, h);
      for (int64_t j = 0; j < skv; ++j) {
        if (!visible(i, j, skv - sq)) continue;
        double p, draw;
        grad_pair(row, h, cu_k[b] + j, delta, p, draw);
        const double* kj = &k[at(cu_k[b] + j, hkv, h / group)];
        for (int64_t c = 0; c < d; ++c) g[c] += draw * kj[c];
      }
    }
  };
  auto dkv_row = [&](int64_t krow) {
    const size_t b = seq_of(cu_k, krow);
    const int64_t sq = cu_q[b + 1] - cu_q[b], skv = cu_k[b + 1] - cu_k[b];
    const int64_t j = krow - cu_k[b];
    for (int64_t hk = 0; hk < hkv; ++hk) {
      double* gk = &r.dk[at(krow, hkv, hk)];
      double* gv = &r.dv[at(krow, hkv, hk)];
      for (int64_t c = 0; c < d; ++c) gk[c] = gv[c] = 0;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = 0; i < sq; ++i) {
          if (!visible(i, j, skv - sq)) continue;
          const int64_t row = cu_q[b] + i;
          double p, draw;
          grad_pair(row, h, krow, delta_of(row, h), p, draw);
          const double* qi = &q[at(row, hq, h)];
          const double* gi = &dout[at(row, hq, h)];
          for (int64_t c = 0; c < d; ++c) {
            gk[c] += draw * qi[c];
            gv[c] += p * gi[c];
          }
        }
    }
  };
  auto check = [&](int64_t row, int64_t n) {
    if (row < 0 || row >= n) bad("rows", "indices in range");
  };
  if (q_rows.empty()) {
    for (int64_t row = 0; row < tq; ++row) dq_row(row);
  } else {
    for (int64_t row : q_rows) check(row, tq), dq_row(row);
  }
  if (k_rows.empty()) {
    for (int64_t row = 0; row < tk; ++row) dkv_row(row);
  } else {
    for (int64_t row : k_rows) check(row, tk), dkv_row(row);
  }
  // The sink is a logit with a zero value: d sink_h = -sum_i P_sink_i delta_i.
  if (!opt.sinks.empty() && q_rows.empty()) {
    r.d_sinks.assign(static_cast<size_t>(hq), 0.0);
    for (int64_t row = 0; row < tq; ++row)
      for (int64_t h = 0; h < hq; ++h) {
        const double l = lse[static_cast<size_t>(row * hq + h)];
        if (l == -std::numeric_limits<double>::infinity()) continue;
        r.d_sinks[static_cast<size_t>(h)] -= std::exp(opt.sinks[h] - l) * delta_of(row, h);
      }
  }
  return r;
}

}  // namespace tessel::ref
