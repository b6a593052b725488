// Argument validation of the norm family (include/tessel/norm.hpp), no GPU needed: fake,
// never dereferenced device pointers; validation runs dtype -> shape -> strides -> eps ->
// (empty: return) -> device pointers. A call that fails at the device check of a CPU-marked
// tensor ("CUDA tensor") has passed every layout check (the *Accepted tests).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "ref/norm_ref.hpp"
#include "tessel/norm.hpp"
#include "tessel/tensor.hpp"
#include "tessel/tessel_norm.h"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_error;
using tessel::test::expect_invalid;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32;

#define EXPECT_INVALID(stmt, op, arg, ...)                              \
  do {                                                                  \
    SCOPED_TRACE(#stmt);                                                \
    expect_error([&] { stmt; }, TESSEL_ERROR_INVALID_ARGUMENT, op, arg, \
                 std::string(__VA_OPT__(__VA_ARGS__)));                 \
  } while (0)
#define EXPECT_LAYOUT_ACCEPTED(stmt, op, arg) EXPECT_INVALID(stmt, op, arg, "CUDA tensor")
#define EXPECT_NOOP(stmt)  \
  do {                     \
    SCOPED_TRACE(#stmt);   \
    EXPECT_NO_THROW(stmt); \
  } while (0)

constexpr float kEps = 1e-5f;

// ---- rms_norm -----------------------------------------------------------------------------
TEST(NormErrors, RmsNormDtypes) {
  Tensor y = T(f32, {4, 8}, 1), rs = T(f32, {4}, 3);
  EXPECT_INVALID(rms_norm(T(i32, {4, 8}), T(f32, {8}, 2), y, nullptr, kEps, nullptr), "rms_norm",
                 "x", "i32");
  Tensor yh = T(f16, {4, 8}, 1);
  EXPECT_INVALID(rms_norm(T(f32, {4, 8}), T(f32, {8}, 2), yh, nullptr, kEps, nullptr), "rms_norm",
                 "y", "f16");
  EXPECT_INVALID(rms_norm(T(f32, {4, 8}), T(bf16, {8}, 2), y, nullptr, kEps, nullptr), "rms_norm",
                 "w", "bf16");
  Tensor rs16 = T(f16, {4}, 3);
  EXPECT_INVALID(rms_norm(T(f32, {4, 8}), T(f32, {8}, 2), y, &rs16, kEps, nullptr), "rms_norm",
                 "rstd", "f16");
}

TEST(NormErrors, RmsNormShapes) {
  Tensor y = T(bf16, {4, 8}, 1);
  EXPECT_INVALID(rms_norm(T(bf16, {4, 8}), T(bf16, {9}, 2), y, nullptr, kEps, nullptr), "rms_norm",
                 "w", "got (9,)");
  EXPECT_INVALID(rms_norm(T(bf16, {4, 8}), T(bf16, {1, 8}, 2), y, nullptr, kEps, nullptr),
                 "rms_norm", "w");
  Tensor y9 = T(bf16, {4, 9}, 1);
  EXPECT_INVALID(rms_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), y9, nullptr, kEps, nullptr), "rms_norm",
                 "y", "(4, 9)");
  Tensor rs = T(f32, {5}, 3);
  EXPECT_INVALID(rms_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), y, &rs, kEps, nullptr), "rms_norm",
                 "rstd", "(5,)");
  Tensor rs2 = T(f32, {4, 1}, 3);
  EXPECT_INVALID(rms_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), y, &rs2, kEps, nullptr), "rms_norm",
                 "rstd");
  Tensor y0 = T(bf16, {}, 1);
  EXPECT_INVALID(rms_norm(T(bf16, {}), T(bf16, {1}, 2), y0, nullptr, kEps, nullptr), "rms_norm",
                 "x");
}

TEST(NormErrors, RmsNormStridesAndEps) {
  Tensor y = T(f32, {4, 8}, 1);
  // last axis not contiguous
  EXPECT_INVALID(rms_norm(S(f32, {4, 8}, {1, 4}), T(f32, {8}, 2), y, nullptr, kEps, nullptr),
                 "rms_norm", "x");
  // strided weight
  EXPECT_INVALID(rms_norm(T(f32, {4, 8}), S(f32, {8}, {2}, 2), y, nullptr, kEps, nullptr),
                 "rms_norm", "w");
  EXPECT_INVALID(rms_norm(T(f32, {4, 8}), T(f32, {8}, 2), y, nullptr, -1.f, nullptr), "rms_norm",
                 "eps");
  EXPECT_INVALID(rms_norm(T(f32, {4, 8}), T(f32, {8}, 2), y, nullptr,
                          std::numeric_limits<float>::quiet_NaN(), nullptr),
                 "rms_norm", "eps");
}

