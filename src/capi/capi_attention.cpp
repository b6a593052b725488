// C ABI of the attention forward (include/tessel/tessel_attention.h).
#include <optional>

#include "capi_util.hpp"
#include "tessel/attention.hpp"
#include "tessel/tessel_attention.h"

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

void tessel_attention_params_init(tessel_attention_params_t* p) {
  if (p == nullptr) return;
  p->scale = 0.0f;
  p->causal = 0;
  p->window_left = -1;
  p->window_right = -1;
  p->softcap = 0.0f;
}

tessel_status_t tessel_attention_forward(const tessel_tensor_t* q, const tessel_tensor_t* k,
                                         const tessel_tensor_t* v, const tessel_tensor_t* out,
                                         const tessel_tensor_t* lse,
                                         const tessel_attention_params_t* params,
                                         const tessel_tensor_t* sinks,
                                         const tessel_tensor_t* cu_seqlens_q,
                                         const tessel_tensor_t* cu_seqlens_k, void* stream) {
  return guarded([&] {
    const char* op = "attention_forward";
    tessel::Tensor qt = to_tensor(q, op, "q"), kt = to_tensor(k, op, "k"),
                   vt = to_tensor(v, op, "v"), ot = to_tensor(out, op, "out");
    auto lt = opt(lse, op, "lse");
    auto st = opt(sinks, op, "sinks");
    auto cq = opt(cu_seqlens_q, op, "cu_seqlens_q");
    auto ck = opt(cu_seqlens_k, op, "cu_seqlens_k");
    tessel::AttentionParams p;
    if (params != nullptr) {
      p.scale = params->scale;
      p.causal = params->causal != 0;
      p.window_left = params->window_left;
      p.window_right = params->window_right;
      p.softcap = params->softcap;
    }
    p.sinks = ptr(st);
    p.cu_seqlens_q = ptr(cq);
    p.cu_seqlens_k = ptr(ck);
    tessel::attention_forward(qt, kt, vt, ot, ptr(lt), p, as_stream(stream));
  });
}

}  // extern "C"
