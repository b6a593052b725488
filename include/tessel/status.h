/* Plain-C enums shared by the C++ API and the C ABI. */
#ifndef TESSEL_STATUS_H
#define TESSEL_STATUS_H

typedef enum tessel_status_t {
  TESSEL_OK = 0,
  TESSEL_ERROR_INVALID_ARGUMENT = 1, /* wrong dtype, shape, stride, alignment, pointer */
  TESSEL_ERROR_UNSUPPORTED = 2,      /* valid request this build cannot do */
  TESSEL_ERROR_CUDA = 3,             /* a CUDA runtime/driver call failed */
  TESSEL_ERROR_NO_DEVICE = 4,        /* no CUDA GPU */
  TESSEL_ERROR_OUT_OF_MEMORY = 5,
  TESSEL_ERROR_INTERNAL = 6,
} tessel_status_t;

typedef enum tessel_dtype_t {
  TESSEL_F32 = 0,
  TESSEL_F16 = 1,
  TESSEL_BF16 = 2,
  TESSEL_F8_E4M3 = 3,
  TESSEL_F8_E5M2 = 4,
  TESSEL_I32 = 5,
  TESSEL_I64 = 6,
  TESSEL_U8 = 7,
} tessel_dtype_t;

typedef enum tessel_device_kind_t { TESSEL_CPU = 0, TESSEL_CUDA = 1 } tessel_device_kind_t;

#define TESSEL_MAX_DIMS 8

#endif