TEST(NormErrors, RmsNormTooLongRowIsUnsupported) {
  Tensor y = T(f32, {1, 262145}, 1);
  SCOPED_TRACE("262145 columns");
  expect_error(
      [&] {
        rms_norm(T(f32, {1, 262145}), T(f32, {262145}, 2), y, nullptr, kEps, nullptr);
      },
      TESSEL_ERROR_UNSUPPORTED, "rms_norm", "x", "262144");
}

TEST(NormErrors, RmsNormAcceptedLayouts) {
  Tensor y = on_cpu(S(f32, {4, 8}, {12, 1}, 1));
  Tensor rs = on_cpu(T(f32, {4}, 3));
  EXPECT_LAYOUT_ACCEPTED(
      rms_norm(on_cpu(S(f32, {4, 8}, {16, 1})), on_cpu(T(f32, {8}, 2)), y, &rs, kEps, nullptr),
      "rms_norm", "x");
  Tensor y3 = on_cpu(T(bf16, {2, 3, 262144}, 1));
  Tensor rs3 = on_cpu(T(f32, {2, 3}, 3));
  EXPECT_LAYOUT_ACCEPTED(rms_norm(on_cpu(T(bf16, {2, 3, 262144})), on_cpu(T(bf16, {262144}, 2)), y3,
                                  &rs3, 0.f, nullptr),
                         "rms_norm", "x");
}

TEST(NormErrors, RmsNormZeroSizeIsNoop) {
  Tensor y = T(f32, {0, 8}, 1);
  Tensor rs = T(f32, {0}, 3);
  EXPECT_NOOP(rms_norm(T(f32, {0, 8}), T(f32, {8}, 2), y, &rs, kEps, nullptr));
  Tensor y2 = T(f32, {4, 0}, 1);
  EXPECT_NOOP(rms_norm(T(f32, {4, 0}), T(f32, {0}, 2), y2, nullptr, kEps, nullptr));
}

TEST(NormErrors, RmsNormAdd) {
  Tensor h = T(bf16, {4, 8}, 3), y = T(bf16, {4, 8}, 4);
  EXPECT_INVALID(rms_norm_add(T(bf16, {4, 8}), T(f16, {4, 8}, 1), T(bf16, {8}, 2), h, y, nullptr,
                              kEps, nullptr),
                 "rms_norm_add", "residual", "f16");
  EXPECT_INVALID(rms_norm_add(T(bf16, {4, 8}), T(bf16, {4, 7}, 1), T(bf16, {8}, 2), h, y, nullptr,
                              kEps, nullptr),
                 "rms_norm_add", "residual", "(4, 7)");
  Tensor h9 = T(bf16, {4, 9}, 3);
  EXPECT_INVALID(rms_norm_add(T(bf16, {4, 8}), T(bf16, {4, 8}, 1), T(bf16, {8}, 2), h9, y, nullptr,
                              kEps, nullptr),
                 "rms_norm_add", "h");
  Tensor hc = on_cpu(T(bf16, {4, 8}, 3)), yc = on_cpu(T(bf16, {4, 8}, 4));
  EXPECT_LAYOUT_ACCEPTED(rms_norm_add(on_cpu(T(bf16, {4, 8})), on_cpu(T(bf16, {4, 8}, 1)),
                                      on_cpu(T(bf16, {8}, 2)), hc, yc, nullptr, kEps, nullptr),
                         "rms_norm_add", "x");
}

