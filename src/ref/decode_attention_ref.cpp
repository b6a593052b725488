#include "ref/decode_attention_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tessel::ref {

void decode_attention(std::span<const double> q, std::span<const double> k,
                      std::span<const double> v, std::span<const int64_t> seqlens,
                      const DecodeRefConfig& c, std::vector<double>& out,
                      std::vector<double>& lse) {
  if (c.hkv <= 0 || c.hq % c.hkv != 0) throw std::invalid_argument("ref::decode_attention: heads");
  const int64_t group = c.hq / c.hkv;
  out.assign(static_cast<size_t>(c.batch * c.sq * c.hq * c.dv), 0.0);
  lse.assign(static_cast<size_t>(c.batch * c.sq * c.hq), 0.0);
  std::vector<double> score;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t len = seqlens[static_cast<size_t>(b)];
    for (int64_t s = 0; s < c.sq; ++s) {
      const int64_t last = len - c.sq + s;  // inclusive
      for (int64_t h = 0; h < c.hq; ++h) {
        const int64_t kvh = h / group;
        const double* qr = q.data() + ((b * c.sq + s) * c.hq + h) * c.dqk;
        score.assign(static_cast<size_t>(std::max<int64_t>(last + 1, 0)), 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t p = 0; p <= last; ++p) {
          const double* kr = k.data() + ((b * c.smax + p) * c.hkv + kvh) * c.dqk;
          double dot = 0.0;
          for (int64_t d = 0; d < c.dqk; ++d) dot += qr[d] * kr[d];
          double x = c.scale * dot;
          if (c.softcap > 0.0) x = c.softcap * std::tanh(x / c.softcap);
          score[static_cast<size_t>(p)] = x;
          mx = std::max(mx, x);
        }
        double sum = 0.0;
        for (double& x : score) sum += (x = std::exp(x - mx));
        double* o = out.data() + ((b * c.sq + s) * c.hq + h) * c.dv;
        for (int64_t p = 0; p <= last; ++p) {
          const double w = score[static_cast<size_t>(p)] / sum;
          const double* vr = v.data() + ((b * c.smax + p) * c.hkv + kvh) * c.dv;
          for (int64_t d = 0; d < c.dv; ++d) o[d] += w * vr[d];
        }
        lse[static_cast<size_t>((b * c.sq + s) * c.hq + h)] = mx + std::log(sum);
      }
    }
  }
}

std::vector<double> gather_pages(std::span<const double> pages, int64_t num_pages,
                                 int64_t page_size, int64_t row,
                                 std::span<const int64_t> block_table, int64_t batch,
                                 int64_t max_pages) {
  std::vector<double> outv(static_cast<size_t>(batch * max_pages * page_size * row), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < max_pages; ++j) {
      const int64_t pg = block_table[static_cast<size_t>(b * max_pages + j)];
      if (pg < 0 || pg >= num_pages) continue;
      std::copy_n(pages.data() + pg * page_size * row, page_size * row,
                  outv.data() + (b * max_pages + j) * page_size * row);
    }
  return outv;
}

void mla_decode(std::span<const double> q_latent, std::span<const double> q_rope,
                std::span<const double> cache, std::span<const int64_t> seqlens, int64_t batch,
                int64_t sq, int64_t heads, int64_t smax, double scale, std::vector<double>& out,
                std::vector<double>& lse) {
  constexpr int64_t kL = 512, kR = 64;
  const int64_t rows = batch * sq * heads;
  std::vector<double> q(static_cast<size_t>(rows * (kL + kR)));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(q_latent.data() + r * kL, kL, q.data() + r * (kL + kR));
    std::copy_n(q_rope.data() + r * kR, kR, q.data() + r * (kL + kR) + kL);
  }
  std::vector<double> v(static_cast<size_t>(batch * smax * kL));
  for (int64_t t = 0; t < batch * smax; ++t)
    std::copy_n(cache.data() + t * (kL + kR), kL, v.data() + t * kL);
  DecodeRefConfig c;
  c.batch = batch;
  c.sq = sq;
  c.hq = heads;
  c.hkv = 1;
  c.dqk = kL + kR;
  c.dv = kL;
  c.smax = smax;
  c.scale = scale;
  decode_attention(q, cache, v, seqlens, c, out, lse);
}

void append_kv(std::span<const double> new_rows, std::vector<double>& cache,
               std::span<const int64_t> seqlens, int64_t batch, int64_t sq, int64_t smax,
               int64_t row) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < sq; ++s) {
      const int64_t pos = seqlens[static_cast<size_t>(b)] - sq + s;
      if (pos < 0 || pos >= smax) continue;
      std::copy_n(new_rows.data() + (b * sq + s) * row, row, cache.data() + (b * smax + pos) * row);
    }
}

}  // namespace tessel::ref
