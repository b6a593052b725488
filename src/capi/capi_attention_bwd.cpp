// C ABI of the attention backward (include/tessel/tessel_attention_bwd.h).
#include <optional>

#include "capi_util.hpp"
#include "tessel/attention_backward.hpp"
#include "tessel/tessel_attention_bwd.h"

using tessel::capi::as_stream;
using tessel::capi::guarded;
using tessel::capi::to_tensor;

namespace {
std::optional<tessel::Tensor> opt(const tessel_tensor_t* t, const char* op, const char* arg) {
  if (t == nullptr) return std::nullopt;
  return to_tensor(t, op, arg);
}
template <class T>
T* ptr(std::optional<T>& o) {
  return o ? &*o : nullptr;
}
}  // namespace

extern "C" {

tessel_status_t tessel_attention_backward(
    const tessel_tensor_t* q, const tessel_tensor_t* k, const tessel_tensor_t* v,
    const tessel_tensor_t* out, const tessel_tensor_t* dout, const tessel_tensor_t* lse,
    const tessel_tensor_t* dq, const tessel_tensor_t* dk, const tessel_tensor_t* dv,
    const tessel_attention_params_t* params, const tessel_tensor_t* sinks,
    const tessel_tensor_t* d_sinks, const tessel_tensor_t* cu_seqlens_q,
    const tessel_tensor_t* cu_seqlens_k, int32_t deterministic, void* stream) {
  return guarded([&] {
    const char* op = "attention_backward";
    tessel::Tensor qt = to_tensor(q, op, "q"), kt = to_tensor(k, op, "k"),
                   vt = to_tensor(v, op, "v"), ot = to_tensor(out, op, "out"),
                   gt = to_tensor(dout, op, "dout"), lt = to_tensor(lse, op, "lse"),
                   dqt = to_tensor(dq, op, "dq"), dkt = to_tensor(dk, op, "dk"),
                   dvt = to_tensor(dv, op, "dv");
    auto st = opt(sinks, op, "sinks");
    auto dst = opt(d_sinks, op, "d_sinks");
    auto cq = opt(cu_seqlens_q, op, "cu_seqlens_q");
    auto ck = opt(cu_seqlens_k, op, "cu_seqlens_k");
    tessel::AttentionBackwardParams p;
    if (params != nullptr) {
      p.scale = params->scale;
      p.causal = params->causal != 0;
      p.window_left = params->window_left;
      p.window_right = params->window_right;
      p.softcap = params->softcap;
    }
    p.sinks = ptr(st);
    p.d_sinks = ptr(dst);
    p.cu_seqlens_q = ptr(cq);
    p.cu_seqlens_k = ptr(ck);
    p.deterministic = deterministic != 0;
    tessel::attention_backward(qt, kt, vt, ot, gt, lt, dqt, dkt, dvt, p, as_stream(stream));
  });
}

}  // extern "C"
