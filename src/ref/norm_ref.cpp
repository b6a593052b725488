// float64 references of the normalization ops (see norm_ref.hpp).
//
// All three norms are one computation on "rows": RMS/LN rows are the matrix rows with the
// affine parameter indexed by column; a GroupNorm row is one (n, g) block of cpg*hw
// elements with the parameter indexed by channel g*cpg + col/hw.
#include "ref/norm_ref.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tessel::ref {
namespace {

void need(const char* fn, const char* arg, size_t got, size_t want) {
  if (got != want)
    throw std::invalid_argument(std::string("tessel::ref::") + fn + ": '" + arg + "' has " +
                                std::to_string(got) + " elements, expected " +
                                std::to_string(want));
}

void need_dims(const char* fn, int64_t a, int64_t b) {
  if (a < 0 || b < 0)
    throw std::invalid_argument(std::string("tessel::ref::") + fn + ": negative size");
}

// Kahan-free but exact enough: double accumulation of at most 2^18 terms of bounded inputs.
struct Rows {
  int64_t rows, cols;
  // parameter index of (row, col)
  int64_t hw = 0, cpg = 0, groups = 0;  // hw == 0: index = col
  int64_t param(int64_t row, int64_t col) const {
    return hw == 0 ? col : (row % groups) * cpg + col / hw;
  }
};

NormForward forward(const Rows& r, std::span<const double> x, std::span<const double> w,
                    std::span<const double> b, bool rms, double eps) {
  NormForward out;
  out.y.resize(x.size());
  out.rstd.resize(static_cast<size_t>(r.rows));
  if (!rms) out.mean.resize(static_cast<size_t>(r.rows));
  for (int64_t i = 0; i < r.rows; ++i) {
    const double* xr = x.data() + i * r.cols;
    double mean = 0.0;
    if (!rms) {
      for (int64_t c = 0; c < r.cols; ++c) mean += xr[c];
      mean /= static_cast<double>(r.cols);
    }
    double ss = 0.0;
    for (int64_t c = 0; c < r.cols; ++c) ss += (xr[c] - mean) * (xr[c] - mean);
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(r.cols) + eps);
    out.rstd[static_cast<size_t>(i)] = rstd;
    if (!rms) out.mean[static_cast<size_t>(i)] = mean;
    for (int64_t c = 0; c < r.cols; ++c) {
      const int64_t p = r.param(i, c);
      double v = (xr[c] - mean) * rstd * w[static_cast<size_t>(p)];
      if (!b.empty()) v += b[static_cast<size_t>(p)];
      out.y[static_cast<size_t>(i * r.cols + c)] = v;
    }
  }
  return out;
}

NormBackward backward(const Rows& r, std::span<const double> dy, std::span<const double> x,
                      std::span<const double> w, std::span<const double> dh, bool rms,
                      double eps, size_t nparams) {
  const NormForward f = forward(r, x, w, {}, rms, eps);
  NormBackward out;
  out.dx.resize(x.size());
  out.dw.assign(nparams, 0.0);
  if (!rms) out.db.assign(nparams, 0.0);
  const double n = static_cast<double>(r.cols);
  for (int64_t i = 0; i < r.rows; ++i) {
    const double mean = rms ? 0.0 : f.mean[static_cast<size_t>(i)];
    const double rstd = f.rstd[static_cast<size_t>(i)];
    double s_gx = 0.0, s_g = 0.0;
    for (int64_t c = 0; c < r.cols; ++c) {
      const size_t k = static_cast<size_t>(i * r.cols + c);
      const size_t p = static_cast<size_t>(r.param(i, c));
      const double xh = (x[k] - mean) * rstd;
      const double g = dy[k] * w[p];
      s_gx += g * xh;
      s_g += g;
      out.dw[p] += dy[k] * xh;
      if (!rms) out.db[p] += dy[k];
    }
    for (int64_t c = 0; c < r.cols; ++c) {
      const size_t k = static_cast<size_t>(i * r.cols + c);
      const size_t p = static_cast<size_t>(r.param(i, c));
      const double xh = (x[k] - mean) * rstd;
      const double g = dy[k] * w[p];
      double v = rstd * (g - xh * s_gx / n - (rms ? 0.0 : s_g / n));
      if (!dh.empty()) v += dh[k];
      out.dx[k] = v;
    }
  }
  return out;
}

}  // namespace

