#include "ref/llm_ref.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace tessel::ref {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;  // √(2/π)
constexpr double kGeluC = 0.044715;

void need(bool ok, const char* fn, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("tessel::ref::") + fn + ": " + what);
}
}  // namespace

double act(Act a, double x) {
  switch (a) {
    case Act::silu: return x / (1.0 + std::exp(-x));
    case Act::gelu_erf: return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
    case Act::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
  }
  return NAN;
}

double act_grad(Act a, double x) {
  switch (a) {
    case Act::silu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    case Act::gelu_erf:
      return 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2)) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
    case Act::gelu_tanh: {
      const double t = std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluC * x * x);
    }
  }
  return NAN;
}

std::vector<double> glu(Act a, std::span<const double> gate, std::span<const double> up) {
  need(gate.size() == up.size(), "glu", "gate and up differ in size");
  std::vector<double> out(gate.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = act(a, gate[i]) * up[i];
  return out;
}

void glu_backward(Act a, std::span<const double> gate, std::span<const double> up,
                  std::span<const double> dout, std::vector<double>& dgate,
                  std::vector<double>& dup) {
  need(gate.size() == up.size() && dout.size() == up.size(), "glu_backward", "sizes differ");
  dgate.resize(gate.size());
  dup.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    dgate[i] = dout[i] * up[i] * act_grad(a, gate[i]);
    dup[i] = dout[i] * act(a, gate[i]);
  }
}

std::vector<double> act_forward(Act a, std::span<const double> x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = act(a, x[i]);
  return y;
}

std::vector<double> act_backward(Act a, std::span<const double> x, std::span<const double> dy) {
  need(x.size() == dy.size(), "act_backward", "sizes differ");
  std::vector<double> dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) dx[i] = dy[i] * act_grad(a, x[i]);
  return dx;
}

