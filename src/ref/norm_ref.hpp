// float64 references of the normalization ops (include/tessel/norm.hpp). Same conventions as
// reference.hpp: dense row-major host arrays, explicit rows/cols, sizes checked
// (std::invalid_argument naming the function and argument), IEEE semantics.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessel::ref {

struct NormForward {
  std::vector<double> y;
  std::vector<double> mean;  // per row (LayerNorm/GroupNorm; empty for RMSNorm)
  std::vector<double> rstd;  // per row
};

struct NormBackward {
  std::vector<double> dx;
  std::vector<double> dw;
  std::vector<double> db;  // LayerNorm/GroupNorm only
};

// x (rows, cols), w (cols): y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
NormForward rms_norm(std::span<const double> x, std::span<const double> w, int64_t rows,
                     int64_t cols, double eps);
// dx = rstd*(g - xhat*mean(g*xhat)) (+ dh if non-empty), g = dy*w, xhat = x*rstd (rstd recomputed
// from x in float64); dw = sum_rows dy*xhat.
NormBackward rms_norm_backward(std::span<const double> dy, std::span<const double> x,
                               std::span<const double> w, std::span<const double> dh,
                               int64_t rows, int64_t cols, double eps);

// y = (x - mean)*rstd*w (+ b if non-empty), rstd = 1/sqrt(var + eps), biased variance.
NormForward layer_norm(std::span<const double> x, std::span<const double> w,
                       std::span<const double> b, int64_t rows, int64_t cols, double eps);
// dx = rstd*(g - mean(g) - xhat*mean(g*xhat)); dw = sum dy*xhat; db = sum dy.
NormBackward layer_norm_backward(std::span<const double> dy, std::span<const double> x,
                                 std::span<const double> w, int64_t rows, int64_t cols,
                                 double eps);

// x (n, c, hw) dense; statistics per (n, g) over c/groups channels x hw; w, b (c).
// mean/rstd have n*groups entries.
NormForward group_norm(std::span<const double> x, std::span<const double> w,
                       std::span<const double> b, int64_t n, int64_t c, int64_t hw,
                       int64_t groups, double eps);
NormBackward group_norm_backward(std::span<const double> dy, std::span<const double> x,
                                 std::span<const double> w, int64_t n, int64_t c, int64_t hw,
                                 int64_t groups, double eps);

}  // namespace tessel::ref