NormForward rms_norm(std::span<const double> x, std::span<const double> w, int64_t rows,
                     int64_t cols, double eps) {
  need_dims("rms_norm", rows, cols);
  need("rms_norm", "x", x.size(), static_cast<size_t>(rows * cols));
  need("rms_norm", "w", w.size(), static_cast<size_t>(cols));
  return forward(Rows{rows, cols}, x, w, {}, true, eps);
}

NormBackward rms_norm_backward(std::span<const double> dy, std::span<const double> x,
                               std::span<const double> w, std::span<const double> dh,
                               int64_t rows, int64_t cols, double eps) {
  need_dims("rms_norm_backward", rows, cols);
  const size_t n = static_cast<size_t>(rows * cols);
  need("rms_norm_backward", "dy", dy.size(), n);
  need("rms_norm_backward", "x", x.size(), n);
  need("rms_norm_backward", "w", w.size(), static_cast<size_t>(cols));
  if (!dh.empty()) need("rms_norm_backward", "dh", dh.size(), n);
  return backward(Rows{rows, cols}, dy, x, w, dh, true, eps, static_cast<size_t>(cols));
}

NormForward layer_norm(std::span<const double> x, std::span<const double> w,
                       std::span<const double> b, int64_t rows, int64_t cols, double eps) {
  need_dims("layer_norm", rows, cols);
  need("layer_norm", "x", x.size(), static_cast<size_t>(rows * cols));
  need("layer_norm", "w", w.size(), static_cast<size_t>(cols));
  if (!b.empty()) need("layer_norm", "b", b.size(), static_cast<size_t>(cols));
  return forward(Rows{rows, cols}, x, w, b, false, eps);
}

NormBackward layer_norm_backward(std::span<const double> dy, std::span<const double> x,
                                 std::span<const double> w, int64_t rows, int64_t cols,
                                 double eps) {
  need_dims("layer_norm_backward", rows, cols);
  const size_t n = static_cast<size_t>(rows * cols);
  need("layer_norm_backward", "dy", dy.size(), n);
  need("layer_norm_backward", "x", x.size(), n);
  need("layer_norm_backward", "w", w.size(), static_cast<size_t>(cols));
  return backward(Rows{rows, cols}, dy, x, w, {}, false, eps, static_cast<size_t>(cols));
}

namespace {
Rows gn_rows(const char* fn, int64_t n, int64_t c, int64_t hw, int64_t groups) {
  if (n < 0 || c < 0 || hw < 0 || groups < 1 || c % groups != 0)
    throw std::invalid_argument(std::string("tessel::ref::") + fn +
                                ": need n, c, hw >= 0 and groups > 0 dividing c");
  Rows r{n * groups, c / groups * hw};
  r.hw = hw == 0 ? 1 : hw;
  r.cpg = c / groups;
  r.groups = groups;
  return r;
}
}  // namespace

NormForward group_norm(std::span<const double> x, std::span<const double> w,
                       std::span<const double> b, int64_t n, int64_t c, int64_t hw,
                       int64_t groups, double eps) {
  const Rows r = gn_rows("group_norm", n, c, hw, groups);
  need("group_norm", "x", x.size(), static_cast<size_t>(n * c * hw));
  need("group_norm", "w", w.size(), static_cast<size_t>(c));
  if (!b.empty()) need("group_norm", "b", b.size(), static_cast<size_t>(c));
  return forward(r, x, w, b, false, eps);
}

NormBackward group_norm_backward(std::span<const double> dy, std::span<const double> x,
                                 std::span<const double> w, int64_t n, int64_t c, int64_t hw,
                                 int64_t groups, double eps) {
  const Rows r = gn_rows("group_norm_backward", n, c, hw, groups);
  const size_t total = static_cast<size_t>(n * c * hw);
  need("group_norm_backward", "dy", dy.size(), total);
  need("group_norm_backward", "x", x.size(), total);
  need("group_norm_backward", "w", w.size(), static_cast<size_t>(c));
  return backward(r, dy, x, w, {}, false, eps, static_cast<size_t>(c));
}

}  // namespace tessel::ref
