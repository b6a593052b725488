// Shared by the C ABI translation units (src/capi/capi*.cpp): tensor conversion and the
// exception-to-status guard. Each op family's C functions live in its own capi_<family>.cpp.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "tessel/tensor.hpp"
#include "tessel/tessel.h"

namespace tessel::capi {

// The thread's last error message (tessel_last_error()).
std::string& last_error();

inline tessel::Tensor to_tensor(const tessel_tensor_t* t, const char* op, const char* arg) {
  if (t == nullptr)
    throw tessel::Error(
        TESSEL_ERROR_INVALID_ARGUMENT,
        std::string("tessel::") + op + ": argument '" + arg + "': expected a tensor, got NULL");
  if (t->ndim < 0 || t->ndim > TESSEL_MAX_DIMS)
    throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT,
                        std::string("tessel::") + op + ": argument '" + arg +
                            "': expected ndim in 0..8, got " + std::to_string(t->ndim));
  tessel::Tensor r;
  r.data = t->data;
  r.dtype = static_cast<tessel::DType>(t->dtype);
  r.ndim = t->ndim;
  for (int d = 0; d < t->ndim; ++d) {
    r.shape[d] = t->shape[d];
    r.strides[d] = t->strides[d];
  }
  r.device.kind = static_cast<tessel::DeviceKind>(t->device_kind);
  r.device.index = t->device_index;
  return r;
}

template <class F>
tessel_status_t guarded(F&& f) {
  try {
    f();
    last_error().clear();
    return TESSEL_OK;
  } catch (const tessel::Error& e) {
    last_error() = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    last_error() = "tessel: host out of memory";
    return TESSEL_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error() = std::string("tessel: internal error: ") + e.what();
    return TESSEL_ERROR_INTERNAL;
  } catch (...) {
    last_error() = "tessel: internal error (unknown exception)";
    return TESSEL_ERROR_INTERNAL;
  }
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace tessel::capi
