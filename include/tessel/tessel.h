/* tessel C ABI: every op as a C function returning a status code.
 * On failure tessel_last_error() returns the message (thread-local) and no output was written.
 * Streams are passed as void* (a cudaStream_t; NULL is the legacy default stream). */
#ifndef TESSEL_TESSEL_H
#define TESSEL_TESSEL_H

#include <stdint.h>

#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tessel_tensor_t {
  void* data;
  int32_t dtype; /* tessel_dtype_t */
  int32_t ndim;
  int64_t shape[TESSEL_MAX_DIMS];
  int64_t strides[TESSEL_MAX_DIMS]; /* in elements */
  int32_t device_kind;              /* tessel_device_kind_t */
  int32_t device_index;
} tessel_tensor_t;

/* Fills `t` as a dense row-major view. Returns TESSEL_ERROR_INVALID_ARGUMENT for ndim > 8. */
tessel_status_t tessel_tensor_init(tessel_tensor_t* t, void* data, int32_t dtype, int32_t ndim,
                                   const int64_t* shape);

const char* tessel_last_error(void);
const char* tessel_status_string(tessel_status_t status);
const char* tessel_version(void);
int tessel_cuda_device_count(void);
/* Programmatic dependent launch on the calling thread (see include/tessel/launch.hpp: the
   decode-path kernels may start while their predecessor drains; the small-M GEMM reads its B
   operand before waiting, so enable it only where B is not written by the kernel just before).
   Returns the previous setting (0 or 1). */
int tessel_set_dependent_launch(int enabled);

/* op: 0 identity, 1 neg, 2 abs, 3 exp, 4 relu, 5 sigmoid, 6 silu, 7 square */
tessel_status_t tessel_unary(int32_t op, const tessel_tensor_t* x, const tessel_tensor_t* y,
                             void* stream);
/* op: 0 add, 1 sub, 2 mul, 3 div, 4 maximum, 5 minimum */
tessel_status_t tessel_binary(int32_t op, const tessel_tensor_t* a, const tessel_tensor_t* b,
                              const tessel_tensor_t* out, void* stream);
tessel_status_t tessel_add(const tessel_tensor_t* a, const tessel_tensor_t* b,
                           const tessel_tensor_t* out, void* stream);
tessel_status_t tessel_mul(const tessel_tensor_t* a, const tessel_tensor_t* b,
                           const tessel_tensor_t* out, void* stream);
tessel_status_t tessel_copy(const tessel_tensor_t* src, const tessel_tensor_t* dst, void* stream);
tessel_status_t tessel_transpose(const tessel_tensor_t* src, const tessel_tensor_t* dst,
                                 void* stream);
tessel_status_t tessel_reduce_sum(const tessel_tensor_t* x, const tessel_tensor_t* out,
                                  void* stream);
tessel_status_t tessel_reduce_sum_rows(const tessel_tensor_t* x, const tessel_tensor_t* out,
                                       void* stream);
tessel_status_t tessel_softmax(const tessel_tensor_t* x, const tessel_tensor_t* y, void* stream);
tessel_status_t tessel_softmax_backward(const tessel_tensor_t* y, const tessel_tensor_t* dy,
                                        const tessel_tensor_t* dx, void* stream);

#ifdef __cplusplus
}
#endif

/* Op families, each in its own header (they include this one for tessel_tensor_t). */
#include "tessel/tessel_attention.h"
#include "tessel/tessel_decode_attention.h"
#include "tessel/tessel_gemm.h"
#include "tessel/tessel_llm_ops.h"
#include "tessel/tessel_loss_optim.h"
#include "tessel/tessel_norm.h"

#endif
