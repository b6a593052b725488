// Argument validation of every op in ops.hpp.
//
// Validation runs in the order dtype -> rank/shape -> strides -> (empty: return) -> device
// pointers, all before any CUDA call, so the CPU tests below use fake, never dereferenced
// device pointers and need no GPU. Every failure must be a tessel::Error with code
// TESSEL_ERROR_INVALID_ARGUMENT whose message names the op ("tessel::softmax"), the
// argument ('y') and says what was expected and what it got.
//
// Tensors marked as CPU memory are rejected by the device-pointer check, which needs no
// GPU either: a call that fails there ("CUDA tensor") has passed every dtype, shape and
// stride check, which is how the *Accepted tests prove valid layouts are not rejected.
//
// The suite ErrorsGpu needs a GPU: host and misaligned pointers, and outputs left
// untouched by a failing call.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "tessel/ops.hpp"
#include "tessel/tensor.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_error;
using tessel::test::expect_invalid;

Tensor with_ndim(Tensor t, int ndim) {
  t.ndim = ndim;
  return t;
}

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32;

#define EXPECT_INVALID(stmt, op, arg, ...)                             \
  do {                                                                 \
    SCOPED_TRACE(#stmt);                                               \
    expect_invalid([&] { stmt; }, op, arg __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

// The call passed all layout checks and stopped at the device check of a CPU-marked tensor.
#define EXPECT_LAYOUT_ACCEPTED(stmt, op, arg) EXPECT_INVALID(stmt, op, arg, "CUDA tensor")

#define EXPECT_NOOP(stmt)  \
  do {                     \
    SCOPED_TRACE(#stmt);   \
    EXPECT_NO_THROW(stmt); \
  } while (0)

// ---- softmax ----------------------------------------------------------------------------

TEST(Errors, SoftmaxDType) {
  Tensor y = T(f32, {4, 8}, 1);
  EXPECT_INVALID(softmax(T(i32, {4, 8}), y, nullptr), "softmax", "x", "i32");
  Tensor yi = T(i32, {4, 8}, 1);
  EXPECT_INVALID(softmax(T(f32, {4, 8}), yi, nullptr), "softmax", "y");
  Tensor yh = T(f16, {4, 8}, 1);
  EXPECT_INVALID(softmax(T(f32, {4, 8}), yh, nullptr), "softmax", "y", "f16");
  Tensor y8 = T(DType::f8_e4m3, {4, 8}, 1);
  EXPECT_INVALID(softmax(T(DType::f8_e4m3, {4, 8}), y8, nullptr), "softmax", "x");
  Tensor bad = T(f32, {4, 8});
  bad.dtype = static_cast<DType>(42);
  EXPECT_INVALID(softmax(bad, y, nullptr), "softmax", "x");
}

TEST(Errors, SoftmaxShape) {
  Tensor y = T(f32, {4, 9}, 1);
  EXPECT_INVALID(softmax(T(f32, {4, 8}), y, nullptr), "softmax", "y", "(4, 9)");
  Tensor y3 = T(f32, {1, 4, 8}, 1);
  EXPECT_INVALID(softmax(T(f32, {4, 8}), y3, nullptr), "softmax", "y");
  Tensor y0 = T(f32, {}, 1);
  EXPECT_INVALID(softmax(T(f32, {}), y0, nullptr), "softmax", "x");  // needs >= 1 axis
  Tensor yn = T(f32, {4, 8}, 1);
  EXPECT_INVALID(softmax(with_ndim(T(f32, {4, 8}), 9), yn, nullptr), "softmax", "x");
  EXPECT_INVALID(softmax(with_ndim(T(f32, {4, 8}), -1), yn, nullptr), "softmax", "x");
  Tensor neg = T(f32, {4, 8});
  neg.shape[0] = -4;
  EXPECT_INVALID(softmax(neg, yn, nullptr), "softmax", "x");
}

TEST(Errors, SoftmaxStrides) {
  Tensor y = T(f32, {4, 8}, 1);
  // Last axis not unit-stride.
  EXPECT_INVALID(softmax(S(f32, {4, 8}, {16, 2}), y, nullptr), "softmax", "x");
  EXPECT_INVALID(softmax(S(f32, {4, 8}, {1, 4}), y, nullptr), "softmax", "x");  // transposed
  Tensor ys = S(f32, {4, 8}, {16, 2}, 1);
  EXPECT_INVALID(softmax(T(f32, {4, 8}), ys, nullptr), "softmax", "y");
  // Rows overlapping (pitch < cols).
  EXPECT_INVALID(softmax(S(f32, {4, 8}, {4, 1}), y, nullptr), "softmax", "x");
  // Leading axes that do not collapse into one row pitch.
  Tensor y3 = T(f32, {2, 3, 8}, 1);
  EXPECT_INVALID(softmax(S(f32, {2, 3, 8}, {100, 8, 1}), y3, nullptr), "softmax", "x");
}

TEST(Errors, SoftmaxAcceptsRowPitchedViews) {
  Tensor y = on_cpu(S(f32, {4, 8}, {12, 1}, 1));
  EXPECT_LAYOUT_ACCEPTED(softmax(on_cpu(S(f32, {4, 8}, {16, 1})), y, nullptr), "softmax", "x");
  Tensor y3 = on_cpu(T(bf16, {2, 3, 8}, 1));
  EXPECT_LAYOUT_ACCEPTED(softmax(on_cpu(S(bf16, {2, 3, 8}, {48, 16, 1})), y3, nullptr), "softmax",
                         "x");
}

TEST(Errors, SoftmaxZeroSizeIsNoop) {
  float host[4] = {1, 2, 3, 4};
  Tensor y = Tensor::contiguous(nullptr, f32, {0, 8});
  EXPECT_NOOP(softmax(Tensor::contiguous(nullptr, f32, {0, 8}), y, nullptr));
  Tensor y2 = Tensor::contiguous(host, f32, {4, 0});
  EXPECT_NOOP(softmax(Tensor::contiguous(host, f32, {4, 0}), y2, nullptr));
  Tensor y3 = on_cpu(Tensor::contiguous(host, bf16, {2, 0, 3}));
  EXPECT_NOOP(softmax(on_cpu(Tensor::contiguous(host, bf16, {2, 0, 3})), y3, nullptr));
  EXPECT_EQ(host[0], 1.0f);
}

TEST(Errors, SoftmaxBackward) {
  Tensor dx = T(f32, {4, 8}, 2);
  EXPECT_INVALID(softmax_backward(T(i32, {4, 8}), T(f32, {4, 8}, 1), dx, nullptr),
                 "softmax_backward", "y");
  EXPECT_INVALID(softmax_backward(T(f32, {4, 8}), T(bf16, {4, 8}, 1), dx, nullptr),
                 "softmax_backward", "dy");
  Tensor dxh = T(f16, {4, 8}, 2);
  EXPECT_INVALID(softmax_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), dxh, nullptr),
                 "softmax_backward", "dx");
  EXPECT_INVALID(softmax_backward(T(f32, {4, 8}), T(f32, {4, 7}, 1), dx, nullptr),
                 "softmax_backward", "dy");
  Tensor dx2 = T(f32, {8, 4}, 2);
  EXPECT_INVALID(softmax_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), dx2, nullptr),
                 "softmax_backward", "dx");
  Tensor dxs = S(f32, {4, 8}, {16, 2}, 2);
  EXPECT_INVALID(softmax_backward(T(f32, {4, 8}), T(f32, {4, 8}, 1), dxs, nullptr),
                 "softmax_backward", "dx");
  EXPECT_INVALID(softmax_backward(with_ndim(T(f32, {4, 8}), 9), T(f32, {4, 8}, 1), dx, nullptr),
                 "softmax_backward", "y");
  Tensor empty = Tensor::contiguous(nullptr, f16, {0, 8});
  EXPECT_NOOP(softmax_backward(Tensor::contiguous(nullptr, f16, {0, 8}),
                               Tensor::contiguous(nullptr, f16, {0, 8}), empty, nullptr));
}

