/* tessel C ABI: LLM operator set (activations, dropout, RoPE, embedding). See the C++
 * headers tessel/activation.hpp, dropout.hpp, rope.hpp, embedding.hpp for the semantics. */
#ifndef TESSEL_LLM_OPS_H
#define TESSEL_LLM_OPS_H

#include <stdint.h>

#include "tessel/tessel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gelu_approx: 0 exact (erf), 1 tanh. */
tessel_status_t tessel_silu_and_mul(const tessel_tensor_t* x, const tessel_tensor_t* out, void* stream);
tessel_status_t tessel_silu_and_mul_backward(const tessel_tensor_t* x, const tessel_tensor_t* dout,
                                             const tessel_tensor_t* dx, void* stream);
tessel_status_t tessel_gelu_and_mul(const tessel_tensor_t* x, const tessel_tensor_t* out,
                                    int32_t gelu_approx, void* stream);
tessel_status_t tessel_gelu_and_mul_backward(const tessel_tensor_t* x, const tessel_tensor_t* dout,
                                             const tessel_tensor_t* dx, int32_t gelu_approx,
                                             void* stream);
tessel_status_t tessel_gelu(const tessel_tensor_t* x, const tessel_tensor_t* y, int32_t gelu_approx,
                            void* stream);
tessel_status_t tessel_gelu_backward(const tessel_tensor_t* x, const tessel_tensor_t* dy,
                                     const tessel_tensor_t* dx, int32_t gelu_approx, void* stream);

/* mask may be NULL. */
tessel_status_t tessel_dropout(const tessel_tensor_t* x, const tessel_tensor_t* y,
                               const tessel_tensor_t* mask, double p, uint64_t seed,
                               uint64_t offset, void* stream);
tessel_status_t tessel_dropout_backward(const tessel_tensor_t* dy, const tessel_tensor_t* dx,
                                        double p, uint64_t seed, uint64_t offset, void* stream);

/* style: 0 neox, 1 gptj; rotary_dim 0 = head dim; llama3 != 0 enables Llama-3 scaling. */
typedef struct tessel_rope_params_t {
  int32_t style;
  int32_t llama3;
  int64_t rotary_dim;
  double theta;
  double factor;
  double low_freq_factor;
  double high_freq_factor;
  int64_t original_max_position_embeddings;
} tessel_rope_params_t;

tessel_status_t tessel_rope(const tessel_tensor_t* q, const tessel_tensor_t* k,
                            const tessel_tensor_t* positions, const tessel_rope_params_t* params,
                            int32_t backward, void* stream);

/* mode: 0 deterministic, 1 atomic. check_ids != 0: range check + stream sync. */
tessel_status_t tessel_embedding(const tessel_tensor_t* ids, const tessel_tensor_t* weight,
                                 const tessel_tensor_t* out, int32_t check_ids, void* stream);
tessel_status_t tessel_embedding_backward(const tessel_tensor_t* ids, const tessel_tensor_t* dout,
                                          const tessel_tensor_t* dweight, int32_t mode,
                                          int32_t check_ids, void* stream);

#ifdef __cplusplus
}
#endif

#endif
