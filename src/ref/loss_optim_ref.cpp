#include "ref/loss_optim_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessel::ref {

CrossEntropyResult cross_entropy(std::span<const double> x, std::span<const int64_t> t,
                                 int64_t rows, int64_t cols, int64_t ignore_index, double eps,
                                 int reduction, double grad_scale) {
  CrossEntropyResult r;
  r.row_loss.assign(static_cast<size_t>(rows), 0.0);
  r.dlogits.assign(static_cast<size_t>(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    if (t[i] != ignore_index) r.count += 1.0;
  const double scale =
      reduction == 1 ? grad_scale / r.count : grad_scale;  // count 0: no row is scaled
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = x.data() + i * cols;
    if (t[i] == ignore_index) continue;
    double m = -std::numeric_limits<double>::infinity(), sx = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      m = std::max(m, xr[j]);
      sx += xr[j];
    }
    double s = 0.0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - m);
    const double lse = m + std::log(s);
    const bool valid = t[i] >= 0 && t[i] < cols;
    r.row_loss[i] = valid ? lse - (1.0 - eps) * xr[t[i]] - eps / double(cols) * sx
                          : std::numeric_limits<double>::quiet_NaN();
    double* g = r.dlogits.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      double p = std::exp(xr[j] - m) / s - eps / double(cols);
      if (valid && j == t[i]) p -= 1.0 - eps;
      g[j] = scale * p;
    }
  }
  for (double l : r.row_loss) r.sum += l;
  return r;
}

LinearCrossEntropyResult linear_cross_entropy(std::span<const double> hid,
                                              std::span<const double> w,
                                              std::span<const int64_t> t, int64_t n, int64_t h,
                                              int64_t v, int64_t ignore_index, double eps,
                                              int reduction, double (*round)(double)) {
  std::vector<double> logits(static_cast<size_t>(n * v));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < h; ++k) acc += hid[i * h + k] * w[j * h + k];
      logits[i * v + j] = round ? round(acc) : acc;
    }
  LinearCrossEntropyResult r;
  r.ce = cross_entropy(logits, t, n, v, ignore_index, eps, reduction);
  r.dhidden.assign(static_cast<size_t>(n * h), 0.0);
  r.dweight.assign(static_cast<size_t>(v * h), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j) {
      const double g = r.ce.dlogits[i * v + j];
      if (g == 0.0) continue;
      for (int64_t k = 0; k < h; ++k) {
        r.dhidden[i * h + k] += g * w[j * h + k];
        r.dweight[j * h + k] += g * hid[i * h + k];
      }
    }
  return r;
}

void adamw(std::span<double> p, std::span<const double> g, std::span<double> m,
           std::span<double> v, double lr, double b1, double b2, double eps, double wd,
           int64_t step, bool bias_correction) {
  const double bc1 = bias_correction ? 1.0 - std::pow(b1, double(step)) : 1.0;
  const double bc2 = bias_correction ? 1.0 - std::pow(b2, double(step)) : 1.0;
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
    v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
    p[i] -= lr / bc1 * m[i] / denom;
  }
}

std::vector<double> concat(const std::vector<std::vector<double>>& inputs,
                           const std::vector<std::vector<int64_t>>& shapes, int axis) {
  const size_t nd = shapes.at(0).size();
  const int ax = axis < 0 ? axis + static_cast<int>(nd) : axis;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < ax; ++d) outer *= shapes[0][d];
  for (size_t d = ax + 1; d < nd; ++d) inner *= shapes[0][d];
  std::vector<double> out;
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t w = shapes[i][ax] * inner;
      out.insert(out.end(), inputs[i].begin() + o * w, inputs[i].begin() + (o + 1) * w);
    }
  return out;
}

std::vector<double> transpose_batched(std::span<const double> src, int64_t b, int64_t r,
                                      int64_t c) {
  std::vector<double> out(static_cast<size_t>(b * r * c));
  for (int64_t k = 0; k < b; ++k)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) out[k * r * c + j * r + i] = src[k * r * c + i * c + j];
  return out;
}

}  // namespace tessel::ref
