// Bindings of tessel/attention_backward.hpp: the attention backward. Optional tensors are None.
#include "common.hpp"
#include "tessel/attention_backward.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

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

void bind_attention_bwd(nb::module_& m);
const Binder kRegisterAttentionBwd(&bind_attention_bwd);

void bind_attention_bwd(nb::module_& m) {
  m.def(
      "attention_backward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle dout, nb::handle lse,
         nb::handle dq, nb::handle dk, nb::handle dv, float scale, bool causal, int window_left,
         int window_right, float softcap, nb::handle sinks, nb::handle d_sinks, nb::handle cu_q,
         nb::handle cu_k, bool deterministic, nb::handle stream) {
        const char* op = "attention_backward";
        Arg tq = in(op, "q", q), tk = in(op, "k", k), tv = in(op, "v", v), to = in(op, "out", o),
            tg = in(op, "dout", dout), tl = in(op, "lse", lse), tdq = out(op, "dq", dq),
            tdk = out(op, "dk", dk), tdv = out(op, "dv", dv);
        Opt ts = opt_in(op, "sinks", sinks), tds = opt_out(op, "d_sinks", d_sinks),
            tcq = opt_in(op, "cu_seqlens_q", cu_q), tck = opt_in(op, "cu_seqlens_k", cu_k);
        AttentionBackwardParams p;
        p.scale = scale;
        p.causal = causal;
        p.window_left = window_left;
        p.window_right = window_right;
        p.softcap = softcap;
        p.sinks = ts.ptr();
        p.d_sinks = tds.ptr();
        p.cu_seqlens_q = tcq.ptr();
        p.cu_seqlens_k = tck.ptr();
        p.deterministic = deterministic;
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::attention_backward(tq.t, tk.t, tv.t, to.t, tg.t, tl.t, tdq.t, tdk.t, tdv.t, p, s);
      },
      "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "dout"_a.none(), "lse"_a.none(),
      "dq"_a.none(), "dk"_a.none(), "dv"_a.none(), "scale"_a = 0.0f, "causal"_a = false,
      "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.0f,
      "sinks"_a.none() = nb::none(), "d_sinks"_a.none() = nb::none(),
      "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(),
      "deterministic"_a = false, "stream"_a.none() = 0,
      "dq, dk, dv (and d_sinks) = gradients of attention_forward given out, dout and lse.");
}

}  // namespace tessel::py
