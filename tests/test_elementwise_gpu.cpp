// GPU tests of tessel::unary / tessel::binary against the float64 references: every op,
// f32/f16/bf16, ragged shapes (1, 7, 127, 4097 columns, several rows), every broadcast
// mode of b, in-place (out == a) and views that are not 16-byte aligned.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "ref/reference.hpp"
#include "tessel/ops.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;
using Shape = std::vector<int64_t>;

const std::vector<Shape> kShapes = {{1},     {7},     {1, 127},  {3, 127},    {4097},    {2, 4097},
                                    {33, 7}, {33, 1}, {5, 1000}, {2, 3, 129}, {64, 1024}};

std::vector<double> inputs(test::Rng& rng, size_t n) { return rng.uniform(n, -4.0, 4.0); }

// ---- unary ------------------------------------------------------------------------------

class UnaryGpu : public test::GpuTest,
                 public ::testing::WithParamInterface<std::tuple<UnaryOp, DType>> {};

TEST_P(UnaryGpu, MatchesReference) {
  const auto [op, dt] = GetParam();
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + test::shape_str(shape));
    std::vector<double> xv = inputs(rng(), test::numel(shape));
    DeviceTensor x = test::to_device(dt, shape, xv);
    DeviceTensor y = test::alloc(dt, shape);  // poisoned: unwritten elements read as NaN
    unary(op, x.t, y.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(y), ref::unary(test::to_ref(op), xv), dt));
  }
}

TEST_P(UnaryGpu, InPlace) {
  const auto [op, dt] = GetParam();
  for (const Shape& shape : {Shape{7}, Shape{3, 4097}, Shape{64, 1024}}) {
    SCOPED_TRACE("shape " + test::shape_str(shape));
    std::vector<double> xv = inputs(rng(), test::numel(shape));
    DeviceTensor x = test::to_device(dt, shape, xv);
    unary(op, x.t, x.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(x), ref::unary(test::to_ref(op), xv), dt));
  }
}

// x and y start 1 and 3 elements into their buffers: element-aligned, not 16-byte aligned.
TEST_P(UnaryGpu, UnalignedViews) {
  const auto [op, dt] = GetParam();
  for (const Shape& shape : {Shape{7}, Shape{2, 4097}, Shape{33, 64}}) {
    SCOPED_TRACE("shape " + test::shape_str(shape));
    std::vector<double> xv = inputs(rng(), test::numel(shape));
    DeviceTensor x = test::alloc(dt, shape, /*offset=*/1);
    test::upload_values(x, xv);
    DeviceTensor y = test::alloc(dt, shape, /*offset=*/3);
    unary(op, x.t, y.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(y), ref::unary(test::to_ref(op), xv), dt));
    EXPECT_TRUE(test::outside_untouched(y));
  }
}

std::string unary_name(const ::testing::TestParamInfo<std::tuple<UnaryOp, DType>>& info) {
  return std::string(unary_op_name(std::get<0>(info.param))) + "_" +
         dtype_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, UnaryGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kAllUnaryOps),
                                            ::testing::ValuesIn(test::kFloatDTypes)),
                         unary_name);

// ---- binary -----------------------------------------------------------------------------

using BinaryParam = std::tuple<BinaryOp, DType, ref::Broadcast>;

class BinaryGpu : public test::GpuTest, public ::testing::WithParamInterface<BinaryParam> {
 protected:
  // b's shape for `mode`, varying the spelling: row vectors as (C) or (1, ..., 1, C),
  // scalars as (), (1) or (1, 1).
  static Shape b_shape(ref::Broadcast mode, const Shape& a, size_t variant) {
    switch (mode) {
      case ref::Broadcast::same: return a;
      case ref::Broadcast::row: {
        if (variant % 2 == 0) return {a.back()};
        Shape s(a.size(), 1);
        s.back() = a.back();
        return s;
      }
      case ref::Broadcast::scalar: {
        static const Shape spellings[] = {{}, {1}, {1, 1}};
        return spellings[variant % 3];
      }
    }
    return a;
  }

  std::vector<double> b_values(BinaryOp op, size_t n) {
    // Divisors stay away from zero so the quotient is well conditioned.
    return op == BinaryOp::div ? rng().signed_magnitude(n, 0.5, 4.0) : inputs(rng(), n);
  }

  static std::pair<int64_t, int64_t> rows_cols(const Shape& shape) {
    const int64_t cols = shape.back();
    return {test::numel(shape) / cols, cols};
  }
};

