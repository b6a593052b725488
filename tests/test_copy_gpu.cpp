// GPU tests of tessel::copy (every dtype, dense and strided sources/destinations) and
// tessel::transpose (f32/f16/bf16, contiguous and row-pitched sources). Data movement is
// bit-exact: inputs are random bytes (never the all-0xFF poison pattern), outputs start
// poisoned and are compared byte for byte; bytes outside an output view must stay poisoned.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "tessel/ops.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;
using Shape = std::vector<int64_t>;

// ---- copy -------------------------------------------------------------------------------

class CopyGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {
 protected:
  // Random elements into `src` (any view), copy to `dst` (any view), check dst bit-exact and
  // the rest of dst's buffer untouched.
  void check_copy(const DeviceTensor& src, DeviceTensor& dst) {
    const DType dt = src.t.dtype;
    const std::vector<uint8_t> data =
        rng().bytes(static_cast<size_t>(src.t.numel()), dtype_size(dt));
    test::upload_bytes(src, data);
    copy(src.t, dst.t, stream());
    sync();
    EXPECT_TRUE(test::bit_exact(test::download_bytes(dst), data, dtype_size(dt)));
    EXPECT_TRUE(test::outside_untouched(dst));
  }
};

TEST_P(CopyGpu, ContiguousBitExact) {
  const DType dt = GetParam();
  for (const Shape& shape : {Shape{1}, Shape{}, Shape{7}, Shape{3, 5}, Shape{4097}, Shape{3, 4097},
                             Shape{2, 3, 4, 5}, Shape{(1 << 18) + 3}}) {
    SCOPED_TRACE("shape " + test::shape_str(shape));
    DeviceTensor src = test::alloc(dt, shape);
    DeviceTensor dst = test::alloc(dt, shape);
    check_copy(src, dst);
  }
}

// Views starting a few elements into their buffers: not 16-byte aligned, so the copy
// cannot use full vectors from the start.
TEST_P(CopyGpu, ContiguousUnalignedBitExact) {
  const DType dt = GetParam();
  for (const auto& [shape, so, d_o] : std::vector<std::tuple<Shape, int64_t, int64_t>>{
           {{4097}, 1, 3}, {{3, 1001}, 3, 0}, {{33}, 0, 5}, {{1 << 16}, 7, 1}}) {
    SCOPED_TRACE("shape " + test::shape_str(shape) + " offsets " + std::to_string(so) + "/" +
                 std::to_string(d_o));
    DeviceTensor src = test::alloc(dt, shape, so);
    DeviceTensor dst = test::alloc(dt, shape, d_o);
    check_copy(src, dst);
  }
}

// src(r, c) reads buf[c * R + r]: a transposed view of a (C, R) buffer.
TEST_P(CopyGpu, TransposedSourceBitExact) {
  const DType dt = GetParam();
  for (const Shape& shape : {Shape{1, 1}, Shape{7, 3}, Shape{33, 1000}, Shape{1000, 33}}) {
    SCOPED_TRACE("shape " + test::shape_str(shape));
    DeviceTensor src = test::alloc_view(dt, shape, {1, shape[0]});
    DeviceTensor dst = test::alloc(dt, shape);
    check_copy(src, dst);
  }
}

// A (R, C) slice of a wider (R, P) matrix starting at column `o`, into a dense dst.
TEST_P(CopyGpu, RowPitchedSliceBitExact) {
  const DType dt = GetParam();
  for (const auto& [shape, pitch, o] : std::vector<std::tuple<Shape, int64_t, int64_t>>{
           {{5, 7}, 16, 3}, {{127, 129}, 256, 64}, {{33, 4097}, 4100, 1}, {{2, 3, 60}, 64, 0}}) {
    SCOPED_TRACE("shape " + test::shape_str(shape) + " pitch " + std::to_string(pitch));
    DeviceTensor src = test::alloc_pitched(dt, shape, pitch, o);
    DeviceTensor dst = test::alloc(dt, shape);
    check_copy(src, dst);
  }
}

