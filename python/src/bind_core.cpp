// Bindings of include/tessel/ops.hpp: element-wise, copy/transpose, reductions, softmax.
#include "common.hpp"
#include "tessel/ops.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

tessel::UnaryOp unary_op(nb::handle name) {
  std::string s;
  if (nb::try_cast(name, s))
    for (int i = 0; i <= static_cast<int>(tessel::UnaryOp::square); ++i)
      if (s == tessel::unary_op_name(static_cast<tessel::UnaryOp>(i)))
        return static_cast<tessel::UnaryOp>(i);
  arg_fail("unary", "op", "one of identity/neg/abs/exp/relu/sigmoid/silu/square",
           nb::repr(name).c_str());
}

tessel::BinaryOp binary_op(nb::handle name) {
  std::string s;
  if (nb::try_cast(name, s))
    for (int i = 0; i <= static_cast<int>(tessel::BinaryOp::minimum); ++i)
      if (s == tessel::binary_op_name(static_cast<tessel::BinaryOp>(i)))
        return static_cast<tessel::BinaryOp>(i);
  arg_fail("binary", "op", "one of add/sub/mul/div/maximum/minimum", nb::repr(name).c_str());
}

}  // namespace

void bind_core(nb::module_& m);
const Binder kRegisterCore(&bind_core);

void bind_core(nb::module_& m) {
  m.def(
      "unary",
      [](nb::handle op, nb::handle x, nb::handle y, nb::handle stream) {
        const tessel::UnaryOp o = unary_op(op);
        Arg tx = in("unary", "x", x), ty = out("unary", "y", y);
        cudaStream_t s = to_stream("unary", stream);
        nb::gil_scoped_release nogil;
        tessel::unary(o, tx.t, ty.t, s);
      },
      "op"_a.none(), "x"_a.none(), "y"_a.none(), "stream"_a.none() = 0,
      "y = op(x), op one of identity/neg/abs/exp/relu/sigmoid/silu/square.");
  m.def(
      "binary",
      [](nb::handle op, nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        const tessel::BinaryOp bo = binary_op(op);
        Arg ta = in("binary", "a", a), tb = in("binary", "b", b), to = out("binary", "out", o);
        cudaStream_t s = to_stream("binary", stream);
        nb::gil_scoped_release nogil;
        tessel::binary(bo, ta.t, tb.t, to.t, s);
      },
      "op"_a.none(), "a"_a.none(), "b"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out = a op b, op one of add/sub/mul/div/maximum/minimum; b has a's shape, is a row "
      "vector over a's last axis, or has one element.");
  m.def(
      "add",
      [](nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        Arg ta = in("add", "a", a), tb = in("add", "b", b), to = out("add", "out", o);
        cudaStream_t s = to_stream("add", stream);
        nb::gil_scoped_release nogil;
        tessel::add(ta.t, tb.t, to.t, s);
      },
      "a"_a.none(), "b"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out = a + b (b broadcast as in binary).");
  m.def(
      "mul",
      [](nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        Arg ta = in("mul", "a", a), tb = in("mul", "b", b), to = out("mul", "out", o);
        cudaStream_t s = to_stream("mul", stream);
        nb::gil_scoped_release nogil;
        tessel::mul(ta.t, tb.t, to.t, s);
      },
      "a"_a.none(), "b"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out = a * b (b broadcast as in binary).");
  m.def(
      "copy",
      [](nb::handle src, nb::handle dst, nb::handle stream) {
        Arg ts = in("copy", "src", src), td = out("copy", "dst", dst);
        cudaStream_t s = to_stream("copy", stream);
        nb::gil_scoped_release nogil;
        tessel::copy(ts.t, td.t, s);
      },
      "src"_a.none(), "dst"_a.none(), "stream"_a.none() = 0,
      "dst = src (bit-exact, any tessel dtype).");
  m.def(
      "transpose",
      [](nb::handle src, nb::handle dst, nb::handle stream) {
        Arg ts = in("transpose", "src", src), td = out("transpose", "dst", dst);
        cudaStream_t s = to_stream("transpose", stream);
        nb::gil_scoped_release nogil;
        tessel::transpose(ts.t, td.t, s);
      },
      "src"_a.none(), "dst"_a.none(), "stream"_a.none() = 0, "dst(C, R) = src(R, C)^T.");
  m.def(
      "reduce_sum",
      [](nb::handle x, nb::handle o, nb::handle stream) {
        Arg tx = in("reduce_sum", "x", x), to = out("reduce_sum", "out", o);
        cudaStream_t s = to_stream("reduce_sum", stream);
        nb::gil_scoped_release nogil;
        tessel::reduce_sum(tx.t, to.t, s);
      },
      "x"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out (one element, f32 or x's dtype) = sum of all of x, fp32 accumulation.");
  m.def(
      "reduce_sum_rows",
      [](nb::handle x, nb::handle o, nb::handle stream) {
        Arg tx = in("reduce_sum_rows", "x", x), to = out("reduce_sum_rows", "out", o);
        cudaStream_t s = to_stream("reduce_sum_rows", stream);
        nb::gil_scoped_release nogil;
        tessel::reduce_sum_rows(tx.t, to.t, s);
      },
      "x"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out (...) = x (..., C) summed over the last axis.");
  m.def(
      "softmax",
      [](nb::handle x, nb::handle y, nb::handle stream) {
        Arg tx = in("softmax", "x", x), ty = out("softmax", "y", y);
        cudaStream_t s = to_stream("softmax", stream);
        nb::gil_scoped_release nogil;
        tessel::softmax(tx.t, ty.t, s);
      },
      "x"_a.none(), "y"_a.none(), "stream"_a.none() = 0, "y = softmax(x) along the last axis.");
  m.def(
      "softmax_backward",
      [](nb::handle y, nb::handle dy, nb::handle dx, nb::handle stream) {
        Arg ty = in("softmax_backward", "y", y), tdy = in("softmax_backward", "dy", dy),
            tdx = out("softmax_backward", "dx", dx);
        cudaStream_t s = to_stream("softmax_backward", stream);
        nb::gil_scoped_release nogil;
        tessel::softmax_backward(ty.t, tdy.t, tdx.t, s);
      },
      "y"_a.none(), "dy"_a.none(), "dx"_a.none(), "stream"_a.none() = 0,
      "dx = y * (dy - sum(dy * y)) along the last axis.");
}

}  // namespace tessel::py
