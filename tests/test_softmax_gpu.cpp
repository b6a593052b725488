// GPU tests of tessel::softmax and tessel::softmax_backward against the float64
// references: f32/f16/bf16; row lengths from 1 to 70000 (long rows take the streaming
// path); 1 to 300 rows; large-magnitude inputs (a kernel that skips the max subtraction
// overflows); row-pitched and N-D views.
#include <gtest/gtest.h>

#include <algorithm>
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

// Row counts tried for every row length, capped so one case stays ~1.2M elements.
std::vector<int64_t> row_counts(int64_t cols) {
  const int64_t cap = std::max<int64_t>(1, (int64_t{1200} * 1000) / cols);
  std::vector<int64_t> rows;
  for (int64_t r : {int64_t{1}, int64_t{7}, int64_t{300}}) {
    const int64_t c = std::min(r, cap);
    if (rows.empty() || rows.back() != c) rows.push_back(c);
  }
  return rows;
}

// softmax outputs of random logits, rounded to the dtype, as backward's `y`.
std::vector<double> softmax_outputs(test::Rng& rng, int64_t rows, int64_t cols) {
  return ref::softmax(rng.uniform(static_cast<size_t>(rows * cols), -4.0, 4.0), rows, cols);
}

using SoftmaxParam = std::tuple<DType, int64_t>;

class SoftmaxGpu : public test::GpuTest, public ::testing::WithParamInterface<SoftmaxParam> {};

TEST_P(SoftmaxGpu, ForwardMatchesReference) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    std::vector<double> xv = rng().uniform(static_cast<size_t>(rows * cols), -4.0, 4.0);
    DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
    DeviceTensor y = test::alloc(dt, {rows, cols});
    softmax(x.t, y.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(y), ref::softmax(xv, rows, cols), dt));
  }
}

TEST_P(SoftmaxGpu, BackwardMatchesReference) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    std::vector<double> yv = softmax_outputs(rng(), rows, cols);
    std::vector<double> gv = rng().uniform(static_cast<size_t>(rows * cols), -1.0, 1.0);
    DeviceTensor y = test::to_device(dt, {rows, cols}, yv);
    DeviceTensor dy = test::to_device(dt, {rows, cols}, gv);
    DeviceTensor dx = test::alloc(dt, {rows, cols});
    softmax_backward(y.t, dy.t, dx.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(dx),
                                ref::softmax_backward(yv, gv, rows, cols), dt,
                                test::softmax_backward_scale(yv, gv, rows, cols)));
  }
}

std::string softmax_name(const ::testing::TestParamInfo<SoftmaxParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_cols" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, SoftmaxGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(1, 7, 127, 128, 1000, 4096, 4097,
                                                              16384, 40000, 70000)),
                         softmax_name);

// ---- special inputs and layouts ---------------------------------------------------------

class SoftmaxLayoutGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {};

// Logits of magnitude up to 80, and rows in [40, 120]: exp(x) overflows fp32 above ~88.7,
// so only a max-subtracting kernel gets these right (and never produces inf/NaN).
TEST_P(SoftmaxLayoutGpu, LargeMagnitudeInputs) {
  const DType dt = GetParam();
  for (int64_t cols : {int64_t{7}, int64_t{1000}, int64_t{4097}, int64_t{70000}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const int64_t rows = 6;
    std::vector<double> xv;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<double> row =
          r % 2 ? rng().uniform(cols, 40.0, 120.0) : rng().uniform(cols, -80.0, 80.0);
      xv.insert(xv.end(), row.begin(), row.end());
    }
    DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
    DeviceTensor y = test::alloc(dt, {rows, cols});
    softmax(x.t, y.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(y), ref::softmax(xv, rows, cols), dt));
  }
}

// Constant rows: every output is exactly representable-ish 1/cols, none NaN.
TEST_P(SoftmaxLayoutGpu, ConstantRowsAreUniform) {
  const DType dt = GetParam();
  for (int64_t cols : {int64_t{1}, int64_t{127}, int64_t{40000}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    std::vector<double> xv(static_cast<size_t>(3 * cols), 7.5);
    DeviceTensor x = test::to_device(dt, {3, cols}, xv);
    DeviceTensor y = test::alloc(dt, {3, cols});
    softmax(x.t, y.t, stream());
    sync();
    const std::vector<double> expected(xv.size(), 1.0 / static_cast<double>(cols));
    EXPECT_TRUE(test::all_close(test::download_values(y), expected, dt));
  }
}

// x and y are slices of wider matrices (pitch > cols), at unaligned offsets; y's padding
// must stay untouched.
TEST_P(SoftmaxLayoutGpu, RowPitchedViews) {
  const DType dt = GetParam();
  for (const auto& [rows, cols, xp, yp] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{{33, 1000, 1003, 1024},
                                                                   {5, 4096, 4104, 4096 + 64},
                                                                   {3, 70000, 70001, 70016},
                                                                   {64, 100, 128, 101}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
    std::vector<double> xv = rng().uniform(static_cast<size_t>(rows * cols), -4.0, 4.0);
    DeviceTensor x = test::alloc_pitched(dt, {rows, cols}, xp, /*offset=*/1);
    test::upload_values(x, xv);
    DeviceTensor y = test::alloc_pitched(dt, {rows, cols}, yp, /*offset=*/0);
    softmax(x.t, y.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(y), ref::softmax(xv, rows, cols), dt));
    EXPECT_TRUE(test::outside_untouched(y));

    std::vector<double> yv = softmax_outputs(rng(), rows, cols);
    std::vector<double> gv = rng().uniform(static_cast<size_t>(rows * cols), -1.0, 1.0);
    DeviceTensor by = test::alloc_pitched(dt, {rows, cols}, yp, 2);
    DeviceTensor bdy = test::alloc_pitched(dt, {rows, cols}, xp, 0);
    DeviceTensor bdx = test::alloc_pitched(dt, {rows, cols}, xp, 3);
    test::upload_values(by, yv);
    test::upload_values(bdy, gv);
    softmax_backward(by.t, bdy.t, bdx.t, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(bdx),
                                ref::softmax_backward(yv, gv, rows, cols), dt,
                                test::softmax_backward_scale(yv, gv, rows, cols)));
    EXPECT_TRUE(test::outside_untouched(bdx));
  }
}

// Leading axes fold into rows.
TEST_P(SoftmaxLayoutGpu, ThreeDimensional) {
  const DType dt = GetParam();
  const Shape shape = {2, 3, 129};
  std::vector<double> xv = rng().uniform(2 * 3 * 129, -4.0, 4.0);
  DeviceTensor x = test::to_device(dt, shape, xv);
  DeviceTensor y = test::alloc(dt, shape);
  softmax(x.t, y.t, nullptr);  // legacy default stream
  EXPECT_TRUE(test::all_close(test::download_values(y), ref::softmax(xv, 6, 129), dt));
  std::vector<double> gv = rng().uniform(2 * 3 * 129, -1.0, 1.0);
  DeviceTensor dy = test::to_device(dt, shape, gv);
  DeviceTensor dx = test::alloc(dt, shape);
  std::vector<double> yq = test::download_values(y);
  softmax_backward(y.t, dy.t, dx.t, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(dx), ref::softmax_backward(yq, gv, 6, 129), dt,
                              test::softmax_backward_scale(yq, gv, 6, 129)));
}

INSTANTIATE_TEST_SUITE_P(All, SoftmaxLayoutGpu, ::testing::ValuesIn(test::kFloatDTypes),
                         test::dtype_param_name);

}  // namespace
}  // namespace tessel
