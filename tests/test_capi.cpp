// Tests of the C ABI (include/tessel/tessel.h): status codes, thread-local last error,
// tensor init, names; one GPU test runs tessel_add end to end.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake_tensor.hpp"
#include "tessel/launch.hpp"
#include "tessel/ops.hpp"
#include "tessel/tessel.h"
#include "tessel/tessel_gemm.h"
#include "test_util.hpp"

namespace {

using namespace tessel::fake_args;

tessel_tensor_t make(void* data, int32_t dtype, std::initializer_list<int64_t> shape) {
  tessel_tensor_t t;
  const std::vector<int64_t> dims(shape);
  EXPECT_EQ(tessel_tensor_init(&t, data, dtype, static_cast<int32_t>(dims.size()), dims.data()),
            TESSEL_OK)
      << tessel_last_error();
  return t;
}

std::string last_error() {
  const char* e = tessel_last_error();
  return e != nullptr ? e : "";
}

TEST(CApi, TensorInitBuildsContiguousCudaView) {
  tessel_tensor_t t;
  const int64_t shape[3] = {2, 3, 5};
  ASSERT_EQ(tessel_tensor_init(&t, fake(0), TESSEL_BF16, 3, shape), TESSEL_OK);
  EXPECT_EQ(t.data, fake(0));
  EXPECT_EQ(t.dtype, TESSEL_BF16);
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.shape[0], 2);
  EXPECT_EQ(t.shape[2], 5);
  EXPECT_EQ(t.strides[0], 15);
  EXPECT_EQ(t.strides[1], 5);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_EQ(t.device_kind, TESSEL_CUDA);
  EXPECT_EQ(t.device_index, 0);
  ASSERT_EQ(tessel_tensor_init(&t, fake(0), TESSEL_F32, 0, nullptr), TESSEL_OK);  // 0-D
  EXPECT_EQ(t.ndim, 0);
}