// ---- element-wise -----------------------------------------------------------------------

TEST(Errors, UnaryDTypeShapeStrides) {
  const UnaryOp op = UnaryOp::exp;
  Tensor y = T(f32, {4, 8}, 1);
  EXPECT_INVALID(unary(op, T(i32, {4, 8}), y, nullptr), "unary", "x", "i32");
  Tensor yi = T(DType::i64, {4, 8}, 1);
  EXPECT_INVALID(unary(op, T(f32, {4, 8}), yi, nullptr), "unary", "y");
  Tensor yh = T(bf16, {4, 8}, 1);
  EXPECT_INVALID(unary(op, T(f32, {4, 8}), yh, nullptr), "unary", "y", "bf16");
  Tensor ys = T(f32, {32}, 1);
  EXPECT_INVALID(unary(op, T(f32, {4, 8}), ys, nullptr), "unary", "y");
  EXPECT_INVALID(unary(op, S(f32, {4, 8}, {1, 4}), y, nullptr), "unary", "x", "strides");
  Tensor yt = S(f32, {4, 8}, {16, 1}, 1);
  EXPECT_INVALID(unary(op, T(f32, {4, 8}), yt, nullptr), "unary", "y");
  EXPECT_INVALID(unary(op, with_ndim(T(f32, {4, 8}), 9), y, nullptr), "unary", "x");
  EXPECT_INVALID(unary(static_cast<UnaryOp>(99), T(f32, {4, 8}), y, nullptr), "unary", "op");
}

