// GPU tests of tessel::reduce_sum (whole tensor) and tessel::reduce_sum_rows (last axis).
//
// Two kinds of inputs:
//  * random floats, compared with the float64 reference under tolerance(out dtype);
//    they are mean-positive (uniform in [-s, 2s]) so the sum is not a cancellation-
//    dominated tiny number, and scaled so sums fit f16;
//  * "exact" inputs, k/2 with k in +-[1, 8]: every partial sum is exact in fp32 whatever
//    the order, so the result must equal the reference bit for bit. This catches a
//    single dropped or double-counted element, which a tolerance cannot.
// Determinism: the same input twice (even on different streams) gives identical bits.
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

// Mean-positive values whose sum stays near 1000 for large n.
std::vector<double> random_inputs(test::Rng& rng, size_t n) {
  const double s = std::min(1.0, 2000.0 / static_cast<double>(n));
  return rng.uniform(n, -s, 2 * s);
}

// (x dtype, out dtype)
using ReduceParam = std::tuple<DType, DType>;

std::string reduce_name(const ::testing::TestParamInfo<ReduceParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
         dtype_name(std::get<1>(info.param));
}

const auto kReduceParams =
    ::testing::Values(ReduceParam{DType::f32, DType::f32}, ReduceParam{DType::f16, DType::f32},
                      ReduceParam{DType::bf16, DType::f32}, ReduceParam{DType::f16, DType::f16},
                      ReduceParam{DType::bf16, DType::bf16});

// ---- reduce_sum -------------------------------------------------------------------------

class ReduceSumGpu : public test::GpuTest, public ::testing::WithParamInterface<ReduceParam> {
 protected:
  // x of `shape` (starting `offset` elements into its buffer) -> one-element out.
  void run(const Shape& shape, int64_t offset, bool exact) {
    const auto [xd, od] = GetParam();
    const size_t n = static_cast<size_t>(test::numel(shape));
    SCOPED_TRACE("x " + test::shape_str(shape) + (exact ? " exact" : " random") + " offset " +
                 std::to_string(offset));
    std::vector<double> xv = exact ? rng().small_halves(n) : random_inputs(rng(), n);
    DeviceTensor x = test::alloc(xd, shape, offset);
    test::upload_values(x, xv);
    // Alternate the one-element spellings of out: () and (1,).
    DeviceTensor out = test::alloc(od, n % 2 ? Shape{} : Shape{1});
    reduce_sum(x.t, out.t, stream());
    sync();
    const double expected = ref::reduce_sum(xv);
    const std::vector<double> got = test::download_values(out);
    if (exact) {
      const double rounded = ref::quantize(test::storage(od), expected);
      EXPECT_TRUE(test::all_close(got, {rounded}, test::Tolerance{0, 0}));
    } else {
      EXPECT_TRUE(test::all_close(got, {expected}, od, test::abs_row_sums(xv, 1, n)));
    }
  }
};

TEST_P(ReduceSumGpu, MatchesReference) {
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{17, 241}, Shape{(1 << 20) + 3}}) {
    run(shape, 0, /*exact=*/false);
    run(shape, 0, /*exact=*/true);
  }
}

TEST_P(ReduceSumGpu, UnalignedInput) {
  run({4097}, 1, false);
  run({(1 << 16) + 5}, 3, true);
}

INSTANTIATE_TEST_SUITE_P(All, ReduceSumGpu, kReduceParams, reduce_name);

// ---- reduce_sum_rows --------------------------------------------------------------------

