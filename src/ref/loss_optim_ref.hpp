// float64 references of the loss, optimizer and shape ops (loss.hpp, optim.hpp,
// shape_ops.hpp). Inputs are the (already rounded) values the GPU sees.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessel::ref {

struct CrossEntropyResult {
  std::vector<double> row_loss;  // (N); 0 on ignored rows, NaN on out-of-range targets
  double sum = 0.0;              // Σ row_loss
  double count = 0.0;            // #non-ignored rows
  std::vector<double> dlogits;   // (N, V): d(reduced loss)/dlogits · grad_scale
};
// reduction: 0 none (dlogits of Σ loss), 1 mean, 2 sum.
CrossEntropyResult cross_entropy(std::span<const double> logits, std::span<const int64_t> targets,
                                 int64_t rows, int64_t cols, int64_t ignore_index,
                                 double label_smoothing, int reduction, double grad_scale = 1.0);

// logits = hidden (N, H) · weightᵀ (V, H), optionally rounded to `round` (a quantize
// function, may be empty: no rounding), then cross_entropy; dhidden = dlogits · weight,
// dweight = dlogitsᵀ · hidden.
struct LinearCrossEntropyResult {
  CrossEntropyResult ce;
  std::vector<double> dhidden;  // (N, H)
  std::vector<double> dweight;  // (V, H)
};
LinearCrossEntropyResult linear_cross_entropy(std::span<const double> hidden,
                                              std::span<const double> weight,
                                              std::span<const int64_t> targets, int64_t n,
                                              int64_t h, int64_t v, int64_t ignore_index,
                                              double label_smoothing, int reduction,
                                              double (*round)(double) = nullptr);

// One AdamW step (torch.optim.AdamW) on p/m/v in place.
void adamw(std::span<double> p, std::span<const double> g, std::span<double> m,
           std::span<double> v, double lr, double beta1, double beta2, double eps,
           double weight_decay, int64_t step, bool bias_correction);

// cat along `axis` of tensors with shapes[i] (all same rank). Element values as doubles.
std::vector<double> concat(const std::vector<std::vector<double>>& inputs,
                           const std::vector<std::vector<int64_t>>& shapes, int axis);

// (B, R, C) -> (B, C, R).
std::vector<double> transpose_batched(std::span<const double> src, int64_t b, int64_t r,
                                      int64_t c);

}  // namespace tessel::ref