TEST(Errors, UnaryZeroSizeIsNoop) {
  for (UnaryOp op : test::kAllUnaryOps) {
    Tensor y = Tensor::contiguous(nullptr, bf16, {0});
    EXPECT_NOOP(unary(op, Tensor::contiguous(nullptr, bf16, {0}), y, nullptr));
  }
  Tensor y = Tensor::contiguous(nullptr, f32, {3, 0});
  EXPECT_NOOP(unary(UnaryOp::relu, Tensor::contiguous(nullptr, f32, {3, 0}), y, nullptr));
}

TEST(Errors, BinaryDTypeShapeStrides) {
  const BinaryOp op = BinaryOp::sub;
  Tensor out = T(f32, {4, 5}, 2);
  EXPECT_INVALID(binary(op, T(i32, {4, 5}), T(i32, {4, 5}, 1), out, nullptr), "binary", "a");
  EXPECT_INVALID(binary(op, T(f32, {4, 5}), T(f16, {4, 5}, 1), out, nullptr), "binary", "b");
  Tensor outh = T(f16, {4, 5}, 2);
  EXPECT_INVALID(binary(op, T(f32, {4, 5}), T(f32, {4, 5}, 1), outh, nullptr), "binary", "out");
  Tensor out2 = T(f32, {5, 4}, 2);
  EXPECT_INVALID(binary(op, T(f32, {4, 5}), T(f32, {4, 5}, 1), out2, nullptr), "binary", "out");
  EXPECT_INVALID(add(S(f32, {4, 5}, {1, 4}), T(f32, {4, 5}, 1), out, nullptr), "binary", "a");
  EXPECT_INVALID(mul(T(f32, {4, 5}), S(f32, {4, 5}, {10, 2}, 1), out, nullptr), "binary", "b");
  Tensor outs = S(f32, {4, 5}, {8, 1}, 2);
  EXPECT_INVALID(add(T(f32, {4, 5}), T(f32, {4, 5}, 1), outs, nullptr), "binary", "out");
  EXPECT_INVALID(add(with_ndim(T(f32, {4, 5}), 9), T(f32, {4, 5}, 1), out, nullptr), "binary", "a");
  EXPECT_INVALID(binary(static_cast<BinaryOp>(-1), T(f32, {4, 5}), T(f32, {4, 5}, 1), out, nullptr),
                 "binary", "op");
}

TEST(Errors, BinaryBadBroadcast) {
  Tensor out = T(f32, {4, 5}, 2);
  // Not a's shape, not a row vector over the last axis, not one element.
  for (auto shape : std::vector<std::vector<int64_t>>{
           {4}, {2, 5}, {5, 1}, {4, 1}, {3, 4, 5}, {1, 4, 5}, {6}, {0}}) {
    Tensor b = Tensor::contiguous(fake(1), f32, static_cast<int>(shape.size()), shape.data());
    EXPECT_INVALID(add(T(f32, {4, 5}), b, out, nullptr), "binary", "b", test::shape_str(shape));
  }
}