TEST(CApi, TensorInitRejectsTooManyDims) {
  tessel_tensor_t t;
  const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(tessel_tensor_init(&t, fake(0), TESSEL_F32, 9, shape), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("ndim"), std::string::npos) << last_error();
  EXPECT_EQ(tessel_tensor_init(&t, fake(0), TESSEL_F32, -1, shape), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tessel_tensor_init(&t, fake(0), TESSEL_F32, TESSEL_MAX_DIMS, shape), TESSEL_OK);
  EXPECT_EQ(tessel_tensor_init(nullptr, fake(0), TESSEL_F32, 1, shape),
            TESSEL_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, DTypeMismatchReportsStatusAndMessage) {
  const tessel_tensor_t x = make(fake(0), TESSEL_F32, {4, 8});
  const tessel_tensor_t y = make(fake(1), TESSEL_F16, {4, 8});
  EXPECT_EQ(tessel_softmax(&x, &y, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  const std::string msg = last_error();
  EXPECT_NE(msg.find("tessel::softmax"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'y'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f16"), std::string::npos) << msg;
}

TEST(CApi, EveryOpReportsInvalidArguments) {
  const tessel_tensor_t a = make(fake(0), TESSEL_F32, {4, 8});
  const tessel_tensor_t i = make(fake(1), TESSEL_I32, {4, 8});
  const tessel_tensor_t r = make(fake(2), TESSEL_F32, {3});
  struct Case {
    const char* op;
    tessel_status_t status;
  };
  const std::vector<Case> cases = {
      {"unary", tessel_unary(3, &a, &i, nullptr)},
      {"binary", tessel_binary(2, &a, &a, &i, nullptr)},
      {"binary", tessel_add(&a, &r, &a, nullptr)},
      {"binary", tessel_mul(&i, &a, &a, nullptr)},
      {"copy", tessel_copy(&a, &i, nullptr)},
      {"transpose", tessel_transpose(&a, &a, nullptr)},
      {"reduce_sum", tessel_reduce_sum(&a, &a, nullptr)},
      {"reduce_sum_rows", tessel_reduce_sum_rows(&a, &r, nullptr)},
      {"softmax_backward", tessel_softmax_backward(&a, &i, &a, nullptr)},
  };
  for (const Case& c : cases) EXPECT_EQ(c.status, TESSEL_ERROR_INVALID_ARGUMENT) << c.op;
  EXPECT_EQ(tessel_reduce_sum_rows(&a, &r, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("tessel::reduce_sum_rows"), std::string::npos) << last_error();
}

// tessel_gemm: option defaults, a_layout / b_layout through the struct (a_layout is the former
// reserved field: 0 keeps A (M, K)), and their errors naming the argument.
TEST(CApi, GemmOptionsAndLayoutErrors) {
  tessel_gemm_options_t o;
  tessel_gemm_options_init(&o);
  EXPECT_EQ(o.alpha, 1.f);
  EXPECT_EQ(o.beta, 0.f);
  EXPECT_EQ(o.b_layout, TESSEL_GEMM_B_NK);
  EXPECT_EQ(o.a_layout, TESSEL_GEMM_A_MK);
  EXPECT_EQ(o.c, nullptr);
  const tessel_tensor_t a = make(fake(0), TESSEL_BF16, {32, 16});  // (K, M) with a_layout KM
  const tessel_tensor_t b = make(fake(1), TESSEL_BF16, {24, 32});  // (N, K)
  const tessel_tensor_t d_mk = make(fake(2), TESSEL_BF16, {32, 24});
  const tessel_tensor_t d_km = make(fake(2), TESSEL_BF16, {16, 24});
  // A (M, K) = (32, 16): b's K = 32 does not match
  EXPECT_EQ(tessel_gemm(&a, &b, &d_mk, &o, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'b'"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("(a's columns)"), std::string::npos) << last_error();
  // A (K, M): K = 32 from a's rows; d must be (16, 24)
  o.a_layout = TESSEL_GEMM_A_KM;
  EXPECT_EQ(tessel_gemm(&a, &b, &d_mk, &o, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'d'"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("(16, 24)"), std::string::npos) << last_error();
  o.a_layout = 5;
  EXPECT_EQ(tessel_gemm(&a, &b, &d_km, &o, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'a_layout'"), std::string::npos) << last_error();
  o.a_layout = TESSEL_GEMM_A_KM;
  o.b_layout = 3;
  EXPECT_EQ(tessel_gemm(&a, &b, &d_km, &o, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'b_layout'"), std::string::npos) << last_error();
}

TEST(CApi, NullTensorIsAnError) {
  const tessel_tensor_t x = make(fake(0), TESSEL_F32, {4, 8});
  EXPECT_EQ(tessel_softmax(&x, nullptr, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'y'"), std::string::npos) << last_error();
  EXPECT_EQ(tessel_softmax(nullptr, &x, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, BadNdimInStructIsAnError) {
  tessel_tensor_t x = make(fake(0), TESSEL_F32, {4, 8});
  const tessel_tensor_t y = make(fake(1), TESSEL_F32, {4, 8});
  x.ndim = 12;  // must be rejected before the shape array is read past its end
  EXPECT_EQ(tessel_softmax(&x, &y, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  x.ndim = -2;
  EXPECT_EQ(tessel_softmax(&x, &y, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, DeviceKindMapsToTesselDevice) {
  tessel_tensor_t x = make(fake(0), TESSEL_F32, {4, 8});
  const tessel_tensor_t y = make(fake(1), TESSEL_F32, {4, 8});
  x.device_kind = TESSEL_CPU;  // a valid layout, but not CUDA memory: needs no GPU to reject
  EXPECT_EQ(tessel_softmax(&x, &y, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("CUDA tensor"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("'x'"), std::string::npos) << last_error();
}

TEST(CApi, ZeroSizeIsOk) {
  const tessel_tensor_t x = make(nullptr, TESSEL_BF16, {0, 8});
  const tessel_tensor_t y = make(nullptr, TESSEL_BF16, {0, 8});
  EXPECT_EQ(tessel_softmax(&x, &y, nullptr), TESSEL_OK) << last_error();
  EXPECT_EQ(tessel_add(&x, &x, &y, nullptr), TESSEL_OK) << last_error();
  EXPECT_EQ(tessel_copy(&x, &y, nullptr), TESSEL_OK) << last_error();
}

TEST(CApi, LastErrorIsThreadLocal) {
  const tessel_tensor_t x = make(fake(0), TESSEL_F32, {4, 8});
  const tessel_tensor_t y = make(fake(1), TESSEL_F16, {4, 8});
  ASSERT_EQ(tessel_softmax(&x, &y, nullptr), TESSEL_ERROR_INVALID_ARGUMENT);
  const std::string mine = last_error();
  std::string other;
  std::thread([&] {
    const tessel_tensor_t a = make(fake(0), TESSEL_F32, {4, 8});
    const tessel_tensor_t b = make(fake(1), TESSEL_F32, {5, 8});
    tessel_copy(&a, &b, nullptr);
    other = last_error();
  }).join();
  EXPECT_NE(other.find("tessel::copy"), std::string::npos) << other;
  EXPECT_EQ(last_error(), mine);
}

TEST(CApi, StatusStrings) {
  std::set<std::string> seen;
  for (tessel_status_t s :
       {TESSEL_OK, TESSEL_ERROR_INVALID_ARGUMENT, TESSEL_ERROR_UNSUPPORTED, TESSEL_ERROR_CUDA,
        TESSEL_ERROR_NO_DEVICE, TESSEL_ERROR_OUT_OF_MEMORY, TESSEL_ERROR_INTERNAL}) {
    const char* str = tessel_status_string(s);
    ASSERT_NE(str, nullptr);
    EXPECT_FALSE(std::string(str).empty()) << s;
    seen.insert(str);
  }
  EXPECT_EQ(seen.size(), 7u) << "status strings must be distinct";
  EXPECT_NE(std::string(tessel_status_string(TESSEL_ERROR_INVALID_ARGUMENT)).find("invalid"),
            std::string::npos);
  const char* unknown = tessel_status_string(static_cast<tessel_status_t>(1234));
  ASSERT_NE(unknown, nullptr);
  EXPECT_EQ(seen.count(unknown), 0u);
}

TEST(CApi, VersionAndDeviceCount) {
  ASSERT_NE(tessel_version(), nullptr);
  EXPECT_FALSE(std::string(tessel_version()).empty());
  EXPECT_STREQ(tessel_version(), tessel::version());
  EXPECT_EQ(tessel_cuda_device_count(), tessel::cuda_device_count());
}

TEST(CApi, DependentLaunchSwitch) {
  const int before = tessel_set_dependent_launch(1);
  EXPECT_TRUE(tessel::dependent_launch());
  EXPECT_EQ(tessel_set_dependent_launch(7), 1);  // any non-zero enables
  EXPECT_EQ(tessel_set_dependent_launch(0), 1);
  EXPECT_FALSE(tessel::dependent_launch());
  {
    const tessel::DependentLaunchScope on(true);
    EXPECT_TRUE(tessel::dependent_launch());
  }
  EXPECT_FALSE(tessel::dependent_launch());  // the scope restored it
  tessel_set_dependent_launch(before);
}

// ---- GPU --------------------------------------------------------------------------------

class CApiGpu : public tessel::test::GpuTest {};

TEST_F(CApiGpu, AddThroughTheCAbi) {
  using namespace tessel;
  const int64_t rows = 37, cols = 129;
  std::vector<double> av = rng().uniform(rows * cols, -3, 3);
  std::vector<double> bv = rng().uniform(cols, -3, 3);
  test::DeviceTensor a = test::to_device(DType::f32, {rows, cols}, av);
  test::DeviceTensor b = test::to_device(DType::f32, {cols}, bv);
  test::DeviceTensor out = test::alloc(DType::f32, {rows, cols});
  const tessel_tensor_t ta = make(a.t.data, TESSEL_F32, {rows, cols});
  const tessel_tensor_t tb = make(b.t.data, TESSEL_F32, {cols});
  const tessel_tensor_t to = make(out.t.data, TESSEL_F32, {rows, cols});
  ASSERT_EQ(tessel_add(&ta, &tb, &to, stream()), TESSEL_OK) << last_error();
  sync();
  EXPECT_TRUE(test::all_close(
      test::download_values(out),
      ref::binary(ref::BinaryOp::add, av, bv, rows, cols, ref::Broadcast::row), DType::f32));
  // And an error through the same path leaves the output alone.
  test::poison(out);
  const tessel_tensor_t bad = make(a.t.data, TESSEL_F32, {rows, cols + 1});
  EXPECT_EQ(tessel_add(&ta, &bad, &to, stream()), TESSEL_ERROR_INVALID_ARGUMENT);
  sync();
  const std::vector<uint8_t> img = test::download_buffer(out);
  EXPECT_TRUE(test::bit_exact(img, std::vector<uint8_t>(img.size(), 0xFF), 4));
}

TEST_F(CApiGpu, SoftmaxThroughTheCAbi) {
  using namespace tessel;
  const int64_t rows = 5, cols = 1000;
  std::vector<double> xv = rng().uniform(rows * cols, -5, 5);
  test::DeviceTensor x = test::to_device(DType::bf16, {rows, cols}, xv);
  test::DeviceTensor y = test::alloc(DType::bf16, {rows, cols});
  const tessel_tensor_t tx = make(x.t.data, TESSEL_BF16, {rows, cols});
  const tessel_tensor_t ty = make(y.t.data, TESSEL_BF16, {rows, cols});
  ASSERT_EQ(tessel_softmax(&tx, &ty, nullptr), TESSEL_OK) << last_error();
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(y), ref::softmax(xv, rows, cols), DType::bf16));
}

}  // namespace
