/* tessel C ABI: loss, optimizer and shape ops (tessel/loss.hpp, optim.hpp, shape_ops.hpp).
 * Same conventions as tessel.h: status codes, tessel_last_error(), void* streams. */
#ifndef TESSEL_TESSEL_LOSS_OPTIM_H
#define TESSEL_TESSEL_LOSS_OPTIM_H

#include <stdint.h>

#include "tessel/tessel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* reduction: 0 none, 1 mean, 2 sum. dlogits may be NULL (forward only) or logits (in place). */
tessel_status_t tessel_cross_entropy(const tessel_tensor_t* logits, const tessel_tensor_t* targets,
                                     const tessel_tensor_t* loss, const tessel_tensor_t* dlogits,
                                     int64_t ignore_index, float label_smoothing,
                                     int32_t reduction, float grad_scale, void* stream);

/* dhidden / dweight may be NULL; chunk_rows 0 = auto. */
tessel_status_t tessel_fused_linear_cross_entropy(
    const tessel_tensor_t* hidden, const tessel_tensor_t* weight, const tessel_tensor_t* targets,
    const tessel_tensor_t* loss, const tessel_tensor_t* dhidden, const tessel_tensor_t* dweight,
    int64_t ignore_index, float label_smoothing, int32_t reduction, int64_t chunk_rows,
    void* stream);

/* One AdamW step over `count` tensors; masters may be NULL (no master weights) or hold
 * tensors with data == NULL for entries without one. */
tessel_status_t tessel_adamw(const tessel_tensor_t* params, const tessel_tensor_t* grads,
                             const tessel_tensor_t* exp_avgs, const tessel_tensor_t* exp_avg_sqs,
                             const tessel_tensor_t* masters, int64_t count, float lr, float beta1,
                             float beta2, float eps, float weight_decay, int64_t step,
                             int32_t bias_correction, void* stream);

tessel_status_t tessel_concat(const tessel_tensor_t* inputs, int64_t count, int32_t axis,
                              const tessel_tensor_t* out, void* stream);

tessel_status_t tessel_transpose_batched(const tessel_tensor_t* src, const tessel_tensor_t* dst,
                                         void* stream);

#ifdef __cplusplus
}
#endif

#endif
