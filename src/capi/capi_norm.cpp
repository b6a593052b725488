// C ABI of the norm family (include/tessel/tessel_norm.h).
#include <optional>

#include "capi_util.hpp"
#include "tessel/norm.hpp"
#include "tessel/tessel_norm.h"

using tessel::capi::as_stream;
using tessel::capi::guarded;
using tessel::capi::to_tensor;

namespace {
// An optional tensor: empty for NULL.
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

tessel_status_t tessel_rms_norm(const tessel_tensor_t* x, const tessel_tensor_t* w,
                                const tessel_tensor_t* y, const tessel_tensor_t* rstd, float eps,
                                void* stream) {
  return guarded([&] {
    const char* op = "rms_norm";
    tessel::Tensor xt = to_tensor(x, op, "x"), wt = to_tensor(w, op, "w"), yt = to_tensor(y, op, "y");
    auto rs = opt(rstd, op, "rstd");
    tessel::rms_norm(xt, wt, yt, ptr(rs), eps, as_stream(stream));
  });
}

tessel_status_t tessel_rms_norm_add(const tessel_tensor_t* x, const tessel_tensor_t* residual,
                                    const tessel_tensor_t* w, const tessel_tensor_t* h,
                                    const tessel_tensor_t* y, const tessel_tensor_t* rstd,
                                    float eps, void* stream) {
  return guarded([&] {
    const char* op = "rms_norm_add";
    tessel::Tensor xt = to_tensor(x, op, "x"), rt = to_tensor(residual, op, "residual"),
                   wt = to_tensor(w, op, "w"), ht = to_tensor(h, op, "h"), yt = to_tensor(y, op, "y");
    auto rs = opt(rstd, op, "rstd");
    tessel::rms_norm_add(xt, rt, wt, ht, yt, ptr(rs), eps, as_stream(stream));
  });
}

tessel_status_t tessel_rms_norm_backward(const tessel_tensor_t* dy, const tessel_tensor_t* x,
                                         const tessel_tensor_t* w, const tessel_tensor_t* rstd,
                                         const tessel_tensor_t* dh, const tessel_tensor_t* dx,
                                         const tessel_tensor_t* dw, void* stream) {
  return guarded([&] {
    const char* op = "rms_norm_backward";
    tessel::Tensor gt = to_tensor(dy, op, "dy"), xt = to_tensor(x, op, "x"), wt = to_tensor(w, op, "w"),
                   rt = to_tensor(rstd, op, "rstd"), dxt = to_tensor(dx, op, "dx"),
                   dwt = to_tensor(dw, op, "dw");
    auto dht = opt(dh, op, "dh");
    tessel::rms_norm_backward(gt, xt, wt, rt, ptr(dht), dxt, dwt, as_stream(stream));
  });
}

tessel_status_t tessel_layer_norm(const tessel_tensor_t* x, const tessel_tensor_t* w,
                                  const tessel_tensor_t* b, const tessel_tensor_t* y,
                                  const tessel_tensor_t* mean, const tessel_tensor_t* rstd,
                                  float eps, void* stream) {
  return guarded([&] {
    const char* op = "layer_norm";
    tessel::Tensor xt = to_tensor(x, op, "x"), wt = to_tensor(w, op, "w"), yt = to_tensor(y, op, "y");
    auto bt = opt(b, op, "b");
    auto mt = opt(mean, op, "mean");
    auto rs = opt(rstd, op, "rstd");
    tessel::layer_norm(xt, wt, ptr(bt), yt, ptr(mt), ptr(rs), eps, as_stream(stream));
  });
}

tessel_status_t tessel_layer_norm_backward(const tessel_tensor_t* dy, const tessel_tensor_t* x,
                                           const tessel_tensor_t* w, const tessel_tensor_t* mean,
                                           const tessel_tensor_t* rstd, const tessel_tensor_t* dx,
                                           const tessel_tensor_t* dw, const tessel_tensor_t* db,
                                           void* stream) {
  return guarded([&] {
    const char* op = "layer_norm_backward";
    tessel::Tensor gt = to_tensor(dy, op, "dy"), xt = to_tensor(x, op, "x"), wt = to_tensor(w, op, "w"),
                   mt = to_tensor(mean, op, "mean"), rt = to_tensor(rstd, op, "rstd"),
                   dxt = to_tensor(dx, op, "dx"), dwt = to_tensor(dw, op, "dw");
    auto dbt = opt(db, op, "db");
    tessel::layer_norm_backward(gt, xt, wt, mt, rt, dxt, dwt, ptr(dbt), as_stream(stream));
  });
}

tessel_status_t tessel_group_norm(const tessel_tensor_t* x, int64_t groups,
                                  const tessel_tensor_t* w, const tessel_tensor_t* b,
                                  const tessel_tensor_t* y, const tessel_tensor_t* mean,
                                  const tessel_tensor_t* rstd, float eps, void* stream) {
  return guarded([&] {
    const char* op = "group_norm";
    tessel::Tensor xt = to_tensor(x, op, "x"), wt = to_tensor(w, op, "w"), yt = to_tensor(y, op, "y");
    auto bt = opt(b, op, "b");
    auto mt = opt(mean, op, "mean");
    auto rs = opt(rstd, op, "rstd");
    tessel::group_norm(xt, groups, wt, ptr(bt), yt, ptr(mt), ptr(rs), eps, as_stream(stream));
  });
}

tessel_status_t tessel_group_norm_backward(const tessel_tensor_t* dy, const tessel_tensor_t* x,
                                           int64_t groups, const tessel_tensor_t* w,
                                           const tessel_tensor_t* mean,
                                           const tessel_tensor_t* rstd, const tessel_tensor_t* dx,
                                           const tessel_tensor_t* dw, const tessel_tensor_t* db,
                                           void* stream) {
  return guarded([&] {
    const char* op = "group_norm_backward";
    tessel::Tensor gt = to_tensor(dy, op, "dy"), xt = to_tensor(x, op, "x"), wt = to_tensor(w, op, "w"),
                   mt = to_tensor(mean, op, "mean"), rt = to_tensor(rstd, op, "rstd"),
                   dxt = to_tensor(dx, op, "dx"), dwt = to_tensor(dw, op, "dw");
    auto dbt = opt(db, op, "db");
    tessel::group_norm_backward(gt, xt, groups, wt, mt, rt, dxt, dwt, ptr(dbt), as_stream(stream));
  });
}

}  // extern "C"
