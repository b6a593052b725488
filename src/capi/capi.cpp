// C ABI over the C++ ops: exceptions become status codes, messages go to a thread-local slot.
#include <exception>
#include <string>

#include "capi/capi_util.hpp"
#include "tessel/launch.hpp"
#include "tessel/ops.hpp"
#include "tessel/tessel.h"

using namespace tessel::capi;

namespace tessel::capi {
std::string& last_error() {
  thread_local std::string message;
  return message;
}
}  // namespace tessel::capi

extern "C" {

tessel_status_t tessel_tensor_init(tessel_tensor_t* t, void* data, int32_t dtype, int32_t ndim,
                                   const int64_t* shape) {
  return guarded([&] {
    if (t == nullptr)
      throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT,
                          "tessel_tensor_init: argument 't': expected a tensor, got NULL");
    if (ndim < 0 || ndim > TESSEL_MAX_DIMS)
      throw tessel::Error(
          TESSEL_ERROR_INVALID_ARGUMENT,
          "tessel_tensor_init: argument 'ndim': expected 0..8, got " + std::to_string(ndim));
    if (ndim > 0 && shape == nullptr)
      throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT,
                          "tessel_tensor_init: argument 'shape': expected an array, got NULL");
    tessel::Tensor v =
        tessel::Tensor::contiguous(data, static_cast<tessel::DType>(dtype), ndim, shape);
    *t = tessel_tensor_t{};
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; ++d) {
      t->shape[d] = v.shape[d];
      t->strides[d] = v.strides[d];
    }
    t->device_kind = TESSEL_CUDA;
    t->device_index = 0;
  });
}

const char* tessel_last_error(void) { return last_error().c_str(); }

const char* tessel_status_string(tessel_status_t status) {
  switch (status) {
    case TESSEL_OK: return "ok";
    case TESSEL_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case TESSEL_ERROR_UNSUPPORTED: return "unsupported";
    case TESSEL_ERROR_CUDA: return "CUDA error";
    case TESSEL_ERROR_NO_DEVICE: return "no CUDA device";
    case TESSEL_ERROR_OUT_OF_MEMORY: return "out of memory";
    case TESSEL_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* tessel_version(void) { return tessel::version(); }

int tessel_cuda_device_count(void) { return tessel::cuda_device_count(); }

int tessel_set_dependent_launch(int enabled) {
  return tessel::set_dependent_launch(enabled != 0) ? 1 : 0;
}

tessel_status_t tessel_unary(int32_t op, const tessel_tensor_t* x, const tessel_tensor_t* y,
                             void* stream) {
  return guarded([&] {
    tessel::Tensor yt = to_tensor(y, "unary", "y");
    tessel::unary(static_cast<tessel::UnaryOp>(op), to_tensor(x, "unary", "x"), yt,
                  as_stream(stream));
  });
}

tessel_status_t tessel_binary(int32_t op, const tessel_tensor_t* a, const tessel_tensor_t* b,
                              const tessel_tensor_t* out, void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(out, "binary", "out");
    tessel::binary(static_cast<tessel::BinaryOp>(op), to_tensor(a, "binary", "a"),
                   to_tensor(b, "binary", "b"), o, as_stream(stream));
  });
}

tessel_status_t tessel_add(const tessel_tensor_t* a, const tessel_tensor_t* b,
                           const tessel_tensor_t* out, void* stream) {
  return tessel_binary(static_cast<int32_t>(tessel::BinaryOp::add), a, b, out, stream);
}

tessel_status_t tessel_mul(const tessel_tensor_t* a, const tessel_tensor_t* b,
                           const tessel_tensor_t* out, void* stream) {
  return tessel_binary(static_cast<int32_t>(tessel::BinaryOp::mul), a, b, out, stream);
}

tessel_status_t tessel_copy(const tessel_tensor_t* src, const tessel_tensor_t* dst, void* stream) {
  return guarded([&] {
    tessel::Tensor d = to_tensor(dst, "copy", "dst");
    tessel::copy(to_tensor(src, "copy", "src"), d, as_stream(stream));
  });
}

tessel_status_t tessel_transpose(const tessel_tensor_t* src, const tessel_tensor_t* dst,
                                 void* stream) {
  return guarded([&] {
    tessel::Tensor d = to_tensor(dst, "transpose", "dst");
    tessel::transpose(to_tensor(src, "transpose", "src"), d, as_stream(stream));
  });
}

tessel_status_t tessel_reduce_sum(const tessel_tensor_t* x, const tessel_tensor_t* out,
                                  void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(out, "reduce_sum", "out");
    tessel::reduce_sum(to_tensor(x, "reduce_sum", "x"), o, as_stream(stream));
  });
}

tessel_status_t tessel_reduce_sum_rows(const tessel_tensor_t* x, const tessel_tensor_t* out,
                                       void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(out, "reduce_sum_rows", "out");
    tessel::reduce_sum_rows(to_tensor(x, "reduce_sum_rows", "x"), o, as_stream(stream));
  });
}

tessel_status_t tessel_softmax(const tessel_tensor_t* x, const tessel_tensor_t* y, void* stream) {
  return guarded([&] {
    tessel::Tensor yt = to_tensor(y, "softmax", "y");
    tessel::softmax(to_tensor(x, "softmax", "x"), yt, as_stream(stream));
  });
}

tessel_status_t tessel_softmax_backward(const tessel_tensor_t* y, const tessel_tensor_t* dy,
                                        const tessel_tensor_t* dx, void* stream) {
  return guarded([&] {
    tessel::Tensor d = to_tensor(dx, "softmax_backward", "dx");
    tessel::softmax_backward(to_tensor(y, "softmax_backward", "y"),
                             to_tensor(dy, "softmax_backward", "dy"), d, as_stream(stream));
  });
}

}  // extern "C"
