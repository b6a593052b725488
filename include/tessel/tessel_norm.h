/* tessel C ABI: normalization ops (tessel/norm.hpp). Same conventions as tessel.h: status
 * codes, tessel_last_error(), void* streams. Optional tensors may be NULL. */
#ifndef TESSEL_TESSEL_NORM_H
#define TESSEL_TESSEL_NORM_H

#include <stdint.h>

#include "tessel/tessel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x * rstd * w; rstd (optional, f32, x.shape[:-1]) receives 1/sqrt(mean(x^2) + eps). */
tessel_status_t tessel_rms_norm(const tessel_tensor_t* x, const tessel_tensor_t* w,
                                const tessel_tensor_t* y, const tessel_tensor_t* rstd, float eps,
                                void* stream);
/* h = x + residual; y = rms_norm(h) * w (h may alias residual). */
tessel_status_t tessel_rms_norm_add(const tessel_tensor_t* x, const tessel_tensor_t* residual,
                                    const tessel_tensor_t* w, const tessel_tensor_t* h,
                                    const tessel_tensor_t* y, const tessel_tensor_t* rstd,
                                    float eps, void* stream);
/* dx (+= dh if given), dw from dy, the forward input x and rstd. */
tessel_status_t tessel_rms_norm_backward(const tessel_tensor_t* dy, const tessel_tensor_t* x,
                                         const tessel_tensor_t* w, const tessel_tensor_t* rstd,
                                         const tessel_tensor_t* dh, const tessel_tensor_t* dx,
                                         const tessel_tensor_t* dw, void* stream);
/* b, mean, rstd optional. */
tessel_status_t tessel_layer_norm(const tessel_tensor_t* x, const tessel_tensor_t* w,
                                  const tessel_tensor_t* b, const tessel_tensor_t* y,
                                  const tessel_tensor_t* mean, const tessel_tensor_t* rstd,
                                  float eps, void* stream);
/* db optional. */
tessel_status_t tessel_layer_norm_backward(const tessel_tensor_t* dy, const tessel_tensor_t* x,
                                           const tessel_tensor_t* w, const tessel_tensor_t* mean,
                                           const tessel_tensor_t* rstd, const tessel_tensor_t* dx,
                                           const tessel_tensor_t* dw, const tessel_tensor_t* db,
                                           void* stream);
/* x (N, C, *spatial); b, mean, rstd (N, groups) optional. */
tessel_status_t tessel_group_norm(const tessel_tensor_t* x, int64_t groups,
                                  const tessel_tensor_t* w, const tessel_tensor_t* b,
                                  const tessel_tensor_t* y, const tessel_tensor_t* mean,
                                  const tessel_tensor_t* rstd, float eps, void* stream);
/* db optional. */
tessel_status_t tessel_group_norm_backward(const tessel_tensor_t* dy, const tessel_tensor_t* x,
                                           int64_t groups, const tessel_tensor_t* w,
                                           const tessel_tensor_t* mean,
                                           const tessel_tensor_t* rstd, const tessel_tensor_t* dx,
                                           const tessel_tensor_t* dw, const tessel_tensor_t* db,
                                           void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_TESSEL_NORM_H */
