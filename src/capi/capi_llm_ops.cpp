// C ABI of the LLM operator set (include/tessel/tessel_llm_ops.h).
#include "capi/capi_util.hpp"
#include "tessel/activation.hpp"
#include "tessel/dropout.hpp"
#include "tessel/embedding.hpp"
#include "tessel/rope.hpp"
#include "tessel/tessel_llm_ops.h"

using tessel::capi::as_stream;
using tessel::capi::guarded;
using tessel::capi::to_tensor;

extern "C" {

tessel_status_t tessel_silu_and_mul(const tessel_tensor_t* x, const tessel_tensor_t* out, void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(out, "silu_and_mul", "out");
    tessel::silu_and_mul(to_tensor(x, "silu_and_mul", "x"), o, as_stream(stream));
  });
}

tessel_status_t tessel_silu_and_mul_backward(const tessel_tensor_t* x, const tessel_tensor_t* dout,
                                             const tessel_tensor_t* dx, void* stream) {
  return guarded([&] {
    const char* op = "silu_and_mul_backward";
    tessel::Tensor d = to_tensor(dx, op, "dx");
    tessel::silu_and_mul_backward(to_tensor(x, op, "x"), to_tensor(dout, op, "dout"), d, as_stream(stream));
  });
}

tessel_status_t tessel_gelu_and_mul(const tessel_tensor_t* x, const tessel_tensor_t* out,
                                    int32_t approx, void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(out, "gelu_and_mul", "out");
    tessel::gelu_and_mul(to_tensor(x, "gelu_and_mul", "x"), o, static_cast<tessel::GeluApprox>(approx),
                         as_stream(stream));
  });
}

tessel_status_t tessel_gelu_and_mul_backward(const tessel_tensor_t* x, const tessel_tensor_t* dout,
                                             const tessel_tensor_t* dx, int32_t approx, void* stream) {
  return guarded([&] {
    const char* op = "gelu_and_mul_backward";
    tessel::Tensor d = to_tensor(dx, op, "dx");
    tessel::gelu_and_mul_backward(to_tensor(x, op, "x"), to_tensor(dout, op, "dout"), d,
                                  static_cast<tessel::GeluApprox>(approx), as_stream(stream));
  });
}

tessel_status_t tessel_gelu(const tessel_tensor_t* x, const tessel_tensor_t* y, int32_t approx, void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(y, "gelu", "y");
    tessel::gelu(to_tensor(x, "gelu", "x"), o, static_cast<tessel::GeluApprox>(approx), as_stream(stream));
  });
}

tessel_status_t tessel_gelu_backward(const tessel_tensor_t* x, const tessel_tensor_t* dy,
                                     const tessel_tensor_t* dx, int32_t approx, void* stream) {
  return guarded([&] {
    tessel::Tensor d = to_tensor(dx, "gelu_backward", "dx");
    tessel::gelu_backward(to_tensor(x, "gelu_backward", "x"), to_tensor(dy, "gelu_backward", "dy"), d,
                          static_cast<tessel::GeluApprox>(approx), as_stream(stream));
  });
}

tessel_status_t tessel_dropout(const tessel_tensor_t* x, const tessel_tensor_t* y,
                               const tessel_tensor_t* mask, double p, uint64_t seed, uint64_t offset,
                               void* stream) {
  return guarded([&] {
    const char* op = mask ? "dropout_with_mask" : "dropout";
    tessel::Tensor yt = to_tensor(y, op, "y");
    if (mask) {
      tessel::Tensor m = to_tensor(mask, op, "mask");
      tessel::dropout_with_mask(to_tensor(x, op, "x"), yt, m, p, seed, offset, as_stream(stream));
    } else {
      tessel::dropout(to_tensor(x, op, "x"), yt, p, seed, offset, as_stream(stream));
    }
  });
}

tessel_status_t tessel_dropout_backward(const tessel_tensor_t* dy, const tessel_tensor_t* dx, double p,
                                        uint64_t seed, uint64_t offset, void* stream) {
  return guarded([&] {
    tessel::Tensor d = to_tensor(dx, "dropout_backward", "dx");
    tessel::dropout_backward(to_tensor(dy, "dropout_backward", "dy"), d, p, seed, offset, as_stream(stream));
  });
}

tessel_status_t tessel_rope(const tessel_tensor_t* q, const tessel_tensor_t* k,
                            const tessel_tensor_t* positions, const tessel_rope_params_t* params,
                            int32_t backward, void* stream) {
  return guarded([&] {
    const char* op = backward ? "rope_backward" : "rope";
    if (params == nullptr)
      throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT,
                          std::string("tessel::") + op + ": argument 'params': expected a tessel_rope_params_t, got NULL");
    tessel::RopeParams p;
    p.style = static_cast<tessel::RopeStyle>(params->style);
    p.llama3 = params->llama3 != 0;
    p.rotary_dim = params->rotary_dim;
    p.theta = params->theta;
    p.factor = params->factor;
    p.low_freq_factor = params->low_freq_factor;
    p.high_freq_factor = params->high_freq_factor;
    p.original_max_position_embeddings = params->original_max_position_embeddings;
    tessel::Tensor qt = to_tensor(q, op, backward ? "dq" : "q");
    tessel::Tensor kt = to_tensor(k, op, backward ? "dk" : "k");
    const tessel::Tensor pt = to_tensor(positions, op, "positions");
    if (backward) tessel::rope_backward(qt, kt, pt, p, as_stream(stream));
    else tessel::rope(qt, kt, pt, p, as_stream(stream));
  });
}

tessel_status_t tessel_embedding(const tessel_tensor_t* ids, const tessel_tensor_t* weight,
                                 const tessel_tensor_t* out, int32_t check_ids, void* stream) {
  return guarded([&] {
    tessel::Tensor o = to_tensor(out, "embedding", "out");
    tessel::embedding(to_tensor(ids, "embedding", "ids"), to_tensor(weight, "embedding", "weight"), o,
                      check_ids != 0, as_stream(stream));
  });
}

tessel_status_t tessel_embedding_backward(const tessel_tensor_t* ids, const tessel_tensor_t* dout,
                                          const tessel_tensor_t* dweight, int32_t mode,
                                          int32_t check_ids, void* stream) {
  return guarded([&] {
    const char* op = "embedding_backward";
    tessel::Tensor d = to_tensor(dweight, op, "dweight");
    tessel::embedding_backward(to_tensor(ids, op, "ids"), to_tensor(dout, op, "dout"), d,
                               static_cast<tessel::EmbeddingGradMode>(mode), check_ids != 0,
                               as_stream(stream));
  });
}

}  // extern "C"
