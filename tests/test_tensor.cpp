// CPU tests of the tensor view, dtypes and the owning buffer (no GPU needed).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tessel/ops.hpp"
#include "tessel/tensor.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

void* fake_ptr() { return reinterpret_cast<void*>(0x1000); }

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f8_e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::f8_e5m2), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::f8_e4m3), "f8_e4m3");
  EXPECT_STREQ(dtype_name(DType::f8_e5m2), "f8_e5m2");
  EXPECT_STREQ(dtype_name(DType::i32), "i32");
  EXPECT_STREQ(dtype_name(DType::i64), "i64");
  EXPECT_STREQ(dtype_name(DType::u8), "u8");
}

TEST(DType, MatchesCEnum) {
  EXPECT_EQ(static_cast<int>(DType::f32), TESSEL_F32);
  EXPECT_EQ(static_cast<int>(DType::f16), TESSEL_F16);
  EXPECT_EQ(static_cast<int>(DType::bf16), TESSEL_BF16);
  EXPECT_EQ(static_cast<int>(DType::f8_e4m3), TESSEL_F8_E4M3);
  EXPECT_EQ(static_cast<int>(DType::f8_e5m2), TESSEL_F8_E5M2);
  EXPECT_EQ(static_cast<int>(DType::i32), TESSEL_I32);
  EXPECT_EQ(static_cast<int>(DType::i64), TESSEL_I64);
  EXPECT_EQ(static_cast<int>(DType::u8), TESSEL_U8);
  EXPECT_EQ(kMaxDims, TESSEL_MAX_DIMS);
}

TEST(Tensor, ContiguousStrides) {
  Tensor t = Tensor::contiguous(fake_ptr(), DType::bf16, {2, 3, 4});
  EXPECT_EQ(t.data, fake_ptr());
  EXPECT_EQ(t.dtype, DType::bf16);
  ASSERT_EQ(t.ndim, 3);
  EXPECT_EQ(t.shape[0], 2);
  EXPECT_EQ(t.shape[1], 3);
  EXPECT_EQ(t.shape[2], 4);
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[1], 4);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.device.kind, DeviceKind::cuda);
  EXPECT_EQ(t.device.index, 0);
}

TEST(Tensor, ContiguousFromArrayAndDevice) {
  const int64_t shape[] = {5, 7};
  Tensor t = Tensor::contiguous(fake_ptr(), DType::i64, 2, shape, Device{DeviceKind::cpu, 0});
  EXPECT_EQ(t.strides[0], 7);
  EXPECT_EQ(t.strides[1], 1);
  EXPECT_EQ(t.device.kind, DeviceKind::cpu);
  EXPECT_EQ(t.nbytes(), 5u * 7u * 8u);
}

TEST(Tensor, NumelOfScalarAndEmpty) {
  Tensor scalar = Tensor::contiguous(fake_ptr(), DType::f32, {});
  EXPECT_EQ(scalar.ndim, 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());
  Tensor empty = Tensor::contiguous(nullptr, DType::f32, {3, 0, 5});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  // Zero-size dims do not zero the strides of the others.
  EXPECT_EQ(empty.strides[2], 1);
  EXPECT_EQ(empty.strides[1], 5);
  EXPECT_EQ(empty.strides[0], 5);
  // A zero-size tensor built by contiguous() is contiguous (it holds no element).
  EXPECT_TRUE(empty.is_contiguous());
  EXPECT_TRUE(Tensor::contiguous(nullptr, DType::f32, {3, 0}).is_contiguous());
  EXPECT_TRUE(Tensor::contiguous(nullptr, DType::f32, {0}).is_contiguous());
}

TEST(Tensor, TransposedViewIsNotContiguous) {
  Tensor t = Tensor::contiguous(fake_ptr(), DType::f32, {3, 4});
  std::swap(t.shape[0], t.shape[1]);
  std::swap(t.strides[0], t.strides[1]);  // (4, 3) with strides (1, 4)
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 12);
}

