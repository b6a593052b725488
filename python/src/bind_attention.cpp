// Bindings of tessel/attention.hpp: the attention forward. Optional tensors are None.
#include "common.hpp"
#include "tessel/attention.hpp"

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

void bind_attention(nb::module_& m);
const Binder kRegisterAttention(&bind_attention);

void bind_attention(nb::module_& m) {
  m.def(
      "attention_forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, float scale,
         bool causal, int window_left, int window_right, float softcap, nb::handle sinks,
         nb::handle cu_q, nb::handle cu_k, nb::handle stream) {
        const char* op = "attention_forward";
        Arg tq = in(op, "q", q), tk = in(op, "k", k), tv = in(op, "v", v), to = out(op, "out", o);
        Opt tl = opt_out(op, "lse", lse), ts = opt_in(op, "sinks", sinks),
            tcq = opt_in(op, "cu_seqlens_q", cu_q), tck = opt_in(op, "cu_seqlens_k", cu_k);
        AttentionParams p;
        p.scale = scale;
        p.causal = causal;
        p.window_left = window_left;
        p.window_right = window_right;
        p.softcap = softcap;
        p.sinks = ts.ptr();
        p.cu_seqlens_q = tcq.ptr();
        p.cu_seqlens_k = tck.ptr();
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::attention_forward(tq.t, tk.t, tv.t, to.t, tl.ptr(), p, s);
      },
      "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "lse"_a.none() = nb::none(),
      "scale"_a = 0.0f, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1,
      "softcap"_a = 0.0f, "sinks"_a.none() = nb::none(), "cu_seqlens_q"_a.none() = nb::none(),
      "cu_seqlens_k"_a.none() = nb::none(), "stream"_a.none() = 0,
      "out = softmax(scale * q k^T [masked]) v; lse receives the log-sum-exp.");
}

}  // namespace tessel::py