class ReduceSumRowsGpu : public test::GpuTest, public ::testing::WithParamInterface<ReduceParam> {
 protected:
  // x is `shape` (leading axes fold into rows), optionally row-pitched; out is `out_shape`.
  void run(const Shape& shape, const Shape& out_shape, int64_t pitch, bool exact) {
    const auto [xd, od] = GetParam();
    const int64_t cols = shape.back();
    const int64_t rows = test::numel(shape) / cols;
    SCOPED_TRACE("x " + test::shape_str(shape) + " pitch " + std::to_string(pitch) + " -> out " +
                 test::shape_str(out_shape) + (exact ? " exact" : " random"));
    const size_t n = static_cast<size_t>(rows * cols);
    std::vector<double> xv = exact ? rng().small_halves(n) : random_inputs(rng(), cols);
    if (!exact)  // scale per row (random_inputs sizes the values for one row's sum)
      for (int64_t r = 1; r < rows; ++r) {
        const std::vector<double> more = random_inputs(rng(), cols);
        xv.insert(xv.end(), more.begin(), more.end());
      }
    DeviceTensor x = pitch > 0 ? test::alloc_pitched(xd, shape, pitch, 1) : test::alloc(xd, shape);
    test::upload_values(x, xv);
    DeviceTensor out = test::alloc(od, out_shape);
    reduce_sum_rows(x.t, out.t, stream());
    sync();
    std::vector<double> expected = ref::reduce_sum_rows(xv, rows, cols);
    const std::vector<double> got = test::download_values(out);
    if (exact) {
      expected = ref::quantize(test::storage(od), expected);
      EXPECT_TRUE(test::all_close(got, expected, test::Tolerance{0, 0}));
    } else {
      EXPECT_TRUE(test::all_close(got, expected, od, test::abs_row_sums(xv, rows, cols)));
    }
  }
};

TEST_P(ReduceSumRowsGpu, MatchesReference) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{1, 1}, {1}},     {{7, 127}, {7}},    {{3, 4097}, {3}},      {{33, 1}, {33}},
      {{5, 70000}, {5}}, {{300, 96}, {300}}, {{2, 3, 129}, {2, 3}}, {{4097}, {}},
      {{4097}, {1}},     {{1000, 8}, {1000}}};
  for (const auto& [shape, out_shape] : cases) {
    run(shape, out_shape, 0, /*exact=*/false);
    run(shape, out_shape, 0, /*exact=*/true);
  }
}

TEST_P(ReduceSumRowsGpu, RowPitchedInput) {
  run({7, 127}, {7}, 130, false);
  run({3, 4097}, {3}, 4104, true);
  run({5, 70000}, {5}, 70003, true);
}

INSTANTIATE_TEST_SUITE_P(All, ReduceSumRowsGpu, kReduceParams, reduce_name);

// ---- determinism ------------------------------------------------------------------------

class ReduceDeterminismGpu : public test::GpuTest {};

TEST_F(ReduceDeterminismGpu, SameInputSameBits) {
  for (DType dt : test::kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // Zero-mean values: the rounding of every partial sum matters, so any run-to-run
    // change of the summation order shows in the bits.
    std::vector<double> xv = rng().uniform((1 << 20) + 3, -1.0, 1.0);
    DeviceTensor x = test::to_device(dt, {(1 << 20) + 3}, xv);
    DeviceTensor a = test::alloc(DType::f32, {});
    DeviceTensor b = test::alloc(DType::f32, {});
    reduce_sum(x.t, a.t, stream());
    sync();
    reduce_sum(x.t, b.t, nullptr);  // another stream
    TESSEL_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(test::bit_exact(test::download_bytes(a), test::download_bytes(b), 4));
    for (int rep = 0; rep < 3; ++rep) {
      test::poison(b);
      reduce_sum(x.t, b.t, stream());
      sync();
      EXPECT_TRUE(test::bit_exact(test::download_bytes(a), test::download_bytes(b), 4))
          << "repeat " << rep;
    }

    std::vector<double> rv = rng().uniform(5 * 70000, -1.0, 1.0);
    DeviceTensor xr = test::to_device(dt, {5, 70000}, rv);
    DeviceTensor ra = test::alloc(DType::f32, {5});
    DeviceTensor rb = test::alloc(DType::f32, {5});
    reduce_sum_rows(xr.t, ra.t, stream());
    sync();
    reduce_sum_rows(xr.t, rb.t, nullptr);
    TESSEL_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(test::bit_exact(test::download_bytes(ra), test::download_bytes(rb), 4));
  }
}

}  // namespace
}  // namespace tessel