TEST(Errors, BinaryAcceptsBroadcastShapes) {
  Tensor out = on_cpu(T(f16, {2, 4, 5}, 2));
  for (auto shape : std::vector<std::vector<int64_t>>{
           {2, 4, 5}, {5}, {1, 5}, {1, 1, 5}, {1}, {}, {1, 1}, {1, 1, 1}}) {
    Tensor b =
        on_cpu(Tensor::contiguous(fake(1), f16, static_cast<int>(shape.size()), shape.data()));
    EXPECT_LAYOUT_ACCEPTED(add(on_cpu(T(f16, {2, 4, 5})), b, out, nullptr), "binary", "a");
  }
}

TEST(Errors, BinaryZeroSizeIsNoop) {
  for (BinaryOp op : test::kAllBinaryOps) {
    Tensor out = Tensor::contiguous(nullptr, f16, {0, 5});
    EXPECT_NOOP(binary(op, Tensor::contiguous(nullptr, f16, {0, 5}),
                       Tensor::contiguous(nullptr, f16, {5}), out, nullptr));
    EXPECT_NOOP(binary(op, Tensor::contiguous(nullptr, f16, {0, 5}),
                       Tensor::contiguous(nullptr, f16, {0, 5}), out, nullptr));
  }
}

// ---- copy / transpose -------------------------------------------------------------------

TEST(Errors, Copy) {
  Tensor dst = T(f32, {4, 8}, 1);
  EXPECT_INVALID(copy(T(i32, {4, 8}), dst, nullptr), "copy", "dst");  // dtypes differ
  Tensor dst2 = T(f32, {8, 4}, 1);
  EXPECT_INVALID(copy(T(f32, {4, 8}), dst2, nullptr), "copy", "dst");
  Tensor dst3 = T(f32, {32}, 1);
  EXPECT_INVALID(copy(T(f32, {4, 8}), dst3, nullptr), "copy", "dst");
  EXPECT_INVALID(copy(with_ndim(T(f32, {4, 8}), 9), dst, nullptr), "copy", "src");
  Tensor bad = T(f32, {4, 8});
  bad.dtype = static_cast<DType>(-3);
  EXPECT_INVALID(copy(bad, dst, nullptr), "copy", "src");
  Tensor neg = T(f32, {4, 8});
  neg.shape[1] = -8;
  EXPECT_INVALID(copy(neg, dst, nullptr), "copy", "src");
}

TEST(Errors, CopyAcceptsAnyDTypeAndStrides) {
  for (DType dt : test::kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor dst = on_cpu(T(dt, {4, 8}, 1));
    EXPECT_LAYOUT_ACCEPTED(copy(on_cpu(S(dt, {4, 8}, {1, 4})), dst, nullptr), "copy", "src");
    Tensor dsts = on_cpu(S(dt, {4, 8}, {16, 1}, 1));
    EXPECT_LAYOUT_ACCEPTED(copy(on_cpu(S(dt, {4, 8}, {10, 1})), dsts, nullptr), "copy", "src");
  }
}

TEST(Errors, CopyZeroSizeIsNoop) {
  for (DType dt : test::kAllDTypes) {
    Tensor dst = Tensor::contiguous(nullptr, dt, {3, 0});
    EXPECT_NOOP(copy(Tensor::contiguous(nullptr, dt, {3, 0}), dst, nullptr));
  }
}

