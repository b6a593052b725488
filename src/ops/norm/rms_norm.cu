// RMSNorm forward (plain and fused with the residual add) and backward.
//   forward : y = x * rstd * w                      bytes: read x, w; write y (+ rstd)
//   fused   : h = x + res; y = h * rstd * w         bytes: read x, res, w; write h, y
//   backward: dx = rstd * (g - xhat * mean(g*xhat)) bytes: read dy, x, w, rstd; write dx, dw
#include "ops/norm/norm_staged.cuh"
#include "ops/norm/norm_launch.cuh"
#include "tessel/norm.hpp"

namespace tessel {

using norm::Mode;
using norm::NormArgs;

namespace {

constexpr std::initializer_list<DType> kFloat = {DType::f32, DType::f16, DType::bf16};

// Checks a row tensor `t` against x: dtype, shape; returns its rows view.
detail::Rows like_x(const detail::OpCheck& chk, const char* arg, const Tensor& t, const Tensor& x) {
  chk.same_shape(arg, t, "x", x);
  return chk.rows(arg, t);
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, Tensor* rstd, float eps,
              cudaStream_t stream) {
  detail::OpCheck chk("rms_norm");
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("y", y, kFloat);
  chk.same_dtype("y", y, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  const detail::Rows xr = chk.rows("x", x);
  norm::check_param(chk, "w", w, x.dtype, xr.cols);
  const detail::Rows yr = like_x(chk, "y", y, x);
  if (rstd) norm::check_stats(chk, "rstd", *rstd, x.ndim - 1, x.shape);
  norm::check_eps(chk, eps);
  norm::check_cols(chk, "x", xr.cols, "a row length");
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("w", w);
  chk.device_pointer("y", y);
  if (rstd) chk.device_pointer("rstd", *rstd);

  NormArgs a;
  a.x = x.data, a.w = w.data, a.y = y.data, a.rstd = rstd ? static_cast<float*>(rstd->data) : nullptr;
  a.rows = xr.rows, a.cols = xr.cols, a.x_pitch = xr.pitch, a.y_pitch = yr.pitch, a.eps = eps;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = detail::rows_vectorizable<T>(xr.cols, {{x.data, xr.pitch}, {y.data, yr.pitch}, {w.data, 0}});
    if (norm::launch_fwd_frags<T, Mode::rms>(a, vec, stream)) return;
    if (norm::launch_fwd_staged<T, Mode::rms>(a, vec, stream)) return;
    norm::with_cfg<T>(xr.cols, vec, [&](auto cfg) {
      norm::launch_fwd<T, decltype(cfg), Mode::rms>(a, stream);
    });
  });
  detail::check_launch("rms_norm");
}

void rms_norm_add(const Tensor& x, const Tensor& residual, const Tensor& w, Tensor& h, Tensor& y,
                  Tensor* rstd, float eps, cudaStream_t stream) {
  detail::OpCheck chk("rms_norm_add");
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("residual", residual, kFloat);
  chk.dtype_in("h", h, kFloat);
  chk.dtype_in("y", y, kFloat);
  chk.same_dtype("residual", residual, "x", x);
  chk.same_dtype("h", h, "x", x);
  chk.same_dtype("y", y, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  const detail::Rows xr = chk.rows("x", x);
  const detail::Rows rr = like_x(chk, "residual", residual, x);
  norm::check_param(chk, "w", w, x.dtype, xr.cols);
  const detail::Rows hr = like_x(chk, "h", h, x);
  const detail::Rows yr = like_x(chk, "y", y, x);
  if (rstd) norm::check_stats(chk, "rstd", *rstd, x.ndim - 1, x.shape);
  norm::check_eps(chk, eps);
  norm::check_cols(chk, "x", xr.cols, "a row length");
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("residual", residual);
  chk.device_pointer("w", w);
  chk.device_pointer("h", h);
  chk.device_pointer("y", y);
  if (rstd) chk.device_pointer("rstd", *rstd);

  NormArgs a;
  a.x = x.data, a.r = residual.data, a.w = w.data, a.y = y.data, a.h = h.data;
  a.rstd = rstd ? static_cast<float*>(rstd->data) : nullptr;
  a.rows = xr.rows, a.cols = xr.cols, a.x_pitch = xr.pitch, a.r_pitch = rr.pitch;
  a.h_pitch = hr.pitch, a.y_pitch = yr.pitch, a.eps = eps;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = detail::rows_vectorizable<T>(
        xr.cols, {{x.data, xr.pitch}, {residual.data, rr.pitch}, {h.data, hr.pitch},
                  {y.data, yr.pitch}, {w.data, 0}});
    if (norm::launch_fwd_frags<T, Mode::rms_add>(a, vec, stream)) return;
    norm::with_cfg<T>(xr.cols, vec, [&](auto cfg) {
      norm::launch_fwd<T, decltype(cfg), Mode::rms_add>(a, stream);
    });
  });
  detail::check_launch("rms_norm_add");
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       const Tensor* dh, Tensor& dx, Tensor& dw, cudaStream_t stream) {
  detail::OpCheck chk("rms_norm_backward");
  chk.dtype_in("dy", dy, kFloat);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("dx", dx, kFloat);
  chk.same_dtype("dy", dy, "x", x);
  chk.same_dtype("dx", dx, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  const detail::Rows xr = chk.rows("x", x);
  const detail::Rows gr = like_x(chk, "dy", dy, x);
  norm::check_param(chk, "w", w, x.dtype, xr.cols);
  norm::check_stats(chk, "rstd", rstd, x.ndim - 1, x.shape);
  detail::Rows hr{};
  if (dh) {
    chk.dtype_in("dh", *dh, kFloat);
    chk.same_dtype("dh", *dh, "x", x);
    hr = like_x(chk, "dh", *dh, x);
  }
  const detail::Rows dr = like_x(chk, "dx", dx, x);
  norm::check_param(chk, "dw", dw, x.dtype, xr.cols);
  norm::check_cols(chk, "x", xr.cols, "a row length");
  if (x.numel() == 0) {
    // No rows: dw = 0 (sum over nothing); no columns: nothing at all.
    if (dw.numel() == 0) return;
    chk.device_pointer("dw", dw);
    TESSEL_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.nbytes(), stream));
    return;
  }
  chk.device_pointer("dy", dy);
  chk.device_pointer("x", x);
  chk.device_pointer("w", w);
  chk.device_pointer("rstd", rstd);
  if (dh) chk.device_pointer("dh", *dh);
  chk.device_pointer("dx", dx);
  chk.device_pointer("dw", dw);

  NormArgs a;
  a.x = x.data, a.r = dy.data, a.w = w.data, a.b = dh ? dh->data : nullptr, a.y = dx.data;
  a.rstd = static_cast<float*>(rstd.data);
  a.rows = xr.rows, a.cols = xr.cols, a.x_pitch = xr.pitch, a.r_pitch = gr.pitch;
  a.b_pitch = hr.pitch, a.y_pitch = dr.pitch;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    bool vec = detail::rows_vectorizable<T>(
        xr.cols, {{x.data, xr.pitch}, {dy.data, gr.pitch}, {dx.data, dr.pitch}, {w.data, 0}});
    if (dh) vec = vec && detail::rows_vectorizable<T>(xr.cols, {{dh->data, hr.pitch}});
    if (norm::launch_bwd_staged<T, Mode::rms>(a, vec, dw.data, nullptr, stream)) return;
    if (norm::launch_bwd_long<T, Mode::rms>(a, vec, dw.data, nullptr, stream)) return;
    norm::with_cfg<T>(xr.cols, vec, [&](auto cfg) {
      norm::launch_bwd<T, decltype(cfg), Mode::rms>(a, dw.data, nullptr, stream);
    });
  });
  detail::check_launch("rms_norm_backward");
}

}  // namespace tessel
