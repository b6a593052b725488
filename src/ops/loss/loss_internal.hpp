// Internal interface between the cross-entropy kernels (cross_entropy.cu) and the fused
// linear + cross-entropy driver (fused_linear_ce.cu). Not part of the public API.
#pragma once

#include <cstdint>

#include "tessel/loss.hpp"

namespace tessel::detail {

// One CE launch over `rows` rows: per-row fp32 losses into row_loss[0, rows), dlogits
// (optional) in the logits' dtype. `count` (device, may be null) holds the number of
// non-ignored targets of the whole batch: dlogits are scaled by grad_scale / *count.
struct CeLaunch {
  DType dtype = DType::bf16;
  const void* x = nullptr;
  void* dx = nullptr;  // may equal x
  int64_t rows = 0, cols = 0, x_pitch = 0, dx_pitch = 0;
  const void* targets = nullptr;
  bool targets_i64 = false;
  int64_t ignore_index = -100;
  float smoothing = 0.f;
  float grad_scale = 1.f;
  const float* count = nullptr;
  float* row_loss = nullptr;
};
void ce_launch(const CeLaunch& p, cudaStream_t stream);

// count[0] = #{i < n : targets[i] != ignore_index} (as float).
void ce_count(const void* targets, bool i64, int64_t n, int64_t ignore_index, float* count,
              cudaStream_t stream);

// loss (none: n elements; mean/sum: one) from row_loss[0, n); then zeroes row_loss[0, n) and
// count[0] (workspace contract: left zeroed). out_dtype f32/f16/bf16.
void ce_finalize(const float* row_loss, float* row_loss_mut, float* count, int64_t n,
                 Reduction reduction, void* out, DType out_dtype, cudaStream_t stream);

}  // namespace tessel::detail

#include "runtime/check.hpp"

namespace tessel::detail {
void check_ce_options(const OpCheck& chk, const CrossEntropyOptions& opt);
void check_ce_targets(const OpCheck& chk, const Tensor& targets, int64_t n);
void check_ce_loss(const OpCheck& chk, const Tensor& loss, DType dt, int64_t n, Reduction r);
}  // namespace tessel::detail