TEST(Errors, Transpose) {
  Tensor dst = T(f32, {8, 4}, 1);
  EXPECT_INVALID(transpose(T(f32, {2, 4, 8}), dst, nullptr), "transpose", "src", "2-D");
  EXPECT_INVALID(transpose(T(f32, {32}), dst, nullptr), "transpose", "src");
  Tensor dst3 = T(f32, {8, 4, 1}, 1);
  EXPECT_INVALID(transpose(T(f32, {4, 8}), dst3, nullptr), "transpose", "dst");
  Tensor same = T(f32, {4, 8}, 1);  // not transposed
  EXPECT_INVALID(transpose(T(f32, {4, 8}), same, nullptr), "transpose", "dst", "(8, 4)");
  Tensor dsth = T(f16, {8, 4}, 1);
  EXPECT_INVALID(transpose(T(f32, {4, 8}), dsth, nullptr), "transpose", "dst");
  // src rows must be unit-stride (a row pitch is fine, see below).
  EXPECT_INVALID(transpose(S(f32, {4, 8}, {1, 4}), dst, nullptr), "transpose", "src");
  EXPECT_INVALID(transpose(S(f32, {4, 8}, {16, 2}), dst, nullptr), "transpose", "src");
  Tensor dsts = S(f32, {8, 4}, {8, 2}, 1);
  EXPECT_INVALID(transpose(T(f32, {4, 8}), dsts, nullptr), "transpose", "dst");
  EXPECT_INVALID(transpose(with_ndim(T(f32, {4, 8}), 9), dst, nullptr), "transpose", "src");
}

TEST(Errors, TransposeAcceptsRowPitchedSource) {
  Tensor dst = on_cpu(T(bf16, {8, 4}, 1));
  EXPECT_LAYOUT_ACCEPTED(transpose(on_cpu(S(bf16, {4, 8}, {24, 1})), dst, nullptr), "transpose",
                         "src");
}

TEST(Errors, TransposeZeroSizeIsNoop) {
  Tensor dst = Tensor::contiguous(nullptr, f32, {5, 0});
  EXPECT_NOOP(transpose(Tensor::contiguous(nullptr, f32, {0, 5}), dst, nullptr));
  Tensor dst2 = Tensor::contiguous(nullptr, bf16, {0, 3});
  EXPECT_NOOP(transpose(Tensor::contiguous(nullptr, bf16, {3, 0}), dst2, nullptr));
}

// ---- reductions -------------------------------------------------------------------------

TEST(Errors, ReduceSum) {
  Tensor out = T(f32, {}, 1);
  EXPECT_INVALID(reduce_sum(T(i32, {100}), out, nullptr), "reduce_sum", "x", "i32");
  Tensor outi = T(i32, {}, 1);
  EXPECT_INVALID(reduce_sum(T(f32, {100}), outi, nullptr), "reduce_sum", "out");
  Tensor outh = T(f16, {}, 1);  // neither f32 nor x's dtype
  EXPECT_INVALID(reduce_sum(T(bf16, {100}), outh, nullptr), "reduce_sum", "out", "f16");
  Tensor out2 = T(f32, {2}, 1);
  EXPECT_INVALID(reduce_sum(T(f32, {100}), out2, nullptr), "reduce_sum", "out", "one element");
  Tensor out0 = T(f32, {0}, 1);
  EXPECT_INVALID(reduce_sum(T(f32, {100}), out0, nullptr), "reduce_sum", "out");
  Tensor out11 = T(f32, {1, 2}, 1);
  EXPECT_INVALID(reduce_sum(T(f32, {100}), out11, nullptr), "reduce_sum", "out");
  EXPECT_INVALID(reduce_sum(S(f32, {10, 10}, {1, 10}), out, nullptr), "reduce_sum", "x");
  EXPECT_INVALID(reduce_sum(with_ndim(T(f32, {100}), 9), out, nullptr), "reduce_sum", "x");
}

TEST(Errors, ReduceSumAcceptsOneElementOutputs) {
  for (auto shape : std::vector<std::vector<int64_t>>{{}, {1}, {1, 1}}) {
    for (DType od : {f32, bf16}) {
      Tensor out =
          on_cpu(Tensor::contiguous(fake(1), od, static_cast<int>(shape.size()), shape.data()));
      EXPECT_LAYOUT_ACCEPTED(reduce_sum(on_cpu(T(bf16, {3, 100})), out, nullptr), "reduce_sum",
                             "x");
    }
  }
}

