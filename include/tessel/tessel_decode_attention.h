/* tessel C ABI: decode attention over a contiguous or paged KV cache, the KV append and MLA
 * decode. See the C++ header tessel/decode_attention.hpp for the semantics.
 * block_table NULL: contiguous cache; lse NULL: not written; params NULL: defaults. */
#ifndef TESSEL_DECODE_ATTENTION_H
#define TESSEL_DECODE_ATTENTION_H

#include <stdint.h>

#include "tessel/tessel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tessel_decode_params_t {
  double scale;         /* 0: 1/sqrt(D) (MLA: 1/sqrt(576)) */
  double softcap;       /* 0: off */
  int32_t num_splits;   /* 0: heuristic from the SM count */
  int32_t check_inputs; /* != 0: range-check seqlens / block_table, synchronize, fail clearly */
  int64_t max_seqlen;   /* longest sequence known to the caller, for the split plan only; 0: the
                           cache capacity (see DecodeParams::max_seqlen) */
} tessel_decode_params_t;

tessel_status_t tessel_decode_attention(const tessel_tensor_t* q, const tessel_tensor_t* k_cache,
                                        const tessel_tensor_t* v_cache,
                                        const tessel_tensor_t* block_table,
                                        const tessel_tensor_t* seqlens, const tessel_tensor_t* out,
                                        const tessel_tensor_t* lse,
                                        const tessel_decode_params_t* params, void* stream);

tessel_status_t tessel_append_kv(const tessel_tensor_t* k_new, const tessel_tensor_t* v_new,
                                 const tessel_tensor_t* k_cache, const tessel_tensor_t* v_cache,
                                 const tessel_tensor_t* block_table, const tessel_tensor_t* seqlens,
                                 int32_t check_inputs, void* stream);

tessel_status_t tessel_mla_decode(const tessel_tensor_t* q_latent, const tessel_tensor_t* q_rope,
                                  const tessel_tensor_t* latent_cache,
                                  const tessel_tensor_t* block_table,
                                  const tessel_tensor_t* seqlens, const tessel_tensor_t* out,
                                  const tessel_tensor_t* lse, const tessel_decode_params_t* params,
                                  void* stream);

tessel_status_t tessel_append_latent(const tessel_tensor_t* c_new,
                                     const tessel_tensor_t* latent_cache,
                                     const tessel_tensor_t* block_table,
                                     const tessel_tensor_t* seqlens, int32_t check_inputs,
                                     void* stream);

#ifdef __cplusplus
}
#endif

#endif
