// tessel optimizers: multi-tensor AdamW (one launch for a list of tensors).
#pragma once

#include <cstddef>

#include "tessel/tensor.hpp"

namespace tessel {

// One parameter tensor and its state. All tensors dense, same numel.
//   param      : f32, f16 or bf16. Updated in place (fp32 math) when master is absent;
//                with a master it receives the rounded copy of the updated master.
//   grad       : f32, f16 or bf16
//   exp_avg    : f32 (first moment),  exp_avg_sq : f32 (second moment)
//   master     : optional fp32 master weights (data == nullptr and ndim == 0: none)
struct AdamWTensors {
  Tensor param;
  Tensor grad;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  Tensor master;
};

// torch.optim.AdamW (decoupled weight decay), step counted from 1:
//   p  ← p · (1 − lr·wd)
//   m  ← β1·m + (1−β1)·g          v ← β2·v + (1−β2)·g²
//   p  ← p − lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps),  bc_k = 1 − β_k^step (1 without
//        bias correction)
struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  int64_t step = 1;  // >= 1
  bool bias_correction = true;
};

// Updates every tensor of `list` (count entries) in one launch (several for > 512 tensors).
void adamw(const AdamWTensors* list, size_t count, const AdamWOptions& opt, cudaStream_t stream);

}  // namespace tessel
