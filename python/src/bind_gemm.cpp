// Bindings of tessel/gemm.hpp: gemm and bmm with fused epilogues (bias, activation, residual).
// Optional tensors are None; b_layout is "nk" / "kn", a_layout "mk" / "km", activation a name.
#include <nanobind/stl/string.h>

#include "common.hpp"
#include "tessel/gemm.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

tessel::BLayout b_layout(const char* op, nb::handle h) {
  std::string s;
  if (nb::try_cast(h, s)) {
    if (s == "nk") return tessel::BLayout::nk;
    if (s == "kn") return tessel::BLayout::kn;
  }
  arg_fail(op, "b_layout", "\"nk\" (b is (N, K)) or \"kn\" (b is (K, N))", nb::repr(h).c_str());
}

tessel::ALayout a_layout(const char* op, nb::handle h) {
  std::string s;
  if (nb::try_cast(h, s)) {
    if (s == "mk") return tessel::ALayout::mk;
    if (s == "km") return tessel::ALayout::km;
  }
  arg_fail(op, "a_layout", "\"mk\" (a is (M, K)) or \"km\" (a is (K, M))", nb::repr(h).c_str());
}

tessel::GemmActivation activation(const char* op, nb::handle h) {
  if (h.is_none()) return tessel::GemmActivation::none;
  std::string s;
  if (nb::try_cast(h, s))
    for (int i = 0; i <= static_cast<int>(tessel::GemmActivation::silu); ++i)
      if (s == tessel::gemm_activation_name(static_cast<tessel::GemmActivation>(i)))
        return static_cast<tessel::GemmActivation>(i);
  arg_fail(op, "activation", "one of none/relu/gelu_tanh/gelu/silu", nb::repr(h).c_str());
}

void run(const char* op, bool batched, nb::handle a, nb::handle b, nb::handle d, nb::handle bias,
         nb::handle c, float alpha, float beta, nb::handle layout, nb::handle act, int split_k,
         nb::handle stream, nb::handle alayout) {
  Arg ta = in(op, "a", a), tb = in(op, "b", b), td = out(op, "d", d);
  tessel::GemmOptions opt;
  opt.alpha = alpha;
  opt.beta = beta;
  opt.b_layout = b_layout(op, layout);
  opt.a_layout = a_layout(op, alayout);
  opt.activation = activation(op, act);
  opt.split_k = split_k;
  Arg tbias, tc;
  if (!bias.is_none()) {
    tbias = in(op, "bias", bias);
    opt.bias = &tbias.t;
  }
  if (!c.is_none()) {
    tc = in(op, "c", c);
    opt.c = &tc.t;
  }
  cudaStream_t s = to_stream(op, stream);
  nb::gil_scoped_release nogil;
  if (batched)
    tessel::bmm(ta.t, tb.t, td.t, s, opt);
  else
    tessel::gemm(ta.t, tb.t, td.t, s, opt);
}

}  // namespace

void bind_gemm(nb::module_& m);
const Binder kRegisterGemm(&bind_gemm);

void bind_gemm(nb::module_& m) {
  m.def(
      "gemm",
      [](nb::handle a, nb::handle b, nb::handle d, nb::handle bias, nb::handle c, float alpha,
         float beta, nb::handle layout, nb::handle act, int split_k, nb::handle stream,
         nb::handle alayout) {
        run("gemm", false, a, b, d, bias, c, alpha, beta, layout, act, split_k, stream, alayout);
      },
      "a"_a.none(), "b"_a.none(), "d"_a.none(), "bias"_a.none() = nb::none(),
      "c"_a.none() = nb::none(), "alpha"_a = 1.f, "beta"_a = 0.f, "b_layout"_a.none() = "nk",
      "activation"_a.none() = "none", "split_k"_a = 0, "stream"_a.none() = 0,
      "a_layout"_a.none() = "mk",
      "d = act(alpha * op(a) @ op(b) + bias) + beta * c; a (M, K) ('mk') or (K, M) ('km'), "
      "b (N, K) ('nk') or (K, N) ('kn'), d (M, N).");
  m.def(
      "bmm",
      [](nb::handle a, nb::handle b, nb::handle d, nb::handle bias, nb::handle c, float alpha,
         float beta, nb::handle layout, nb::handle act, int split_k, nb::handle stream,
         nb::handle alayout) {
        run("bmm", true, a, b, d, bias, c, alpha, beta, layout, act, split_k, stream, alayout);
      },
      "a"_a.none(), "b"_a.none(), "d"_a.none(), "bias"_a.none() = nb::none(),
      "c"_a.none() = nb::none(), "alpha"_a = 1.f, "beta"_a = 0.f, "b_layout"_a.none() = "nk",
      "activation"_a.none() = "none", "split_k"_a = 0, "stream"_a.none() = 0,
      "a_layout"_a.none() = "mk",
      "Strided batched gemm: a (B, M, K) or (M, K), b (B, ...) or 2-D, d (B, M, N).");
}

}  // namespace tessel::py
