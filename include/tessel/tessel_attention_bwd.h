/* tessel C ABI: attention backward (tessel/attention_backward.hpp). Same conventions as
 * tessel.h: status codes, tessel_last_error(), void* streams. Optional tensors may be NULL. */
#ifndef TESSEL_TESSEL_ATTENTION_BWD_H
#define TESSEL_TESSEL_ATTENTION_BWD_H

#include <stdint.h>

#include "tessel/tessel.h"
#include "tessel/tessel_attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gradients of tessel_attention_forward: q, k, v, out (the forward's output), dout (like
 * out) and lse (the forward's f32 lse, required) in; dq (like q), dk and dv (like k) out.
 * Layouts, params, sinks and cu_seqlens as tessel_attention_forward. d_sinks: f32 (Hq),
 * optional (needs sinks). deterministic nonzero: bitwise reproducible (no float atomics). */
tessel_status_t tessel_attention_backward(
    const tessel_tensor_t* q, const tessel_tensor_t* k, const tessel_tensor_t* v,
    const tessel_tensor_t* out, const tessel_tensor_t* dout, const tessel_tensor_t* lse,
    const tessel_tensor_t* dq, const tessel_tensor_t* dk, const tessel_tensor_t* dv,
    const tessel_attention_params_t* params, const tessel_tensor_t* sinks,
    const tessel_tensor_t* d_sinks, const tessel_tensor_t* cu_seqlens_q,
    const tessel_tensor_t* cu_seqlens_k, int32_t deterministic, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_TESSEL_ATTENTION_BWD_H */
