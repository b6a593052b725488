// Bindings of the LLM operator set: activations, dropout, RoPE, embedding.
// Argument order: inputs, outputs, parameters, stream.
#include "common.hpp"
#include "tessel/activation.hpp"
#include "tessel/dropout.hpp"
#include "tessel/embedding.hpp"
#include "tessel/rope.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

tessel::GeluApprox approx_of(const char* op, nb::handle a) {
  std::string s;
  if (nb::try_cast(a, s)) {
    if (s == "none" || s == "erf") return tessel::GeluApprox::none;
    if (s == "tanh") return tessel::GeluApprox::tanh;
  }
  arg_fail(op, "approximate", "'none' (erf) or 'tanh'", nb::repr(a).c_str());
}

tessel::EmbeddingGradMode mode_of(nb::handle a) {
  std::string s;
  if (nb::try_cast(a, s)) {
    if (s == "deterministic") return tessel::EmbeddingGradMode::deterministic;
    if (s == "atomic") return tessel::EmbeddingGradMode::atomic;
  }
  arg_fail("embedding_backward", "mode", "'deterministic' or 'atomic'", nb::repr(a).c_str());
}

tessel::RopeParams rope_params(const char* op, nb::handle style, int64_t rotary_dim, double theta,
                               nb::handle scaling) {
  tessel::RopeParams p;
  std::string s;
  if (!nb::try_cast(style, s) || (s != "neox" && s != "gptj"))
    arg_fail(op, "style", "'neox' or 'gptj'", nb::repr(style).c_str());
  p.style = s == "neox" ? tessel::RopeStyle::neox : tessel::RopeStyle::gptj;
  p.rotary_dim = rotary_dim;
  p.theta = theta;
  if (!scaling.is_none()) {
    nb::dict d;
    if (!nb::try_cast(scaling, d))
      arg_fail(op, "llama3_scaling", "None or a dict (factor, low_freq_factor, high_freq_factor, "
               "original_max_position_embeddings)", nb::repr(scaling).c_str());
    p.llama3 = true;
    for (auto [k, v] : d) {
      const std::string key = nb::cast<std::string>(k);
      if (key == "factor") p.factor = nb::cast<double>(v);
      else if (key == "low_freq_factor") p.low_freq_factor = nb::cast<double>(v);
      else if (key == "high_freq_factor") p.high_freq_factor = nb::cast<double>(v);
      else if (key == "original_max_position_embeddings") p.original_max_position_embeddings = nb::cast<int64_t>(v);
      else if (key != "rope_type")
        arg_fail(op, "llama3_scaling", "keys factor/low_freq_factor/high_freq_factor/"
                 "original_max_position_embeddings", "key '" + key + "'");
    }
  }
  return p;
}

}  // namespace

void bind_llm_ops(nb::module_& m);
const Binder kRegisterLlmOps(&bind_llm_ops);