TEST(NormErrors, RmsNormBackward) {
  Tensor dx = T(f32, {4, 8}, 5), dw = T(f32, {8}, 6);
  const Tensor rs = T(f32, {4}, 3);
  EXPECT_INVALID(rms_norm_backward(T(f16, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2), rs, nullptr,
                                   dx, dw, nullptr),
                 "rms_norm_backward", "dy", "f16");
  EXPECT_INVALID(rms_norm_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2),
                                   T(f32, {3}, 3), nullptr, dx, dw, nullptr),
                 "rms_norm_backward", "rstd", "(3,)");
  Tensor dw7 = T(f32, {7}, 6);
  EXPECT_INVALID(rms_norm_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2), rs, nullptr,
                                   dx, dw7, nullptr),
                 "rms_norm_backward", "dw", "got (7,)");
  const Tensor dh = T(f32, {4, 9}, 7);
  EXPECT_INVALID(rms_norm_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2), rs, &dh, dx,
                                   dw, nullptr),
                 "rms_norm_backward", "dh");
  Tensor dxc = on_cpu(T(f32, {4, 8}, 5)), dwc = on_cpu(T(f32, {8}, 6));
  EXPECT_LAYOUT_ACCEPTED(
      rms_norm_backward(on_cpu(T(f32, {4, 8})), on_cpu(T(f32, {4, 8}, 1)), on_cpu(T(f32, {8}, 2)),
                        on_cpu(T(f32, {4}, 3)), nullptr, dxc, dwc, nullptr),
      "rms_norm_backward", "dy");
  // No columns: nothing to do, no pointer touched.
  Tensor dx0 = T(f32, {4, 0}, 5), dw0 = T(f32, {0}, 6);
  EXPECT_NOOP(rms_norm_backward(T(f32, {4, 0}), T(f32, {4, 0}, 1), T(f32, {0}, 2), T(f32, {4}, 3),
                                nullptr, dx0, dw0, nullptr));
}

// ---- layer_norm ----------------------------------------------------------------------------
TEST(NormErrors, LayerNorm) {
  Tensor y = T(bf16, {4, 8}, 1), mu = T(f32, {4}, 3), rs = T(f32, {4}, 4);
  const Tensor b16 = T(f16, {8}, 5), b9 = T(bf16, {9}, 5);
  EXPECT_INVALID(layer_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), &b16, y, &mu, &rs, kEps, nullptr),
                 "layer_norm", "b", "f16");
  EXPECT_INVALID(layer_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), &b9, y, &mu, &rs, kEps, nullptr),
                 "layer_norm", "b", "got (9,)");
  Tensor mu_bad = T(f32, {2, 2}, 3);
  EXPECT_INVALID(
      layer_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), nullptr, y, &mu_bad, &rs, kEps, nullptr),
      "layer_norm", "mean");
  Tensor rs_bad = T(bf16, {4}, 4);
  EXPECT_INVALID(
      layer_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), nullptr, y, &mu, &rs_bad, kEps, nullptr),
      "layer_norm", "rstd", "bf16");
  EXPECT_INVALID(layer_norm(T(bf16, {4, 8}), T(bf16, {8}, 2), nullptr, y, &mu, &rs, -0.5f, nullptr),
                 "layer_norm", "eps");
  Tensor yc = on_cpu(T(bf16, {4, 8}, 1)), muc = on_cpu(T(f32, {4}, 3)),
         rsc = on_cpu(T(f32, {4}, 4));
  const Tensor bc = on_cpu(T(bf16, {8}, 5));
  EXPECT_LAYOUT_ACCEPTED(layer_norm(on_cpu(T(bf16, {4, 8})), on_cpu(T(bf16, {8}, 2)), &bc, yc, &muc,
                                    &rsc, kEps, nullptr),
                         "layer_norm", "x");
  Tensor y0 = T(bf16, {0, 8}, 1);
  EXPECT_NOOP(
      layer_norm(T(bf16, {0, 8}), T(bf16, {8}, 2), nullptr, y0, nullptr, nullptr, kEps, nullptr));
}

