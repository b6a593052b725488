// GPU tests of the gated activations (silu_and_mul, gelu_and_mul, swiglu, geglu) and GELU,
// forward and backward, against the float64 references of src/ref/llm_ref: f32/f16/bf16,
// H in {1, 7, 127, 4097} (scalar and vector paths), row-pitched outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ref/llm_ref.hpp"
#include "tessel/activation.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

enum class Kind { silu, gelu_erf, gelu_tanh };
ref::Act ref_act(Kind k) {
  return k == Kind::silu ? ref::Act::silu : k == Kind::gelu_erf ? ref::Act::gelu_erf : ref::Act::gelu_tanh;
}
GeluApprox approx(Kind k) { return k == Kind::gelu_tanh ? GeluApprox::tanh : GeluApprox::none; }

// Term scale of a product a·b·c: |a|·|b|·|c| elementwise — the gradients are products whose
// factors may cancel (silu' crosses zero), fp32 is accurate relative to the factors.
std::vector<double> prod_scale(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> s(a.size());
  for (size_t i = 0; i < a.size(); ++i) s[i] = std::fabs(a[i]) * std::fabs(b[i]);
  return s;
}

using Param = std::tuple<DType, int64_t, Kind>;
class ActivationGpu : public test::GpuTest, public ::testing::WithParamInterface<Param> {};

TEST_P(ActivationGpu, FusedForwardBackward) {
  const auto [dt, h, kind] = GetParam();
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(300, 600000 / h));
  const ref::Act ra = ref_act(kind);
  std::vector<double> xv = rng().uniform(static_cast<size_t>(rows * 2 * h), -5.0, 5.0);
  std::vector<double> gv = rng().uniform(static_cast<size_t>(rows * h), -1.0, 1.0);
  DeviceTensor x = test::to_device(dt, {rows, 2 * h}, xv);
  DeviceTensor g = test::to_device(dt, {rows, h}, gv);
  DeviceTensor out = test::alloc_pitched(dt, {rows, h}, h + 3);  // pitched: exercises scalar path
  DeviceTensor outd = test::alloc(dt, {rows, h});
  DeviceTensor dx = test::alloc(dt, {rows, 2 * h});
  if (kind == Kind::silu) {
    silu_and_mul(x.t, out.t, stream());
    silu_and_mul(x.t, outd.t, stream());
    silu_and_mul_backward(x.t, g.t, dx.t, stream());
  } else {
    gelu_and_mul(x.t, out.t, approx(kind), stream());
    gelu_and_mul(x.t, outd.t, approx(kind), stream());
    gelu_and_mul_backward(x.t, g.t, dx.t, approx(kind), stream());
  }
  sync();
  std::vector<double> gate, up, dgate, dup;
  ref::split_halves(xv, rows, h, gate, up);
  const std::vector<double> ref_out = ref::glu(ra, gate, up);
  EXPECT_TRUE(test::all_close(test::download_values(out), ref_out, dt));
  EXPECT_TRUE(test::outside_untouched(out));
  EXPECT_TRUE(test::all_close(test::download_values(outd), ref_out, dt));
  ref::glu_backward(ra, gate, up, gv, dgate, dup);
  std::vector<double> sg = prod_scale(gv, up);
  for (size_t i = 0; i < sg.size(); ++i) sg[i] *= 1.2;  // |act'| <= 1.13 (gelu), 1.1 (silu)
  const std::vector<double> scale = ref::join_halves(sg, prod_scale(gv, gate), rows, h);
  EXPECT_TRUE(test::all_close(test::download_values(dx), ref::join_halves(dgate, dup, rows, h), dt, scale));
}

TEST_P(ActivationGpu, SplitForwardBackwardAndGelu) {
  const auto [dt, h, kind] = GetParam();
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(200, 400000 / h));
  const ref::Act ra = ref_act(kind);
  const size_t n = static_cast<size_t>(rows * h);
  std::vector<double> av = rng().uniform(n, -5.0, 5.0), bv = rng().uniform(n, -2.0, 2.0),
                      gv = rng().uniform(n, -1.0, 1.0);
  DeviceTensor a = test::to_device(dt, {rows, h}, av), b = test::to_device(dt, {rows, h}, bv),
               g = test::to_device(dt, {rows, h}, gv);
  DeviceTensor out = test::alloc(dt, {rows, h}), da = test::alloc(dt, {rows, h}),
               db = test::alloc(dt, {rows, h});
  if (kind == Kind::silu) {
    swiglu(a.t, b.t, out.t, stream());
    swiglu_backward(a.t, b.t, g.t, da.t, db.t, stream());
  } else {
    geglu(a.t, b.t, out.t, approx(kind), stream());
    geglu_backward(a.t, b.t, g.t, da.t, db.t, approx(kind), stream());
  }
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(out), ref::glu(ra, av, bv), dt));
  std::vector<double> dgate, dup;
  ref::glu_backward(ra, av, bv, gv, dgate, dup);
  std::vector<double> sg = prod_scale(gv, bv);
  for (double& v : sg) v *= 1.2;
  EXPECT_TRUE(test::all_close(test::download_values(da), dgate, dt, sg));
  EXPECT_TRUE(test::all_close(test::download_values(db), dup, dt, prod_scale(gv, av)));
  if (kind != Kind::silu) {
    DeviceTensor y = test::alloc(dt, {rows, h}), dxg = test::alloc(dt, {rows, h});
    gelu(a.t, y.t, approx(kind), stream());
    gelu_backward(a.t, g.t, dxg.t, approx(kind), stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(y), ref::act_forward(ra, av), dt));
    std::vector<double> s(n);
    for (size_t i = 0; i < n; ++i) s[i] = 1.2 * std::fabs(gv[i]);
    EXPECT_TRUE(test::all_close(test::download_values(dxg), ref::act_backward(ra, av, gv), dt, s));
  }
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  static const char* kinds[] = {"silu", "gelu_erf", "gelu_tanh"};
  return std::string(dtype_name(std::get<0>(info.param))) + "_h" +
         std::to_string(std::get<1>(info.param)) + "_" + kinds[static_cast<int>(std::get<2>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(All, ActivationGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(1, 7, 8, 127, 1000, 4096, 4097),
                                            ::testing::Values(Kind::silu, Kind::gelu_erf, Kind::gelu_tanh)),
                         name);

}  // namespace
}  // namespace tessel