// Both sides strided: the destination's padding must stay untouched.
TEST_P(CopyGpu, BothStridedBitExact) {
  const DType dt = GetParam();
  const Shape shape = {31, 257};
  {
    SCOPED_TRACE("pitched -> pitched");
    DeviceTensor src = test::alloc_pitched(dt, shape, 300, 5);
    DeviceTensor dst = test::alloc_pitched(dt, shape, 260, 1);
    check_copy(src, dst);
  }
  {
    SCOPED_TRACE("transposed -> pitched");
    DeviceTensor src = test::alloc_view(dt, shape, {1, shape[0]});
    DeviceTensor dst = test::alloc_pitched(dt, shape, 264, 0);
    check_copy(src, dst);
  }
}

// A permuted 3-D view: src(b, a, c) = buf[a][b][c] of an (A, B, C) buffer.
TEST_P(CopyGpu, Permuted3DSourceBitExact) {
  const DType dt = GetParam();
  const int64_t A = 5, B = 6, C = 37;
  DeviceTensor src = test::alloc_view(dt, {B, A, C}, {C, B * C, 1});
  DeviceTensor dst = test::alloc(dt, {B, A, C});
  check_copy(src, dst);
}

INSTANTIATE_TEST_SUITE_P(All, CopyGpu, ::testing::ValuesIn(test::kAllDTypes),
                         test::dtype_param_name);

// ---- transpose --------------------------------------------------------------------------

using TransposeParam = std::tuple<DType, Shape>;

class TransposeGpu : public test::GpuTest, public ::testing::WithParamInterface<TransposeParam> {
 protected:
  // Random src (R, C) view (possibly pitched) -> dst (C, R), checked against a host
  // transpose of the same bytes.
  void check_transpose(const DeviceTensor& src) {
    const DType dt = src.t.dtype;
    const size_t es = dtype_size(dt);
    const int64_t R = src.t.shape[0], C = src.t.shape[1];
    const std::vector<uint8_t> data = rng().bytes(static_cast<size_t>(R * C), es);
    test::upload_bytes(src, data);
    DeviceTensor dst = test::alloc(dt, {C, R});
    transpose(src.t, dst.t, stream());
    sync();
    std::vector<uint8_t> expected(data.size());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(&expected[(c * R + r) * es], &data[(r * C + c) * es], es);
    EXPECT_TRUE(test::bit_exact(test::download_bytes(dst), expected, es));
  }
};

TEST_P(TransposeGpu, ContiguousBitExact) {
  const auto& [dt, shape] = GetParam();
  check_transpose(test::alloc(dt, shape));
}

// The source is a slice of a wider matrix (pitch > cols), starting `offset` elements in.
TEST_P(TransposeGpu, RowPitchedSourceBitExact) {
  const auto& [dt, shape] = GetParam();
  const int64_t pitch = shape[1] + 5;
  check_transpose(test::alloc_pitched(dt, shape, pitch, /*offset=*/2));
}

// 16-byte aligned rows (pitch a multiple of 8 elements, dst rows R a multiple of 8) with
// ragged cols: the vectorized tile path with partial tiles at the right and bottom edges.
class TransposeAlignedGpu : public TransposeGpu {};

TEST_P(TransposeAlignedGpu, RaggedEdgesBitExact) {
  const auto& [dt, shape] = GetParam();
  const int64_t pitch = (shape[1] + 7) / 8 * 8 + 8;
  check_transpose(test::alloc_pitched(dt, shape, pitch, /*offset=*/0));
}

std::string transpose_name(const ::testing::TestParamInfo<TransposeParam>& info) {
  const Shape& s = std::get<1>(info.param);
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + std::to_string(s[0]) + "x" +
         std::to_string(s[1]);
}

INSTANTIATE_TEST_SUITE_P(All, TransposeGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(Shape{1, 1}, Shape{7, 3},
                                                              Shape{127, 4097}, Shape{4097, 129},
                                                              Shape{64, 64}, Shape{1000, 8})),
                         transpose_name);

INSTANTIATE_TEST_SUITE_P(All, TransposeAlignedGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(Shape{8, 3}, Shape{72, 37},
                                                              Shape{40, 1001}, Shape{136, 200})),
                         transpose_name);

}  // namespace
}  // namespace tessel
