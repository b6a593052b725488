/* tessel C ABI: attention forward (tessel/attention.hpp). Same conventions as tessel.h: status
 * codes, tessel_last_error(), void* streams. Optional tensors may be NULL. */
#ifndef TESSEL_TESSEL_ATTENTION_H
#define TESSEL_TESSEL_ATTENTION_H

#include <stdint.h>

#include "tessel/tessel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Masking and logit options (tessel::AttentionParams without the tensors). */
typedef struct tessel_attention_params_t {
  float scale;          /* <= 0: 1/sqrt(D) */
  int32_t causal;       /* nonzero: causal, bottom-right aligned */
  int32_t window_left;  /* -1: unlimited */
  int32_t window_right; /* -1: unlimited */
  float softcap;        /* 0: none */
} tessel_attention_params_t;

/* Defaults: scale 0 (1/sqrt(D)), not causal, no window, no softcap. */
void tessel_attention_params_init(tessel_attention_params_t* p);

/* q (B, Sq, Hq, D), k/v (B, Skv, Hkv, D), out like q, lse (B, Hq, Sq) f32 (optional);
 * varlen (cu_seqlens_q and cu_seqlens_k, int32 (B+1), both or neither): q (Tq, Hq, D),
 * k/v (Tk, Hkv, D), lse (Hq, Tq). sinks: f32 (Hq), optional. params NULL: defaults. */
tessel_status_t tessel_attention_forward(const tessel_tensor_t* q, const tessel_tensor_t* k,
                                         const tessel_tensor_t* v, const tessel_tensor_t* out,
                                         const tessel_tensor_t* lse,
                                         const tessel_attention_params_t* params,
                                         const tessel_tensor_t* sinks,
                                         const tessel_tensor_t* cu_seqlens_q,
                                         const tessel_tensor_t* cu_seqlens_k, void* stream);

#ifdef __cplusplus
}
#endif

/* The backward needs the forward's parameter struct above, so it is pulled in here. */
#include "tessel/tessel_attention_bwd.h"

#endif /* TESSEL_TESSEL_ATTENTION_H */
