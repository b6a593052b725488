// Argument validation of cross_entropy, fused_linear_cross_entropy, adamw, concat and
// transpose_batched (CPU only: fake, never dereferenced device pointers; CPU-marked tensors
// prove a layout passed every check by failing at the device check, "CUDA tensor").
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "tessel/loss.hpp"
#include "tessel/optim.hpp"
#include "tessel/shape_ops.hpp"
#include "tessel/tensor.hpp"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_error;
using tessel::test::expect_invalid;

Tensor cpu(Tensor t) {
  t.device = Device{DeviceKind::cpu, 0};
  return t;
}
Tensor transposed(Tensor t) {  // swap the last two axes' strides (non-contiguous)
  std::swap(t.shape[t.ndim - 1], t.shape[t.ndim - 2]);
  std::swap(t.strides[t.ndim - 1], t.strides[t.ndim - 2]);
  return t;
}

#define EXPECT_INVALID(stmt, op, arg, ...)                             \
  do {                                                                 \
    SCOPED_TRACE(#stmt);                                               \
    expect_invalid([&] { stmt; }, op, arg __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
#define EXPECT_ACCEPTED(stmt, op, arg) EXPECT_INVALID(stmt, op, arg, "CUDA tensor")

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32,
                i64 = DType::i64;

TEST(LossErrors, CrossEntropy) {
  Tensor x = T(bf16, {4, 100}), t = T(i64, {4}, 1), l = T(f32, {}, 2), dx = T(bf16, {4, 100}, 3);
  EXPECT_INVALID(cross_entropy(T(i32, {4, 100}), t, l, &dx, nullptr), "cross_entropy", "logits");
  Tensor dxh = T(f16, {4, 100}, 3);
  EXPECT_INVALID(cross_entropy(x, t, l, &dxh, nullptr), "cross_entropy", "dlogits", "f16");
  EXPECT_INVALID(cross_entropy(x, T(f32, {4}, 1), l, &dx, nullptr), "cross_entropy", "targets");
  EXPECT_INVALID(cross_entropy(x, T(i64, {5}, 1), l, &dx, nullptr), "cross_entropy", "targets",
                 "(4,)");
  EXPECT_INVALID(cross_entropy(T(bf16, {2, 2, 100}), t, l, &dx, nullptr), "cross_entropy",
                 "logits");
  Tensor l4 = T(f32, {4}, 2);
  EXPECT_INVALID(cross_entropy(x, t, l4, &dx, nullptr), "cross_entropy", "loss", "one element");
  Tensor lh = T(f16, {}, 2);
  EXPECT_INVALID(cross_entropy(x, t, lh, &dx, nullptr), "cross_entropy", "loss", "f16");
  CrossEntropyOptions none;
  none.reduction = Reduction::none;
  EXPECT_INVALID(cross_entropy(x, t, l, &dx, nullptr, none), "cross_entropy", "loss", "(4,)");
  Tensor dx5 = T(bf16, {4, 101}, 3);
  EXPECT_INVALID(cross_entropy(x, t, l, &dx5, nullptr), "cross_entropy", "dlogits");
  CrossEntropyOptions bad;
  bad.label_smoothing = 1.5f;
  EXPECT_INVALID(cross_entropy(x, t, l, &dx, nullptr, bad), "cross_entropy", "label_smoothing");
  bad = {};
  bad.reduction = static_cast<Reduction>(7);
  EXPECT_INVALID(cross_entropy(x, t, l, &dx, nullptr, bad), "cross_entropy", "reduction");
  Tensor xt = transposed(T(bf16, {100, 4}));
  EXPECT_INVALID(cross_entropy(xt, t, l, &dx, nullptr), "cross_entropy", "logits", "strides");
  EXPECT_ACCEPTED(cross_entropy(cpu(x), t, l, &dx, nullptr), "cross_entropy", "logits");
  Tensor l0 = T(f32, {}, 2);
  EXPECT_NO_THROW(cross_entropy(T(bf16, {0, 100}), T(i32, {0}), l0, nullptr, nullptr));
}

TEST(LossErrors, FusedLinearCrossEntropy) {
  const char* op = "fused_linear_cross_entropy";
  Tensor h = T(bf16, {6, 64}), w = T(bf16, {128, 64}, 1), t = T(i32, {6}, 2), l = T(f32, {1}, 3);
  Tensor dh = T(bf16, {6, 64}, 4), dw = T(f32, {128, 64}, 5);
  EXPECT_INVALID(fused_linear_cross_entropy(T(f32, {6, 64}), w, t, l, &dh, &dw, nullptr), op,
                 "hidden");
  EXPECT_INVALID(fused_linear_cross_entropy(h, T(f16, {128, 64}, 1), t, l, &dh, &dw, nullptr), op,
                 "weight");
  Tensor dwb = T(bf16, {128, 64}, 5);
  EXPECT_INVALID(fused_linear_cross_entropy(h, w, t, l, &dh, &dwb, nullptr), op, "dweight", "bf16");
  Tensor dhh = T(f16, {6, 64}, 4);
  EXPECT_INVALID(fused_linear_cross_entropy(h, w, t, l, &dhh, &dw, nullptr), op, "dhidden");
  EXPECT_INVALID(fused_linear_cross_entropy(h, T(bf16, {128, 32}, 1), t, l, &dh, &dw, nullptr), op,
                 "weight");
  EXPECT_INVALID(fused_linear_cross_entropy(T(bf16, {6, 60}), T(bf16, {128, 60}, 1), t, l, nullptr,
                                            nullptr, nullptr),
                 op, "hidden", "multiple of 8");
  EXPECT_INVALID(
      fused_linear_cross_entropy(h, T(bf16, {100, 64}, 1), t, l, nullptr, nullptr, nullptr), op,
      "weight", "multiple of 8");
  Tensor dw2 = T(f32, {64, 128}, 5);
  EXPECT_INVALID(fused_linear_cross_entropy(h, w, t, l, &dh, &dw2, nullptr), op, "dweight");
  FusedLinearCrossEntropyOptions o;
  o.chunk_rows = 12;
  EXPECT_INVALID(fused_linear_cross_entropy(h, w, t, l, &dh, &dw, nullptr, o), op, "chunk_rows");
  EXPECT_INVALID(fused_linear_cross_entropy(h, w, T(i32, {5}, 2), l, &dh, &dw, nullptr), op,
                 "targets");
  EXPECT_ACCEPTED(fused_linear_cross_entropy(cpu(h), w, t, l, &dh, &dw, nullptr), op, "hidden");
}

TEST(OptimErrors, AdamW) {
  AdamWTensors e{T(bf16, {10}), T(bf16, {10}, 1), T(f32, {10}, 2), T(f32, {10}, 3),
                 T(f32, {10}, 4)};
  AdamWOptions o;
  auto call = [&](AdamWTensors x, AdamWOptions opt = {}) { adamw(&x, 1, opt, nullptr); };
  AdamWTensors b = e;
  b.exp_avg = T(bf16, {10}, 2);
  EXPECT_INVALID(call(b), "adamw", "list[0].exp_avg", "bf16");
  b = e;
  b.grad = T(i32, {10}, 1);
  EXPECT_INVALID(call(b), "adamw", "list[0].grad");
  b = e;
  b.master = T(bf16, {10}, 4);
  EXPECT_INVALID(call(b), "adamw", "list[0].master");
  b = e;
  b.exp_avg_sq = T(f32, {11}, 3);
  EXPECT_INVALID(call(b), "adamw", "list[0].exp_avg_sq", "(11");
  b = e;
  b.grad = transposed(T(bf16, {2, 5}, 1));
  b.param = T(bf16, {5, 2});
  b.exp_avg = T(f32, {5, 2}, 2);
  b.exp_avg_sq = T(f32, {5, 2}, 3);
  b.master = T(f32, {5, 2}, 4);
  EXPECT_INVALID(call(b), "adamw", "list[0].grad");
  o.step = 0;
  EXPECT_INVALID(call(e, o), "adamw", "step");
  o = {};
  o.beta2 = 1.f;
  EXPECT_INVALID(call(e, o), "adamw", "beta2");
  o = {};
  o.lr = -1.f;
  EXPECT_INVALID(call(e, o), "adamw", "lr");
  b = e;
  b.param = cpu(b.param);
  EXPECT_ACCEPTED(call(b), "adamw", "list[0].param");
  EXPECT_NO_THROW(adamw(nullptr, 0, AdamWOptions{}, nullptr));
}

TEST(ShapeErrors, Concat) {
  Tensor in[2] = {T(bf16, {4, 8}), T(bf16, {4, 3}, 1)};
  Tensor out = T(bf16, {4, 11}, 2);
  EXPECT_INVALID(concat(in, 0, 1, out, nullptr), "concat", "inputs");
  Tensor bad[2] = {T(bf16, {4, 8}), T(f16, {4, 3}, 1)};
  EXPECT_INVALID(concat(bad, 2, 1, out, nullptr), "concat", "inputs[1]", "f16");
  Tensor bad2[2] = {T(bf16, {4, 8}), T(bf16, {5, 3}, 1)};
  EXPECT_INVALID(concat(bad2, 2, 1, out, nullptr), "concat", "inputs[1]", "(5, 3)");
  Tensor out12 = T(bf16, {4, 12}, 2);
  EXPECT_INVALID(concat(in, 2, 1, out12, nullptr), "concat", "out", "11");
  EXPECT_INVALID(concat(in, 2, 2, out, nullptr), "concat", "axis");
  EXPECT_INVALID(concat(in, 2, -3, out, nullptr), "concat", "axis");
  Tensor tr[2] = {transposed(T(bf16, {8, 4})), T(bf16, {4, 3}, 1)};
  EXPECT_INVALID(concat(tr, 2, 1, out, nullptr), "concat", "inputs[0]", "strides");
  Tensor inc[2] = {cpu(in[0]), in[1]};
  EXPECT_ACCEPTED(concat(inc, 2, -1, out, nullptr), "concat", "inputs[0]");
  Tensor e[2] = {T(bf16, {0, 8}), T(bf16, {0, 3}, 1)};
  Tensor eo = T(bf16, {0, 11}, 2);
  EXPECT_NO_THROW(concat(e, 2, 1, eo, nullptr));
}

TEST(ShapeErrors, TransposeBatched) {
  Tensor s = T(f32, {3, 4, 5}), d = T(f32, {3, 5, 4}, 1);
  Tensor dh = T(f16, {3, 5, 4}, 1);
  EXPECT_INVALID(transpose_batched(s, dh, nullptr), "transpose_batched", "dst", "f16");
  Tensor d2 = T(f32, {3, 4, 5}, 1);
  EXPECT_INVALID(transpose_batched(s, d2, nullptr), "transpose_batched", "dst", "(3, 5, 4)");
  Tensor d4 = T(f32, {1, 3, 5, 4}, 1);
  EXPECT_INVALID(transpose_batched(T(f32, {1, 3, 4, 5}), d4, nullptr), "transpose_batched", "src");
  EXPECT_INVALID(transpose_batched(transposed(T(f32, {3, 5, 4})), d, nullptr), "transpose_batched",
                 "src");
  EXPECT_ACCEPTED(transpose_batched(cpu(s), d, nullptr), "transpose_batched", "src");
  Tensor d0 = T(f32, {0, 5, 4}, 1);
  EXPECT_NO_THROW(transpose_batched(T(f32, {0, 4, 5}), d0, nullptr));
}

}  // namespace
}  // namespace tessel