TEST_P(BinaryGpu, MatchesReference) {
  const auto [op, dt, mode] = GetParam();
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const Shape& shape = kShapes[i];
    const Shape bs = b_shape(mode, shape, i);
    SCOPED_TRACE("a " + test::shape_str(shape) + ", b " + test::shape_str(bs));
    const auto [rows, cols] = rows_cols(shape);
    std::vector<double> av = inputs(rng(), test::numel(shape));
    std::vector<double> bv = b_values(op, test::numel(bs));
    DeviceTensor a = test::to_device(dt, shape, av);
    DeviceTensor b = test::to_device(dt, bs, bv);
    DeviceTensor out = test::alloc(dt, shape);
    binary(op, a.t, b.t, out.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(out),
                                ref::binary(test::to_ref(op), av, bv, rows, cols, mode), dt));
  }
}

TEST_P(BinaryGpu, InPlaceOutIsA) {
  const auto [op, dt, mode] = GetParam();
  for (const Shape& shape : {Shape{7}, Shape{3, 4097}, Shape{64, 1024}}) {
    const Shape bs = b_shape(mode, shape, 1);
    SCOPED_TRACE("a " + test::shape_str(shape) + ", b " + test::shape_str(bs));
    const auto [rows, cols] = rows_cols(shape);
    std::vector<double> av = inputs(rng(), test::numel(shape));
    std::vector<double> bv = b_values(op, test::numel(bs));
    DeviceTensor a = test::to_device(dt, shape, av);
    DeviceTensor b = test::to_device(dt, bs, bv);
    binary(op, a.t, b.t, a.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(a),
                                ref::binary(test::to_ref(op), av, bv, rows, cols, mode), dt));
  }
}

TEST_P(BinaryGpu, UnalignedViews) {
  const auto [op, dt, mode] = GetParam();
  for (const Shape& shape : {Shape{2, 4097}, Shape{9, 64}}) {
    const Shape bs = b_shape(mode, shape, 0);
    SCOPED_TRACE("a " + test::shape_str(shape) + ", b " + test::shape_str(bs));
    const auto [rows, cols] = rows_cols(shape);
    std::vector<double> av = inputs(rng(), test::numel(shape));
    std::vector<double> bv = b_values(op, test::numel(bs));
    DeviceTensor a = test::alloc(dt, shape, 1);
    DeviceTensor b = test::alloc(dt, bs, 2);
    DeviceTensor out = test::alloc(dt, shape, 3);
    test::upload_values(a, av);
    test::upload_values(b, bv);
    binary(op, a.t, b.t, out.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(out),
                                ref::binary(test::to_ref(op), av, bv, rows, cols, mode), dt));
    EXPECT_TRUE(test::outside_untouched(out));
  }
}

std::string binary_name(const ::testing::TestParamInfo<BinaryParam>& info) {
  return std::string(binary_op_name(std::get<0>(info.param))) + "_" +
         dtype_name(std::get<1>(info.param)) + "_" + ref::broadcast_name(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, BinaryGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kAllBinaryOps),
                                            ::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(ref::Broadcast::same,
                                                              ref::Broadcast::row,
                                                              ref::Broadcast::scalar)),
                         binary_name);

// The convenience wrappers and the default (legacy) stream.
class ElementwiseGpu : public test::GpuTest {};

TEST_F(ElementwiseGpu, AddMulWrappersOnDefaultStream) {
  const Shape shape = {17, 300};
  std::vector<double> av = inputs(rng(), test::numel(shape));
  std::vector<double> bv = inputs(rng(), test::numel(shape));
  DeviceTensor a = test::to_device(DType::f32, shape, av);
  DeviceTensor b = test::to_device(DType::f32, shape, bv);
  DeviceTensor out = test::alloc(DType::f32, shape);
  add(a.t, b.t, out.t, nullptr);
  EXPECT_TRUE(test::all_close(
      test::download_values(out),
      ref::binary(ref::BinaryOp::add, av, bv, 17, 300, ref::Broadcast::same), DType::f32));
  test::poison(out);
  mul(a.t, b.t, out.t, nullptr);
  EXPECT_TRUE(test::all_close(
      test::download_values(out),
      ref::binary(ref::BinaryOp::mul, av, bv, 17, 300, ref::Broadcast::same), DType::f32));
}

}  // namespace
}  // namespace tessel