TEST(Tensor, RowPitchedAndSteppedViewsAreNotContiguous) {
  Tensor pitched = Tensor::contiguous(fake_ptr(), DType::f16, {4, 5});
  pitched.strides[0] = 8;  // rows of 5 inside rows of 8
  EXPECT_FALSE(pitched.is_contiguous());
  Tensor stepped = Tensor::contiguous(fake_ptr(), DType::f16, {6});
  stepped.strides[0] = 2;
  EXPECT_FALSE(stepped.is_contiguous());
}

TEST(Tensor, SizeOneDimsIgnoreTheirStride) {
  Tensor t = Tensor::contiguous(fake_ptr(), DType::f32, {1, 4, 1});
  t.strides[0] = 999;
  t.strides[2] = 77;
  EXPECT_TRUE(t.is_contiguous());
}

TEST(Tensor, ShapeString) {
  EXPECT_EQ(Tensor::contiguous(fake_ptr(), DType::f32, {16384, 4096}).shape_string(),
            "(16384, 4096)");
  EXPECT_EQ(Tensor::contiguous(fake_ptr(), DType::f32, {5}).shape_string(), "(5,)");
  EXPECT_EQ(Tensor::contiguous(fake_ptr(), DType::f32, {}).shape_string(), "()");
  EXPECT_EQ(Tensor::contiguous(fake_ptr(), DType::f32, {2, 0, 3}).shape_string(), "(2, 0, 3)");
}

TEST(Tensor, MaxDimsAccepted) {
  Tensor t = Tensor::contiguous(fake_ptr(), DType::u8, {1, 2, 1, 2, 1, 2, 1, 2});
  EXPECT_EQ(t.ndim, kMaxDims);
  EXPECT_EQ(t.numel(), 16);
  EXPECT_EQ(t.strides[0], 16);
  EXPECT_EQ(t.strides[7], 1);
}

TEST(Tensor, TooManyDimsThrows) {
  const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  try {
    Tensor::contiguous(fake_ptr(), DType::f32, 9, shape);
    FAIL() << "expected tessel::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("ndim"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::contiguous(fake_ptr(), DType::f32, {1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(Tensor::contiguous(fake_ptr(), DType::f32, -1, shape), Error);
}

TEST(Tensor, ErrorIsARuntimeError) {
  const Error e(TESSEL_ERROR_UNSUPPORTED, "msg");
  const std::runtime_error& base = e;
  EXPECT_STREQ(base.what(), "msg");
  EXPECT_EQ(e.code(), TESSEL_ERROR_UNSUPPORTED);
}

TEST(DeviceBuffer, EmptyBufferWorksWithoutDevice) {
  DeviceBuffer empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.bytes(), 0u);
  DeviceBuffer zero(0);
  EXPECT_EQ(zero.data(), nullptr);
  DeviceBuffer moved(std::move(zero));
  EXPECT_EQ(moved.bytes(), 0u);
  // A view that needs more bytes than the buffer holds throws before touching CUDA.
  EXPECT_THROW(empty.view(DType::f32, {1}), Error);
  Tensor v = empty.view(DType::f32, {0, 4});
  EXPECT_EQ(v.numel(), 0);
}

TEST(Runtime, CudaDeviceCountNeverThrows) {
  int n = -1;
  EXPECT_NO_THROW(n = cuda_device_count());
  EXPECT_GE(n, 0);
}

TEST(Runtime, VersionMatchesProject) {
  ASSERT_NE(version(), nullptr);
  EXPECT_FALSE(std::string(version()).empty());
}

TEST(Runtime, OpNamesAreDistinct) {
  std::set<std::string> names;
  for (UnaryOp op : test::kAllUnaryOps) {
    EXPECT_STREQ(unary_op_name(op), ref::unary_op_name(test::to_ref(op)));
    names.insert(unary_op_name(op));
  }
  for (BinaryOp op : test::kAllBinaryOps) {
    EXPECT_STREQ(binary_op_name(op), ref::binary_op_name(test::to_ref(op)));
    names.insert(binary_op_name(op));
  }
  EXPECT_EQ(names.size(), std::size(test::kAllUnaryOps) + std::size(test::kAllBinaryOps));
}

}  // namespace
}  // namespace tessel
