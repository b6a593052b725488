// LayerNorm forward and backward (bias optional).
//   forward : y = (x - mean) * rstd * w [+ b]         bytes: read x, w, b; write y (+ mean, rstd)
//   backward: dx = rstd * (g - mean(g) - xhat * mean(g*xhat)), dw = sum dy*xhat, db = sum dy
#include "ops/norm/norm_staged.cuh"
#include "ops/norm/norm_launch.cuh"
#include "tessel/norm.hpp"

namespace tessel {

using norm::Mode;
using norm::NormArgs;

namespace {
constexpr std::initializer_list<DType> kFloat = {DType::f32, DType::f16, DType::bf16};

detail::Rows like_x(const detail::OpCheck& chk, const char* arg, const Tensor& t, const Tensor& x) {
  chk.same_shape(arg, t, "x", x);
  return chk.rows(arg, t);
}
}  // namespace

void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, Tensor* mean,
                Tensor* rstd, float eps, cudaStream_t stream) {
  detail::OpCheck chk("layer_norm");
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("y", y, kFloat);
  chk.same_dtype("y", y, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  const detail::Rows xr = chk.rows("x", x);
  norm::check_param(chk, "w", w, x.dtype, xr.cols);
  if (b) norm::check_param(chk, "b", *b, x.dtype, xr.cols);
  const detail::Rows yr = like_x(chk, "y", y, x);
  if (mean) norm::check_stats(chk, "mean", *mean, x.ndim - 1, x.shape);
  if (rstd) norm::check_stats(chk, "rstd", *rstd, x.ndim - 1, x.shape);
  norm::check_eps(chk, eps);
  norm::check_cols(chk, "x", xr.cols, "a row length");
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("w", w);
  if (b) chk.device_pointer("b", *b);
  chk.device_pointer("y", y);
  if (mean) chk.device_pointer("mean", *mean);
  if (rstd) chk.device_pointer("rstd", *rstd);

  NormArgs a;
  a.x = x.data, a.w = w.data, a.b = b ? b->data : nullptr, a.y = y.data;
  a.mean = mean ? static_cast<float*>(mean->data) : nullptr;
  a.rstd = rstd ? static_cast<float*>(rstd->data) : nullptr;
  a.rows = xr.rows, a.cols = xr.cols, a.x_pitch = xr.pitch, a.y_pitch = yr.pitch, a.eps = eps;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    bool vec = detail::rows_vectorizable<T>(xr.cols, {{x.data, xr.pitch}, {y.data, yr.pitch}, {w.data, 0}});
    if (b) vec = vec && detail::aligned(b->data, 16);
    if (norm::launch_fwd_frags<T, Mode::ln>(a, vec, stream)) return;
    if (norm::launch_fwd_staged<T, Mode::ln>(a, vec, stream)) return;
    norm::with_cfg<T>(xr.cols, vec, [&](auto cfg) {
      norm::launch_fwd<T, decltype(cfg), Mode::ln>(a, stream);
    });
  });
  detail::check_launch("layer_norm");
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dw, Tensor* db,
                         cudaStream_t stream) {
  detail::OpCheck chk("layer_norm_backward");
  chk.dtype_in("dy", dy, kFloat);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("dx", dx, kFloat);
  chk.same_dtype("dy", dy, "x", x);
  chk.same_dtype("dx", dx, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  const detail::Rows xr = chk.rows("x", x);
  const detail::Rows gr = like_x(chk, "dy", dy, x);
  norm::check_param(chk, "w", w, x.dtype, xr.cols);
  norm::check_stats(chk, "mean", mean, x.ndim - 1, x.shape);
  norm::check_stats(chk, "rstd", rstd, x.ndim - 1, x.shape);
  const detail::Rows dr = like_x(chk, "dx", dx, x);
  norm::check_param(chk, "dw", dw, x.dtype, xr.cols);
  if (db) norm::check_param(chk, "db", *db, x.dtype, xr.cols);
  norm::check_cols(chk, "x", xr.cols, "a row length");
  if (x.numel() == 0) {
    if (dw.numel() == 0) return;
    chk.device_pointer("dw", dw);
    if (db) chk.device_pointer("db", *db);
    TESSEL_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.nbytes(), stream));
    if (db) TESSEL_CUDA_CHECK(cudaMemsetAsync(db->data, 0, db->nbytes(), stream));
    return;
  }
  chk.device_pointer("dy", dy);
  chk.device_pointer("x", x);
  chk.device_pointer("w", w);
  chk.device_pointer("mean", mean);
  chk.device_pointer("rstd", rstd);
  chk.device_pointer("dx", dx);
  chk.device_pointer("dw", dw);
  if (db) chk.device_pointer("db", *db);

  NormArgs a;
  a.x = x.data, a.r = dy.data, a.w = w.data, a.y = dx.data;
  a.mean = static_cast<float*>(mean.data);
  a.rstd = static_cast<float*>(rstd.data);
  a.rows = xr.rows, a.cols = xr.cols, a.x_pitch = xr.pitch, a.r_pitch = gr.pitch;
  a.y_pitch = dr.pitch;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = detail::rows_vectorizable<T>(
        xr.cols, {{x.data, xr.pitch}, {dy.data, gr.pitch}, {dx.data, dr.pitch}, {w.data, 0}});
    if (norm::launch_bwd_staged<T, Mode::ln>(a, vec, dw.data, db ? db->data : nullptr, stream)) return;
    if (norm::launch_bwd_long<T, Mode::ln>(a, vec, dw.data, db ? db->data : nullptr, stream)) return;
    norm::with_cfg<T>(xr.cols, vec, [&](auto cfg) {
      norm::launch_bwd<T, decltype(cfg), Mode::ln>(a, dw.data, db ? db->data : nullptr, stream);
    });
  });
  detail::check_launch("layer_norm_backward");
}

}  // namespace tessel
