// GPU tests of tessel::concat and tessel::transpose_batched (bit-exact, random bytes): every
// axis of 1..4-D tensors, 1..300 inputs, ragged sizes (1, 7, 127, 4097) that force every
// access width (16/8/4/2/1 bytes), all dtypes; batched transpose of ragged (B, R, C).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tessel/shape_ops.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;
using Shape = std::vector<int64_t>;

// Byte-level concat reference.
std::vector<uint8_t> cat_bytes(const std::vector<std::vector<uint8_t>>& in,
                               const std::vector<Shape>& shapes, int ax, size_t es) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < ax; ++d) outer *= shapes[0][d];
  for (size_t d = ax + 1; d < shapes[0].size(); ++d) inner *= shapes[0][d];
  std::vector<uint8_t> out;
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < in.size(); ++i) {
      const size_t w = static_cast<size_t>(shapes[i][ax] * inner) * es;
      out.insert(out.end(), in[i].begin() + o * w, in[i].begin() + (o + 1) * w);
    }
  return out;
}

class ConcatGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {
 protected:
  void check(const Shape& base, int axis, const std::vector<int64_t>& sizes) {
    const DType dt = GetParam();
    const int nd = static_cast<int>(base.size());
    const int ax = axis < 0 ? axis + nd : axis;
    std::vector<DeviceTensor> ins;
    std::vector<Tensor> views;
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<Shape> shapes;
    Shape os = base;
    os[ax] = 0;
    for (int64_t s : sizes) {
      Shape sh = base;
      sh[ax] = s;
      os[ax] += s;
      ins.push_back(test::alloc(dt, sh));
      bytes.push_back(rng().bytes(static_cast<size_t>(test::numel(sh)), dtype_size(dt)));
      test::upload_bytes(ins.back(), bytes.back());
      shapes.push_back(sh);
    }
    for (auto& d : ins) views.push_back(d.t);
    DeviceTensor out = test::alloc(dt, os);
    concat(views.data(), views.size(), axis, out.t, stream());
    sync();
    EXPECT_TRUE(test::bit_exact(test::download_bytes(out),
                                cat_bytes(bytes, shapes, ax, dtype_size(dt)), dtype_size(dt)));
  }
};

TEST_P(ConcatGpu, EveryAxisRaggedSizes) {
  check({7}, 0, {1, 7, 127, 4097});
  check({127, 9}, 0, {1, 4097, 7});
  check({127, 9}, 1, {8, 1, 5});
  check({3, 5, 7}, -1, {1, 7, 127});
  check({3, 5, 7}, 1, {4097, 2});
  check({2, 3, 4, 16}, 2, {1, 2, 3});
  check({64, 4096}, 1, {4096, 4096, 1024});
  check({4, 33}, 0, {0, 5, 0, 2});  // empty inputs are skipped
}
TEST_P(ConcatGpu, ManyInputs) { check({3, 16}, 1, std::vector<int64_t>(300, 8)); }
// Up to 8 inputs take the output-ordered kernel, 9 the input-ordered one: both at the edge.
TEST_P(ConcatGpu, OutputOrderedEdge) {
  check({37, 5}, 1, {1, 2, 3, 4, 5, 6, 7, 8});
  check({37, 5}, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  check({4097, 3}, 0, {3, 0, 1, 7, 2, 1, 1, 1, 5});  // 8 non-empty inputs
}

INSTANTIATE_TEST_SUITE_P(DTypes, ConcatGpu,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16, DType::i64,
                                           DType::u8),
                         test::dtype_param_name);

class TransposeBatchedGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(TransposeBatchedGpu, RaggedShapes) {
  const DType dt = GetParam();
  const size_t es = dtype_size(dt);
  for (auto [b, r, c] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1},
           {3, 7, 127},
           {2, 127, 4097},
           {5, 64, 64},
           {1, 4097, 7},
           {7, 1, 300},
           // 16-byte rows (tile path): ragged against its 8V x 32V tiles
           {3, 72, 264},
           {2, 8, 8},
           {1, 520, 24},
           {9, 16, 1032}}) {
    SCOPED_TRACE(std::to_string(b) + "x" + std::to_string(r) + "x" + std::to_string(c));
    DeviceTensor src = test::alloc(dt, {b, r, c});
    DeviceTensor dst = test::alloc(dt, {b, c, r});
    const auto in = rng().bytes(static_cast<size_t>(b * r * c), es);
    test::upload_bytes(src, in);
    transpose_batched(src.t, dst.t, stream());
    sync();
    std::vector<uint8_t> want(in.size());
    for (int64_t k = 0; k < b; ++k)
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j)
          std::memcpy(&want[((k * c + j) * r + i) * es], &in[((k * r + i) * c + j) * es], es);
    EXPECT_TRUE(test::bit_exact(test::download_bytes(dst), want, es));
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, TransposeBatchedGpu,
                         ::testing::Values(DType::f32, DType::bf16, DType::i64, DType::u8),
                         test::dtype_param_name);

}  // namespace
}  // namespace tessel