TEST(Errors, ReduceSumRows) {
  Tensor out = T(f32, {4}, 1);
  EXPECT_INVALID(reduce_sum_rows(T(i32, {4, 5}), out, nullptr), "reduce_sum_rows", "x");
  Tensor outh = T(f16, {4}, 1);
  EXPECT_INVALID(reduce_sum_rows(T(bf16, {4, 5}), outh, nullptr), "reduce_sum_rows", "out");
  for (auto shape : std::vector<std::vector<int64_t>>{{5}, {4, 5}, {1}, {}, {2, 2}, {1, 4}}) {
    Tensor o = Tensor::contiguous(fake(1), f32, static_cast<int>(shape.size()), shape.data());
    EXPECT_INVALID(reduce_sum_rows(T(f32, {4, 5}), o, nullptr), "reduce_sum_rows", "out",
                   test::shape_str(shape));
  }
  Tensor o0 = T(f32, {}, 1);
  EXPECT_INVALID(reduce_sum_rows(T(f32, {}), o0, nullptr), "reduce_sum_rows", "x");
  EXPECT_INVALID(reduce_sum_rows(S(f32, {4, 5}, {1, 4}), out, nullptr), "reduce_sum_rows", "x");
  EXPECT_INVALID(reduce_sum_rows(S(f32, {4, 5}, {10, 2}), out, nullptr), "reduce_sum_rows", "x");
  Tensor outs = S(f32, {4}, {2}, 1);
  EXPECT_INVALID(reduce_sum_rows(T(f32, {4, 5}), outs, nullptr), "reduce_sum_rows", "out");
  EXPECT_INVALID(reduce_sum_rows(with_ndim(T(f32, {4, 5}), 9), out, nullptr), "reduce_sum_rows",
                 "x");
}

TEST(Errors, ReduceSumRowsAcceptsLeadingShapes) {
  Tensor o1 = on_cpu(T(f32, {2, 3}, 1));
  EXPECT_LAYOUT_ACCEPTED(reduce_sum_rows(on_cpu(T(f16, {2, 3, 5})), o1, nullptr), "reduce_sum_rows",
                         "x");
  Tensor o2 = on_cpu(T(f16, {}, 1));  // 1-D x: 0-D out ...
  EXPECT_LAYOUT_ACCEPTED(reduce_sum_rows(on_cpu(T(f16, {5})), o2, nullptr), "reduce_sum_rows", "x");
  Tensor o3 = on_cpu(T(f32, {1}, 1));  // ... or shape (1,)
  EXPECT_LAYOUT_ACCEPTED(reduce_sum_rows(on_cpu(T(f16, {5})), o3, nullptr), "reduce_sum_rows", "x");
  Tensor o4 = on_cpu(T(f32, {4}, 1));  // row-pitched x
  EXPECT_LAYOUT_ACCEPTED(reduce_sum_rows(on_cpu(S(f32, {4, 5}, {8, 1})), o4, nullptr),
                         "reduce_sum_rows", "x");
}

TEST(Errors, ReductionsZeroSizeAreNoops) {
  Tensor out = Tensor::contiguous(nullptr, f32, {});
  EXPECT_NOOP(reduce_sum(Tensor::contiguous(nullptr, f32, {0}), out, nullptr));
  Tensor outr = Tensor::contiguous(nullptr, f32, {0});
  EXPECT_NOOP(reduce_sum_rows(Tensor::contiguous(nullptr, bf16, {0, 5}), outr, nullptr));
  Tensor outr2 = Tensor::contiguous(nullptr, f32, {2, 0});
  EXPECT_NOOP(reduce_sum_rows(Tensor::contiguous(nullptr, f16, {2, 0, 7}), outr2, nullptr));
}

// Non-empty tensors marked as CPU memory are rejected even though their layout is valid.
TEST(Errors, CpuTensorsRejected) {
  Tensor y = T(f32, {4, 8}, 1);
  EXPECT_INVALID(softmax(on_cpu(T(f32, {4, 8})), y, nullptr), "softmax", "x", "CUDA tensor");
  Tensor yc = on_cpu(T(f32, {4, 8}, 1));
  Tensor x = T(f32, {4, 8});
  x.data = nullptr;  // the null check comes after the device-kind check
  EXPECT_INVALID(softmax(on_cpu(x), yc, nullptr), "softmax", "x");
}

// ---- GPU: pointer checks ----------------------------------------------------------------

class ErrorsGpu : public test::GpuTest {};