void bind_llm_ops(nb::module_& m) {
  m.def("silu_and_mul", [](nb::handle x, nb::handle o, nb::handle stream) {
        Arg tx = in("silu_and_mul", "x", x), to = out("silu_and_mul", "out", o);
        cudaStream_t s = to_stream("silu_and_mul", stream);
        nb::gil_scoped_release nogil;
        tessel::silu_and_mul(tx.t, to.t, s);
      }, "x"_a.none(), "out"_a.none(), "stream"_a.none() = 0);
  m.def("silu_and_mul_backward", [](nb::handle x, nb::handle g, nb::handle dx, nb::handle stream) {
        const char* op = "silu_and_mul_backward";
        Arg tx = in(op, "x", x), tg = in(op, "dout", g), td = out(op, "dx", dx);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::silu_and_mul_backward(tx.t, tg.t, td.t, s);
      }, "x"_a.none(), "dout"_a.none(), "dx"_a.none(), "stream"_a.none() = 0);
  m.def("gelu_and_mul", [](nb::handle x, nb::handle o, nb::handle a, nb::handle stream) {
        const auto ap = approx_of("gelu_and_mul", a);
        Arg tx = in("gelu_and_mul", "x", x), to = out("gelu_and_mul", "out", o);
        cudaStream_t s = to_stream("gelu_and_mul", stream);
        nb::gil_scoped_release nogil;
        tessel::gelu_and_mul(tx.t, to.t, ap, s);
      }, "x"_a.none(), "out"_a.none(), "approximate"_a.none() = "none", "stream"_a.none() = 0);
  m.def("gelu_and_mul_backward", [](nb::handle x, nb::handle g, nb::handle dx, nb::handle a, nb::handle stream) {
        const char* op = "gelu_and_mul_backward";
        const auto ap = approx_of(op, a);
        Arg tx = in(op, "x", x), tg = in(op, "dout", g), td = out(op, "dx", dx);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::gelu_and_mul_backward(tx.t, tg.t, td.t, ap, s);
      }, "x"_a.none(), "dout"_a.none(), "dx"_a.none(), "approximate"_a.none() = "none", "stream"_a.none() = 0);
  m.def("swiglu", [](nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        Arg ta = in("swiglu", "gate", a), tb = in("swiglu", "up", b), to = out("swiglu", "out", o);
        cudaStream_t s = to_stream("swiglu", stream);
        nb::gil_scoped_release nogil;
        tessel::swiglu(ta.t, tb.t, to.t, s);
      }, "gate"_a.none(), "up"_a.none(), "out"_a.none(), "stream"_a.none() = 0);
  m.def("swiglu_backward", [](nb::handle a, nb::handle b, nb::handle g, nb::handle da, nb::handle db, nb::handle stream) {
        const char* op = "swiglu_backward";
        Arg ta = in(op, "gate", a), tb = in(op, "up", b), tg = in(op, "dout", g), t0 = out(op, "dgate", da),
            t1 = out(op, "dup", db);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::swiglu_backward(ta.t, tb.t, tg.t, t0.t, t1.t, s);
      }, "gate"_a.none(), "up"_a.none(), "dout"_a.none(), "dgate"_a.none(), "dup"_a.none(), "stream"_a.none() = 0);
  m.def("geglu", [](nb::handle a, nb::handle b, nb::handle o, nb::handle ap, nb::handle stream) {
        const auto apx = approx_of("geglu", ap);
        Arg ta = in("geglu", "gate", a), tb = in("geglu", "up", b), to = out("geglu", "out", o);
        cudaStream_t s = to_stream("geglu", stream);
        nb::gil_scoped_release nogil;
        tessel::geglu(ta.t, tb.t, to.t, apx, s);
      }, "gate"_a.none(), "up"_a.none(), "out"_a.none(), "approximate"_a.none() = "none", "stream"_a.none() = 0);
  m.def("geglu_backward", [](nb::handle a, nb::handle b, nb::handle g, nb::handle da, nb::handle db, nb::handle ap, nb::handle stream) {
        const char* op = "geglu_backward";
        const auto apx = approx_of(op, ap);
        Arg ta = in(op, "gate", a), tb = in(op, "up", b), tg = in(op, "dout", g), t0 = out(op, "dgate", da),
            t1 = out(op, "dup", db);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::geglu_backward(ta.t, tb.t, tg.t, t0.t, t1.t, apx, s);
      }, "gate"_a.none(), "up"_a.none(), "dout"_a.none(), "dgate"_a.none(), "dup"_a.none(),
      "approximate"_a.none() = "none", "stream"_a.none() = 0);
  m.def("gelu", [](nb::handle x, nb::handle y, nb::handle ap, nb::handle stream) {
        const auto apx = approx_of("gelu", ap);
        Arg tx = in("gelu", "x", x), ty = out("gelu", "y", y);
        cudaStream_t s = to_stream("gelu", stream);
        nb::gil_scoped_release nogil;
        tessel::gelu(tx.t, ty.t, apx, s);
      }, "x"_a.none(), "y"_a.none(), "approximate"_a.none() = "none", "stream"_a.none() = 0);
  m.def("gelu_backward", [](nb::handle x, nb::handle dy, nb::handle dx, nb::handle ap, nb::handle stream) {
        const auto apx = approx_of("gelu_backward", ap);
        Arg tx = in("gelu_backward", "x", x), tg = in("gelu_backward", "dy", dy), td = out("gelu_backward", "dx", dx);
        cudaStream_t s = to_stream("gelu_backward", stream);
        nb::gil_scoped_release nogil;
        tessel::gelu_backward(tx.t, tg.t, td.t, apx, s);
      }, "x"_a.none(), "dy"_a.none(), "dx"_a.none(), "approximate"_a.none() = "none", "stream"_a.none() = 0);
  m.def("dropout", [](nb::handle x, nb::handle y, nb::handle mask, double p, uint64_t seed, uint64_t offset, nb::handle stream) {
        const char* op = mask.is_none() ? "dropout" : "dropout_with_mask";
        Arg tx = in(op, "x", x), ty = out(op, "y", y);
        if (mask.is_none()) {
          cudaStream_t s = to_stream(op, stream);
          nb::gil_scoped_release nogil;
          tessel::dropout(tx.t, ty.t, p, seed, offset, s);
        } else {
          Arg tm = out(op, "mask", mask);
          cudaStream_t s = to_stream(op, stream);
          nb::gil_scoped_release nogil;
          tessel::dropout_with_mask(tx.t, ty.t, tm.t, p, seed, offset, s);
        }
      }, "x"_a.none(), "y"_a.none(), "mask"_a.none() = nb::none(), "p"_a = 0.5, "seed"_a = 0, "offset"_a = 0,
      "stream"_a.none() = 0);
  m.def("dropout_backward", [](nb::handle dy, nb::handle dx, double p, uint64_t seed, uint64_t offset, nb::handle stream) {
        Arg tg = in("dropout_backward", "dy", dy), td = out("dropout_backward", "dx", dx);
        cudaStream_t s = to_stream("dropout_backward", stream);
        nb::gil_scoped_release nogil;
        tessel::dropout_backward(tg.t, td.t, p, seed, offset, s);
      }, "dy"_a.none(), "dx"_a.none(), "p"_a = 0.5, "seed"_a = 0, "offset"_a = 0, "stream"_a.none() = 0);
  m.def("rope", [](nb::handle q, nb::handle k, nb::handle pos, nb::handle style, int64_t rotary_dim, double theta,
                   nb::handle scaling, bool backward, nb::handle stream) {
        const char* op = backward ? "rope_backward" : "rope";
        const tessel::RopeParams p = rope_params(op, style, rotary_dim, theta, scaling);
        Arg tq = out(op, backward ? "dq" : "q", q), tk = out(op, backward ? "dk" : "k", k),
            tp = in(op, "positions", pos);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        if (backward) tessel::rope_backward(tq.t, tk.t, tp.t, p, s);
        else tessel::rope(tq.t, tk.t, tp.t, p, s);
      }, "q"_a.none(), "k"_a.none(), "positions"_a.none(), "style"_a.none() = "neox", "rotary_dim"_a = 0,
      "theta"_a = 10000.0, "llama3_scaling"_a.none() = nb::none(), "backward"_a = false, "stream"_a.none() = 0);
  m.def("embedding", [](nb::handle ids, nb::handle w, nb::handle o, bool check, nb::handle stream) {
        Arg ti = in("embedding", "ids", ids), tw = in("embedding", "weight", w), to = out("embedding", "out", o);
        cudaStream_t s = to_stream("embedding", stream);
        nb::gil_scoped_release nogil;
        tessel::embedding(ti.t, tw.t, to.t, check, s);
      }, "ids"_a.none(), "weight"_a.none(), "out"_a.none(), "check_ids"_a = false, "stream"_a.none() = 0);
  m.def("embedding_backward", [](nb::handle ids, nb::handle g, nb::handle dw, nb::handle mode, bool check, nb::handle stream) {
        const auto md = mode_of(mode);
        const char* op = "embedding_backward";
        Arg ti = in(op, "ids", ids), tg = in(op, "dout", g), td = out(op, "dweight", dw);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::embedding_backward(ti.t, tg.t, td.t, md, check, s);
      }, "ids"_a.none(), "dout"_a.none(), "dweight"_a.none(), "mode"_a.none() = "deterministic",
      "check_ids"_a = false, "stream"_a.none() = 0);
}

}  // namespace tessel::py
