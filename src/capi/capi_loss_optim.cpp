// C ABI of the loss, optimizer and shape ops (include/tessel/tessel_loss_optim.h).
#include <string>
#include <vector>

#include "capi/capi_util.hpp"
#include "tessel/loss.hpp"
#include "tessel/optim.hpp"
#include "tessel/shape_ops.hpp"
#include "tessel/tessel_loss_optim.h"

using namespace tessel::capi;

namespace {
void need_array(const void* p, int64_t count, const char* op, const char* arg) {
  if (count < 0)
    throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT, std::string("tessel::") + op +
                                                           ": argument 'count': expected >= 0, got " +
                                                           std::to_string(count));
  if (count > 0 && p == nullptr)
    throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT, std::string("tessel::") + op +
                                                           ": argument '" + arg +
                                                           "': expected an array, got NULL");
}
}  // namespace

extern "C" {

tessel_status_t tessel_cross_entropy(const tessel_tensor_t* logits, const tessel_tensor_t* targets,
                                     const tessel_tensor_t* loss, const tessel_tensor_t* dlogits,
                                     int64_t ignore_index, float label_smoothing,
                                     int32_t reduction, float grad_scale, void* stream) {
  return guarded([&] {
    const char* op = "cross_entropy";
    tessel::Tensor l = to_tensor(loss, op, "loss");
    tessel::Tensor d;
    if (dlogits != nullptr) d = to_tensor(dlogits, op, "dlogits");
    tessel::CrossEntropyOptions o;
    o.ignore_index = ignore_index;
    o.label_smoothing = label_smoothing;
    o.reduction = static_cast<tessel::Reduction>(reduction);
    o.grad_scale = grad_scale;
    tessel::cross_entropy(to_tensor(logits, op, "logits"), to_tensor(targets, op, "targets"), l,
                          dlogits != nullptr ? &d : nullptr, as_stream(stream), o);
  });
}

tessel_status_t tessel_fused_linear_cross_entropy(
    const tessel_tensor_t* hidden, const tessel_tensor_t* weight, const tessel_tensor_t* targets,
    const tessel_tensor_t* loss, const tessel_tensor_t* dhidden, const tessel_tensor_t* dweight,
    int64_t ignore_index, float label_smoothing, int32_t reduction, int64_t chunk_rows,
    void* stream) {
  return guarded([&] {
    const char* op = "fused_linear_cross_entropy";
    tessel::Tensor l = to_tensor(loss, op, "loss");
    tessel::Tensor dh, dw;
    if (dhidden != nullptr) dh = to_tensor(dhidden, op, "dhidden");
    if (dweight != nullptr) dw = to_tensor(dweight, op, "dweight");
    tessel::FusedLinearCrossEntropyOptions o;
    o.ce.ignore_index = ignore_index;
    o.ce.label_smoothing = label_smoothing;
    o.ce.reduction = static_cast<tessel::Reduction>(reduction);
    o.chunk_rows = chunk_rows;
    tessel::fused_linear_cross_entropy(to_tensor(hidden, op, "hidden"),
                                       to_tensor(weight, op, "weight"),
                                       to_tensor(targets, op, "targets"), l,
                                       dhidden != nullptr ? &dh : nullptr,
                                       dweight != nullptr ? &dw : nullptr, as_stream(stream), o);
  });
}

tessel_status_t tessel_adamw(const tessel_tensor_t* params, const tessel_tensor_t* grads,
                             const tessel_tensor_t* exp_avgs, const tessel_tensor_t* exp_avg_sqs,
                             const tessel_tensor_t* masters, int64_t count, float lr, float beta1,
                             float beta2, float eps, float weight_decay, int64_t step,
                             int32_t bias_correction, void* stream) {
  return guarded([&] {
    const char* op = "adamw";
    need_array(params, count, op, "params");
    need_array(grads, count, op, "grads");
    need_array(exp_avgs, count, op, "exp_avgs");
    need_array(exp_avg_sqs, count, op, "exp_avg_sqs");
    std::vector<tessel::AdamWTensors> list(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      list[i].param = to_tensor(&params[i], op, "params");
      list[i].grad = to_tensor(&grads[i], op, "grads");
      list[i].exp_avg = to_tensor(&exp_avgs[i], op, "exp_avgs");
      list[i].exp_avg_sq = to_tensor(&exp_avg_sqs[i], op, "exp_avg_sqs");
      if (masters != nullptr && masters[i].data != nullptr)
        list[i].master = to_tensor(&masters[i], op, "masters");
    }
    tessel::AdamWOptions o;
    o.lr = lr;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.eps = eps;
    o.weight_decay = weight_decay;
    o.step = step;
    o.bias_correction = bias_correction != 0;
    tessel::adamw(list.data(), list.size(), o, as_stream(stream));
  });
}

tessel_status_t tessel_concat(const tessel_tensor_t* inputs, int64_t count, int32_t axis,
                              const tessel_tensor_t* out, void* stream) {
  return guarded([&] {
    need_array(inputs, count, "concat", "inputs");
    std::vector<tessel::Tensor> in(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) in[i] = to_tensor(&inputs[i], "concat", "inputs");
    tessel::Tensor o = to_tensor(out, "concat", "out");
    tessel::concat(in.data(), in.size(), axis, o, as_stream(stream));
  });
}

tessel_status_t tessel_transpose_batched(const tessel_tensor_t* src, const tessel_tensor_t* dst,
                                         void* stream) {
  return guarded([&] {
    tessel::Tensor d = to_tensor(dst, "transpose_batched", "dst");
    tessel::transpose_batched(to_tensor(src, "transpose_batched", "src"), d, as_stream(stream));
  });
}

}  // extern "C"