// Every op, given one host input, fails naming "host pointer" and writes nothing.
TEST_F(ErrorsGpu, HostPointerRejectedAndOutputUntouched) {
  const int64_t rows = 4, cols = 8;
  std::vector<float> host(rows * cols, 1.0f);  // pageable (malloc'd) memory
  const Tensor hx = Tensor::contiguous(host.data(), f32, {rows, cols});
  std::vector<double> vals = rng().uniform(rows * cols, -1, 1);
  test::DeviceTensor dx = test::to_device(f32, {rows, cols}, vals);
  test::DeviceTensor out = test::alloc(f32, {rows, cols});
  test::DeviceTensor out_t = test::alloc(f32, {cols, rows});
  test::DeviceTensor out_r = test::alloc(f32, {rows});
  test::DeviceTensor out_s = test::alloc(f32, {});
  const std::vector<uint8_t> poisoned(rows * cols * 4, 0xFF);

  struct Case {
    const char* op;
    const char* arg;
    std::function<void()> call;
    test::DeviceTensor* out;
  };
  const std::vector<Case> cases = {
      {"softmax", "x", [&] { softmax(hx, out.t, stream()); }, &out},
      {"softmax", "y",
       [&] {
         Tensor y = hx;
         softmax(dx.t, y, stream());
       },
       nullptr},
      {"softmax_backward", "dy", [&] { softmax_backward(dx.t, hx, out.t, stream()); }, &out},
      {"unary", "x", [&] { unary(UnaryOp::exp, hx, out.t, stream()); }, &out},
      {"binary", "b", [&] { add(dx.t, hx, out.t, stream()); }, &out},
      {"copy", "src", [&] { copy(hx, out.t, stream()); }, &out},
      {"transpose", "src", [&] { transpose(hx, out_t.t, stream()); }, &out_t},
      {"reduce_sum", "x", [&] { reduce_sum(hx, out_s.t, stream()); }, &out_s},
      {"reduce_sum_rows", "x", [&] { reduce_sum_rows(hx, out_r.t, stream()); }, &out_r},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.op) + " '" + c.arg + "'");
    expect_invalid(c.call, c.op, c.arg, "host pointer");
    sync();
    if (c.out != nullptr) {
      const std::vector<uint8_t> img = test::download_buffer(*c.out);
      EXPECT_TRUE(test::bit_exact(img, std::vector<uint8_t>(img.size(), 0xFF), 4))
          << "output written by a failing call";
    }
  }
  for (float v : host) ASSERT_EQ(v, 1.0f) << "host output written by a failing call";
}

TEST_F(ErrorsGpu, PinnedHostPointerRejected) {
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64 * sizeof(float)), cudaSuccess);
  test::DeviceTensor y = test::alloc(f32, {8, 8});
  expect_invalid(
      [&] {
        softmax(Tensor::contiguous(pinned, f32, {8, 8}), y.t, stream());
      },
      "softmax", "x", "host pointer");
  cudaFreeHost(pinned);
}

TEST_F(ErrorsGpu, MisalignedPointerRejected) {
  test::DeviceTensor x = test::alloc(f32, {65});
  test::DeviceTensor y = test::alloc(f32, {64});
  Tensor bad = Tensor::contiguous(static_cast<char*>(x.buf.data()) + 1, f32, {64});
  expect_invalid([&] { softmax(bad, y.t, stream()); }, "softmax", "x", "align");
  expect_invalid([&] { unary(UnaryOp::neg, bad, y.t, stream()); }, "unary", "x", "align");
  Tensor bad_h = Tensor::contiguous(static_cast<char*>(x.buf.data()) + 1, f16, {64});
  test::DeviceTensor yh = test::alloc(f16, {64});
  expect_invalid([&] { copy(bad_h, yh.t, stream()); }, "copy", "src", "align");
  sync();
  const std::vector<uint8_t> img = test::download_buffer(y);
  EXPECT_TRUE(test::bit_exact(img, std::vector<uint8_t>(img.size(), 0xFF), 4));
}

TEST_F(ErrorsGpu, NullPointerRejected) {
  test::DeviceTensor y = test::alloc(f32, {8});
  expect_invalid([&] { softmax(Tensor::contiguous(nullptr, f32, {8}), y.t, stream()); }, "softmax",
                 "x", "null");
}

}  // namespace
}  // namespace tessel