TEST(NormErrors, LayerNormBackward) {
  Tensor dx = T(f32, {4, 8}, 5), dw = T(f32, {8}, 6), db = T(f32, {8}, 7);
  const Tensor mu = T(f32, {4}, 3), rs = T(f32, {4}, 4);
  EXPECT_INVALID(layer_norm_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2),
                                     T(f32, {5}, 3), rs, dx, dw, &db, nullptr),
                 "layer_norm_backward", "mean");
  Tensor db16 = T(f16, {8}, 7);
  EXPECT_INVALID(layer_norm_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2), mu, rs, dx,
                                     dw, &db16, nullptr),
                 "layer_norm_backward", "db", "f16");
  Tensor dx_bad = T(f32, {8, 4}, 5);
  EXPECT_INVALID(layer_norm_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), T(f32, {8}, 2), mu, rs,
                                     dx_bad, dw, &db, nullptr),
                 "layer_norm_backward", "dx");
  Tensor dxc = on_cpu(T(f32, {4, 8}, 5)), dwc = on_cpu(T(f32, {8}, 6)),
         dbc = on_cpu(T(f32, {8}, 7));
  EXPECT_LAYOUT_ACCEPTED(
      layer_norm_backward(on_cpu(T(f32, {4, 8})), on_cpu(T(f32, {4, 8}, 1)), on_cpu(T(f32, {8}, 2)),
                          on_cpu(T(f32, {4}, 3)), on_cpu(T(f32, {4}, 4)), dxc, dwc, &dbc, nullptr),
      "layer_norm_backward", "dy");
}

// ---- group_norm ----------------------------------------------------------------------------
TEST(NormErrors, GroupNorm) {
  Tensor y = T(f32, {2, 6, 5}, 1), mu = T(f32, {2, 3}, 3), rs = T(f32, {2, 3}, 4);
  EXPECT_INVALID(
      group_norm(T(f32, {2, 6, 5}), 4, T(f32, {6}, 2), nullptr, y, &mu, &rs, kEps, nullptr),
      "group_norm", "groups", "C = 6");
  EXPECT_INVALID(
      group_norm(T(f32, {2, 6, 5}), 0, T(f32, {6}, 2), nullptr, y, &mu, &rs, kEps, nullptr),
      "group_norm", "groups");
  Tensor y1 = T(f32, {6}, 1);
  EXPECT_INVALID(
      group_norm(T(f32, {6}), 3, T(f32, {6}, 2), nullptr, y1, nullptr, nullptr, kEps, nullptr),
      "group_norm", "x");
  EXPECT_INVALID(
      group_norm(T(f32, {2, 6, 5}), 3, T(f32, {5}, 2), nullptr, y, &mu, &rs, kEps, nullptr),
      "group_norm", "w", "got (5,)");
  Tensor mu_bad = T(f32, {2, 6}, 3);
  EXPECT_INVALID(
      group_norm(T(f32, {2, 6, 5}), 3, T(f32, {6}, 2), nullptr, y, &mu_bad, &rs, kEps, nullptr),
      "group_norm", "mean", "(2, 3)");
  // x must be dense
  EXPECT_INVALID(group_norm(S(f32, {2, 6, 5}, {60, 5, 1}), 3, T(f32, {6}, 2), nullptr, y, &mu, &rs,
                            kEps, nullptr),
                 "group_norm", "x");
  Tensor y_big = T(f32, {1, 2, 262145}, 1);
  SCOPED_TRACE("row of 262145");
  expect_error(
      [&] {
        group_norm(T(f32, {1, 2, 262145}), 2, T(f32, {2}, 2), nullptr, y_big, nullptr, nullptr,
                   kEps, nullptr);
      },
      TESSEL_ERROR_UNSUPPORTED, "group_norm", "x", "262144");
  Tensor yc = on_cpu(T(f32, {2, 6, 5}, 1)), muc = on_cpu(T(f32, {2, 3}, 3)),
         rsc = on_cpu(T(f32, {2, 3}, 4));
  const Tensor bc = on_cpu(T(f32, {6}, 5));
  EXPECT_LAYOUT_ACCEPTED(group_norm(on_cpu(T(f32, {2, 6, 5})), 3, on_cpu(T(f32, {6}, 2)), &bc, yc,
                                    &muc, &rsc, kEps, nullptr),
                         "group_norm", "x");
  Tensor y0 = T(f32, {0, 6, 5}, 1);
  EXPECT_NOOP(group_norm(T(f32, {0, 6, 5}), 3, T(f32, {6}, 2), nullptr, y0, nullptr, nullptr, kEps,
                         nullptr));
}

