/* tessel C ABI: GEMM family (include/tessel/gemm.hpp).
 *
 *   D = act(alpha · A·B + bias) + beta · C
 *
 * tessel_gemm: a (M, K) [a_layout MK] or (K, M) [KM], b (N, K) [b_layout NK] or (K, N) [KN],
 *              d (M, N), c like d.
 * tessel_bmm:  a (batch, M, K) or (M, K) shared; b (batch, ...) or 2-D shared; d, c (batch, M, N).
 * bf16/f16 inputs, f32/f16/bf16 output; bias (N,) f32 or d's dtype; N, K multiples of 8.
 * Pass options = NULL for the defaults (alpha 1, beta 0, no c, B (N,K), no bias, no
 * activation, automatic split-K), or fill a struct with tessel_gemm_options_init first.
 * Status codes and tessel_last_error() as in tessel.h. */
#ifndef TESSEL_TESSEL_GEMM_H
#define TESSEL_TESSEL_GEMM_H

#include <stdint.h>

#include "tessel/tessel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tessel_gemm_b_layout_t {
  TESSEL_GEMM_B_NK = 0, /* b is (N, K) row-major: D = A · bᵀ (nn.Linear weight) */
  TESSEL_GEMM_B_KN = 1  /* b is (K, N) row-major: D = A · b */
} tessel_gemm_b_layout_t;

typedef enum tessel_gemm_a_layout_t {
  TESSEL_GEMM_A_MK = 0, /* a is (M, K) row-major */
  TESSEL_GEMM_A_KM = 1  /* a is (K, M) row-major: D = aᵀ · op(b) */
} tessel_gemm_a_layout_t;

typedef enum tessel_gemm_activation_t {
  TESSEL_GEMM_ACT_NONE = 0,
  TESSEL_GEMM_ACT_RELU = 1,
  TESSEL_GEMM_ACT_GELU_TANH = 2,
  TESSEL_GEMM_ACT_GELU = 3, /* erf */
  TESSEL_GEMM_ACT_SILU = 4
} tessel_gemm_activation_t;

typedef struct tessel_gemm_options_t {
  float alpha;
  float beta;                  /* != 0 needs c */
  const tessel_tensor_t* c;    /* NULL: none; may alias d */
  const tessel_tensor_t* bias; /* NULL: none */
  int32_t b_layout;            /* tessel_gemm_b_layout_t */
  int32_t activation;          /* tessel_gemm_activation_t */
  int32_t split_k;             /* 0 automatic, 1 never, S > 1 slices (deterministic) */
  int32_t a_layout;            /* tessel_gemm_a_layout_t (0, the former reserved field: MK) */
} tessel_gemm_options_t;

/* Fills the defaults. */
void tessel_gemm_options_init(tessel_gemm_options_t* options);

tessel_status_t tessel_gemm(const tessel_tensor_t* a, const tessel_tensor_t* b,
                            const tessel_tensor_t* d, const tessel_gemm_options_t* options,
                            void* stream);
tessel_status_t tessel_bmm(const tessel_tensor_t* a, const tessel_tensor_t* b,
                           const tessel_tensor_t* d, const tessel_gemm_options_t* options,
                           void* stream);

#ifdef __cplusplus
}
#endif

#endif