void split_halves(std::span<const double> x, int64_t rows, int64_t h, std::vector<double>& gate,
                  std::vector<double>& up) {
  need(static_cast<int64_t>(x.size()) == rows * 2 * h, "split_halves", "x is not rows*2h");
  gate.resize(static_cast<size_t>(rows * h));
  up.resize(static_cast<size_t>(rows * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < h; ++c) {
      gate[r * h + c] = x[r * 2 * h + c];
      up[r * h + c] = x[r * 2 * h + h + c];
    }
}

std::vector<double> join_halves(std::span<const double> a, std::span<const double> b,
                                int64_t rows, int64_t h) {
  need(static_cast<int64_t>(a.size()) == rows * h && b.size() == a.size(), "join_halves",
       "a/b are not rows*h");
  std::vector<double> x(static_cast<size_t>(rows * 2 * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < h; ++c) {
      x[r * 2 * h + c] = a[r * h + c];
      x[r * 2 * h + h + c] = b[r * h + c];
    }
  return x;
}

// ---- Philox -------------------------------------------------------------------------------
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += W0;
      k[1] += W1;
    }
    const uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

uint32_t dropout_threshold(double p) {
  need(p >= 0.0 && p <= 1.0, "dropout_threshold", "p outside [0, 1]");
  return static_cast<uint32_t>(std::llround(p * 65536.0));
}

// Element i: the low (i even) or high (i odd) 16 bits of word (i / 2) % 4 of the call on
// counter i / 8; kept iff those bits >= round(p · 2^16).
bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, double p) {
  const uint64_t g = i >> 3;
  const auto r = philox4x32_10({static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32),
                                static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                               {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint32_t w = r[(i >> 1) & 3];
  const uint32_t u = (i & 1) ? w >> 16 : w & 0xFFFFu;
  return u >= dropout_threshold(p);
}

std::vector<uint8_t> dropout_mask(size_t n, double p, uint64_t seed, uint64_t offset) {
  std::vector<uint8_t> m(n);
  for (size_t i = 0; i < n; ++i) m[i] = dropout_keep(seed, offset, i, p) ? 1 : 0;
  return m;
}

std::vector<double> dropout(std::span<const double> x, double p, uint64_t seed, uint64_t offset) {
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = dropout_keep(seed, offset, i, p) ? x[i] * scale : 0.0;
  return y;
}

// ---- RoPE -----------------------------------------------------------------------------------
std::vector<double> rope_inv_freq(const RopeConfig& cfg, int64_t rd) {
  std::vector<double> f(static_cast<size_t>(rd / 2));
  for (int64_t i = 0; i < rd / 2; ++i) {
    double freq = std::pow(cfg.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
    if (cfg.llama3) {
      const double old_len = static_cast<double>(cfg.original_max_position_embeddings);
      const double low_wl = old_len / cfg.low_freq_factor, high_wl = old_len / cfg.high_freq_factor;
      const double wl = 2.0 * std::numbers::pi / freq;
      if (wl < high_wl) {
      } else if (wl > low_wl) {
        freq = freq / cfg.factor;
      } else {
        const double s = (old_len / wl - cfg.low_freq_factor) /
                         (cfg.high_freq_factor - cfg.low_freq_factor);
        freq = (1.0 - s) * freq / cfg.factor + s * freq;
      }
    }
    f[static_cast<size_t>(i)] = freq;
  }
  return f;
}

void rope(std::vector<double>& x, int64_t tokens, int64_t heads, int64_t d,
          std::span<const int64_t> positions, const RopeConfig& cfg, bool inverse) {
  const int64_t rd = cfg.rotary_dim == 0 ? d : cfg.rotary_dim;
  need(rd % 2 == 0 && rd <= d, "rope", "rotary_dim must be even and <= head_dim");
  need(static_cast<int64_t>(x.size()) == tokens * heads * d, "rope", "x is not tokens*heads*d");
  need(static_cast<int64_t>(positions.size()) == tokens, "rope", "positions size");
  const std::vector<double> inv = rope_inv_freq(cfg, rd);
  const int64_t half = rd / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x.data() + (t * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(positions[t]) * inv[i];
        const double c = std::cos(ang), s = inverse ? -std::sin(ang) : std::sin(ang);
        const int64_t ia = cfg.neox ? i : 2 * i, ib = cfg.neox ? i + half : 2 * i + 1;
        const double a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = b * c + a * s;
      }
    }
}

// ---- embedding ------------------------------------------------------------------------------
std::vector<double> embedding(std::span<const int64_t> ids, std::span<const double> w,
                              int64_t vocab, int64_t dim) {
  need(static_cast<int64_t>(w.size()) == vocab * dim, "embedding", "weight is not vocab*dim");
  std::vector<double> out(ids.size() * static_cast<size_t>(dim), 0.0);
  for (size_t n = 0; n < ids.size(); ++n)
    if (ids[n] >= 0 && ids[n] < vocab)
      for (int64_t c = 0; c < dim; ++c) out[n * dim + c] = w[ids[n] * dim + c];
  return out;
}

std::vector<double> embedding_backward(std::span<const int64_t> ids, std::span<const double> dout,
                                       int64_t vocab, int64_t dim) {
  need(dout.size() == ids.size() * static_cast<size_t>(dim), "embedding_backward",
       "dout is not n*dim");
  std::vector<double> dw(static_cast<size_t>(vocab * dim), 0.0), comp(dw.size(), 0.0);
  for (size_t n = 0; n < ids.size(); ++n)
    if (ids[n] >= 0 && ids[n] < vocab)
      for (int64_t c = 0; c < dim; ++c) {  // Neumaier summation: exact to ~1 ulp
        double& s = dw[ids[n] * dim + c];
        const double v = dout[n * dim + c], t = s + v;
        comp[ids[n] * dim + c] += std::fabs(s) >= std::fabs(v) ? (s - t) + v : (v - t) + s;
        s = t;
      }
  for (size_t i = 0; i < dw.size(); ++i) dw[i] += comp[i];
  return dw;
}

}  // namespace tessel::ref