TEST(NormErrors, GroupNormBackward) {
  Tensor dx = T(bf16, {2, 6, 5}, 5), dw = T(bf16, {6}, 6), db = T(bf16, {6}, 7);
  const Tensor mu = T(f32, {2, 3}, 3), rs = T(f32, {2, 3}, 4);
  EXPECT_INVALID(group_norm_backward(T(bf16, {2, 6, 4}), T(bf16, {2, 6, 5}, 1), 3, T(bf16, {6}, 2),
                                     mu, rs, dx, dw, &db, nullptr),
                 "group_norm_backward", "dy");
  EXPECT_INVALID(group_norm_backward(T(bf16, {2, 6, 5}), T(bf16, {2, 6, 5}, 1), 3, T(bf16, {6}, 2),
                                     T(f32, {2, 2}, 3), rs, dx, dw, &db, nullptr),
                 "group_norm_backward", "mean");
  Tensor db5 = T(bf16, {5}, 7);
  EXPECT_INVALID(group_norm_backward(T(bf16, {2, 6, 5}), T(bf16, {2, 6, 5}, 1), 3, T(bf16, {6}, 2),
                                     mu, rs, dx, dw, &db5, nullptr),
                 "group_norm_backward", "db");
  Tensor dxc = on_cpu(T(bf16, {2, 6, 5}, 5)), dwc = on_cpu(T(bf16, {6}, 6));
  EXPECT_LAYOUT_ACCEPTED(
      group_norm_backward(on_cpu(T(bf16, {2, 6, 5})), on_cpu(T(bf16, {2, 6, 5}, 1)), 3,
                          on_cpu(T(bf16, {6}, 2)), on_cpu(T(f32, {2, 3}, 3)),
                          on_cpu(T(f32, {2, 3}, 4)), dxc, dwc, nullptr, nullptr),
      "group_norm_backward", "dy");
}

