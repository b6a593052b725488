// Bindings of tessel/norm.hpp: RMSNorm (+ fused residual add), LayerNorm, GroupNorm, fwd/bwd.
// Optional tensors are None.
#include "common.hpp"
#include "tessel/norm.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

// An optional input/output: `has` is false for None.
struct Opt {
  Arg a;
  bool has = false;
  tessel::Tensor* ptr() { return has ? &a.t : nullptr; }
};
Opt opt_in(const char* op, const char* arg, nb::handle h) {
  Opt o;
  if (!h.is_none()) {
    o.a = in(op, arg, h);
    o.has = true;
  }
  return o;
}
Opt opt_out(const char* op, const char* arg, nb::handle h) {
  Opt o;
  if (!h.is_none()) {
    o.a = out(op, arg, h);
    o.has = true;
  }
  return o;
}

}  // namespace

void bind_norm(nb::module_& m);
const Binder kRegisterNorm(&bind_norm);

void bind_norm(nb::module_& m) {
  m.def(
      "rms_norm",
      [](nb::handle x, nb::handle w, nb::handle y, nb::handle rstd, float eps, nb::handle stream) {
        const char* op = "rms_norm";
        Arg tx = in(op, "x", x), tw = in(op, "w", w), ty = out(op, "y", y);
        Opt rs = opt_out(op, "rstd", rstd);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::rms_norm(tx.t, tw.t, ty.t, rs.ptr(), eps, s);
      },
      "x"_a.none(), "w"_a.none(), "y"_a.none(), "rstd"_a.none() = nb::none(), "eps"_a = 1e-6f,
      "stream"_a.none() = 0, "y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) over the last axis.");
  m.def(
      "rms_norm_add",
      [](nb::handle x, nb::handle r, nb::handle w, nb::handle h, nb::handle y, nb::handle rstd,
         float eps, nb::handle stream) {
        const char* op = "rms_norm_add";
        Arg tx = in(op, "x", x), tr = in(op, "residual", r), tw = in(op, "w", w),
            th = out(op, "h", h), ty = out(op, "y", y);
        Opt rs = opt_out(op, "rstd", rstd);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::rms_norm_add(tx.t, tr.t, tw.t, th.t, ty.t, rs.ptr(), eps, s);
      },
      "x"_a.none(), "residual"_a.none(), "w"_a.none(), "h"_a.none(), "y"_a.none(),
      "rstd"_a.none() = nb::none(), "eps"_a = 1e-6f, "stream"_a.none() = 0,
      "h = x + residual; y = rms_norm(h) * w.");
  m.def(
      "rms_norm_backward",
      [](nb::handle dy, nb::handle x, nb::handle w, nb::handle rstd, nb::handle dx, nb::handle dw,
         nb::handle dh, nb::handle stream) {
        const char* op = "rms_norm_backward";
        Arg tg = in(op, "dy", dy), tx = in(op, "x", x), tw = in(op, "w", w),
            tr = in(op, "rstd", rstd);
        Opt th = opt_in(op, "dh", dh);
        Arg tdx = out(op, "dx", dx), tdw = out(op, "dw", dw);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::rms_norm_backward(tg.t, tx.t, tw.t, tr.t, th.ptr(), tdx.t, tdw.t, s);
      },
      "dy"_a.none(), "x"_a.none(), "w"_a.none(), "rstd"_a.none(), "dx"_a.none(), "dw"_a.none(),
      "dh"_a.none() = nb::none(), "stream"_a.none() = 0,
      "dx = rstd*(g - xhat*mean(g*xhat)) [+ dh], g = dy*w; dw = sum dy*xhat.");
  m.def(
      "layer_norm",
      [](nb::handle x, nb::handle w, nb::handle b, nb::handle y, nb::handle mean, nb::handle rstd,
         float eps, nb::handle stream) {
        const char* op = "layer_norm";
        Arg tx = in(op, "x", x), tw = in(op, "w", w);
        Opt tb = opt_in(op, "b", b);
        Arg ty = out(op, "y", y);
        Opt tm = opt_out(op, "mean", mean), rs = opt_out(op, "rstd", rstd);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::layer_norm(tx.t, tw.t, tb.ptr(), ty.t, tm.ptr(), rs.ptr(), eps, s);
      },
      "x"_a.none(), "w"_a.none(), "b"_a.none(), "y"_a.none(), "mean"_a.none() = nb::none(),
      "rstd"_a.none() = nb::none(), "eps"_a = 1e-5f, "stream"_a.none() = 0,
      "y = (x - mean) * rstd * w [+ b] over the last axis.");
  m.def(
      "layer_norm_backward",
      [](nb::handle dy, nb::handle x, nb::handle w, nb::handle mean, nb::handle rstd, nb::handle dx,
         nb::handle dw, nb::handle db, nb::handle stream) {
        const char* op = "layer_norm_backward";
        Arg tg = in(op, "dy", dy), tx = in(op, "x", x), tw = in(op, "w", w),
            tm = in(op, "mean", mean), tr = in(op, "rstd", rstd);
        Arg tdx = out(op, "dx", dx), tdw = out(op, "dw", dw);
        Opt tdb = opt_out(op, "db", db);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::layer_norm_backward(tg.t, tx.t, tw.t, tm.t, tr.t, tdx.t, tdw.t, tdb.ptr(), s);
      },
      "dy"_a.none(), "x"_a.none(), "w"_a.none(), "mean"_a.none(), "rstd"_a.none(), "dx"_a.none(),
      "dw"_a.none(), "db"_a.none() = nb::none(), "stream"_a.none() = 0,
      "LayerNorm backward: dx, dw and (optional) db.");
  m.def(
      "group_norm",
      [](nb::handle x, int64_t groups, nb::handle w, nb::handle b, nb::handle y, nb::handle mean,
         nb::handle rstd, float eps, nb::handle stream) {
        const char* op = "group_norm";
        Arg tx = in(op, "x", x), tw = in(op, "w", w);
        Opt tb = opt_in(op, "b", b);
        Arg ty = out(op, "y", y);
        Opt tm = opt_out(op, "mean", mean), rs = opt_out(op, "rstd", rstd);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::group_norm(tx.t, groups, tw.t, tb.ptr(), ty.t, tm.ptr(), rs.ptr(), eps, s);
      },
      "x"_a.none(), "groups"_a, "w"_a.none(), "b"_a.none(), "y"_a.none(),
      "mean"_a.none() = nb::none(), "rstd"_a.none() = nb::none(), "eps"_a = 1e-5f,
      "stream"_a.none() = 0, "GroupNorm of x (N, C, *spatial) with per-channel w, b.");
  m.def(
      "group_norm_backward",
      [](nb::handle dy, nb::handle x, int64_t groups, nb::handle w, nb::handle mean,
         nb::handle rstd, nb::handle dx, nb::handle dw, nb::handle db, nb::handle stream) {
        const char* op = "group_norm_backward";
        Arg tg = in(op, "dy", dy), tx = in(op, "x", x), tw = in(op, "w", w),
            tm = in(op, "mean", mean), tr = in(op, "rstd", rstd);
        Arg tdx = out(op, "dx", dx), tdw = out(op, "dw", dw);
        Opt tdb = opt_out(op, "db", db);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::group_norm_backward(tg.t, tx.t, groups, tw.t, tm.t, tr.t, tdx.t, tdw.t, tdb.ptr(), s);
      },
      "dy"_a.none(), "x"_a.none(), "groups"_a, "w"_a.none(), "mean"_a.none(), "rstd"_a.none(),
      "dx"_a.none(), "dw"_a.none(), "db"_a.none() = nb::none(), "stream"_a.none() = 0,
      "GroupNorm backward: dx, dw and (optional) db.");
}

}  // namespace tessel::py