// ---- C ABI ---------------------------------------------------------------------------------
TEST(NormCApi, StatusAndMessage) {
  tessel_tensor_t x, w, y;
  const int64_t xs[2] = {4, 8}, ws[1] = {8};
  ASSERT_EQ(tessel_tensor_init(&x, fake(0), TESSEL_F32, 2, xs), TESSEL_OK);
  ASSERT_EQ(tessel_tensor_init(&w, fake(1), TESSEL_F16, 1, ws), TESSEL_OK);
  ASSERT_EQ(tessel_tensor_init(&y, fake(2), TESSEL_F32, 2, xs), TESSEL_OK);
  EXPECT_EQ(tessel_rms_norm(&x, &w, &y, nullptr, kEps, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("tessel::rms_norm: argument 'w'"),
            std::string::npos)
      << tessel_last_error();
  EXPECT_EQ(tessel_layer_norm(nullptr, &w, nullptr, &y, nullptr, nullptr, kEps, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("'x'"), std::string::npos);
  EXPECT_EQ(tessel_group_norm_backward(&x, &x, 3, &w, &x, &x, &y, &w, nullptr, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);  // groups 3 does not divide C = 8
  EXPECT_NE(std::string(tessel_last_error()).find("'groups'"), std::string::npos)
      << tessel_last_error();
  tessel_tensor_t x0, y0;
  const int64_t zs[2] = {0, 8};
  ASSERT_EQ(tessel_tensor_init(&x0, fake(0), TESSEL_F32, 2, zs), TESSEL_OK);
  ASSERT_EQ(tessel_tensor_init(&y0, fake(2), TESSEL_F32, 2, zs), TESSEL_OK);
  tessel_tensor_t w32;
  ASSERT_EQ(tessel_tensor_init(&w32, fake(1), TESSEL_F32, 1, ws), TESSEL_OK);
  EXPECT_EQ(tessel_rms_norm(&x0, &w32, &y0, nullptr, kEps, nullptr), TESSEL_OK);  // zero-size no-op
}

// ---- float64 references (hand-checked values) -------------------------------------------------
TEST(NormReference, RmsNormOfConstantRowIsWeight) {
  const std::vector<double> x = {3, 3, 3, 3}, w = {1, 2, 3, 4};
  const ref::NormForward f = ref::rms_norm(x, w, 1, 4, 0.0);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f.y[i], w[i]);
  EXPECT_DOUBLE_EQ(f.rstd[0], 1.0 / 3.0);
}

TEST(NormReference, LayerNormStandardizes) {
  const std::vector<double> x = {1, 2, 3, 4}, w = {1, 1, 1, 1}, b = {10, 10, 10, 10};
  const ref::NormForward f = ref::layer_norm(x, w, b, 1, 4, 0.0);
  EXPECT_DOUBLE_EQ(f.mean[0], 2.5);
  const double rstd = 1.0 / std::sqrt(1.25);
  EXPECT_DOUBLE_EQ(f.rstd[0], rstd);
  EXPECT_NEAR(f.y[0], 10 - 1.5 * rstd, 1e-12);
  EXPECT_NEAR(f.y[3], 10 + 1.5 * rstd, 1e-12);
}

// Backward references against central finite differences of the forward references.
TEST(NormReference, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 2, cols = 5, n = 2, c = 4, hw = 3, groups = 2;
  std::vector<double> x = {0.3, -1.2, 0.8, 2.0, -0.4, 1.1, 0.2, -0.7, 0.9, 1.6};
  std::vector<double> dy = {0.5, -0.3, 0.2, 0.9, -1.0, 0.4, 0.1, -0.6, 0.7, 0.3};
  const std::vector<double> w = {0.9, 1.1, 1.3, 0.7, 1.2};
  const double eps = 1e-3, h = 1e-6;
  auto dot = [&](const std::vector<double>& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  for (int kind = 0; kind < 2; ++kind) {
    auto f = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
      return kind == 0 ? ref::rms_norm(xx, ww, rows, cols, eps).y
                       : ref::layer_norm(xx, ww, {}, rows, cols, eps).y;
    };
    const ref::NormBackward b = kind == 0 ? ref::rms_norm_backward(dy, x, w, {}, rows, cols, eps)
                                          : ref::layer_norm_backward(dy, x, w, rows, cols, eps);
    for (size_t i = 0; i < x.size(); ++i) {
      std::vector<double> xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      EXPECT_NEAR(b.dx[i], (dot(f(xp, w)) - dot(f(xm, w))) / (2 * h), 1e-6)
          << "kind " << kind << " dx " << i;
    }
    for (size_t i = 0; i < w.size(); ++i) {
      std::vector<double> wp = w, wm = w;
      wp[i] += h;
      wm[i] -= h;
      EXPECT_NEAR(b.dw[i], (dot(f(x, wp)) - dot(f(x, wm))) / (2 * h), 1e-6)
          << "kind " << kind << " dw " << i;
    }
  }
  // Group norm: x (2, 4, 3), 2 groups; dx and dw by finite differences.
  std::vector<double> gx(n * c * hw), gdy(n * c * hw);
  for (size_t i = 0; i < gx.size(); ++i) {
    gx[i] = std::sin(1.7 * i + 0.3);
    gdy[i] = std::cos(0.9 * i);
  }
  const std::vector<double> gw = {0.8, 1.2, 1.0, 0.6}, gb = {0.1, 0.2, 0.3, 0.4};
  auto gdot = [&](const std::vector<double>& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * gdy[i];
    return s;
  };
  const ref::NormBackward gbk = ref::group_norm_backward(gdy, gx, gw, n, c, hw, groups, eps);
  for (size_t i = 0; i < gx.size(); ++i) {
    std::vector<double> xp = gx, xm = gx;
    xp[i] += h;
    xm[i] -= h;
    EXPECT_NEAR(gbk.dx[i],
                (gdot(ref::group_norm(xp, gw, gb, n, c, hw, groups, eps).y) -
                 gdot(ref::group_norm(xm, gw, gb, n, c, hw, groups, eps).y)) /
                    (2 * h),
                1e-6)
        << "gn dx " << i;
  }
  for (size_t i = 0; i < gw.size(); ++i) {
    std::vector<double> wp = gw, wm = gw;
    wp[i] += h;
    wm[i] -= h;
    EXPECT_NEAR(gbk.dw[i],
                (gdot(ref::group_norm(gx, wp, gb, n, c, hw, groups, eps).y) -
                 gdot(ref::group_norm(gx, wm, gb, n, c, hw, groups, eps).y)) /
                    (2 * h),
                1e-6)
        << "gn dw " << i;
    double sdy = 0;
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < hw; ++j) sdy += gdy[(k * c + i) * hw + j];
    EXPECT_NEAR(gbk.db[i], sdy, 1e-12);
  }
}

TEST(NormReference, SizesChecked) {
  const std::vector<double> x(6, 1.0), w(4, 1.0);
  EXPECT_THROW(ref::rms_norm(x, w, 2, 3, 1e-5), std::invalid_argument);
  EXPECT_THROW(ref::group_norm(x, w, {}, 1, 4, 2, 3, 1e-5), std::invalid_argument);
}

}  // namespace
}  // namespace tessel
