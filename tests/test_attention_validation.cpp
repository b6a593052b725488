// Argument validation of tessel::attention_forward (include/tessel/attention.hpp), no GPU
// needed: fake, never dereferenced device pointers. Validation runs dtype -> shape -> strides
// -> parameters -> (empty: return) -> device pointers; a call that fails at the device check
// of a CPU-marked tensor ("CUDA tensor") has passed every layout check (the *Accepted tests).
// Also the float64 reference (src/ref/attention_ref.hpp) against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "ref/attention_ref.hpp"
#include "tessel/attention.hpp"
#include "tessel/tensor.hpp"
#include "tessel/tessel_attention.h"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_error;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32;
constexpr const char* kOp = "attention_forward";

#define EXPECT_INVALID(stmt, arg, ...)                                   \
  do {                                                                   \
    SCOPED_TRACE(#stmt);                                                 \
    expect_error([&] { stmt; }, TESSEL_ERROR_INVALID_ARGUMENT, kOp, arg, \
                 std::string(__VA_OPT__(__VA_ARGS__)));                  \
  } while (0)
#define EXPECT_LAYOUT_ACCEPTED(stmt, arg) EXPECT_INVALID(stmt, arg, "CUDA tensor")

// A padded-batch problem B=2, Sq=5, Skv=7, Hq=4, Hkv=2, D=64 over fake pointers.
struct Args {
  Tensor q = T(bf16, {2, 5, 4, 64}, 0);
  Tensor k = T(bf16, {2, 7, 2, 64}, 1);
  Tensor v = T(bf16, {2, 7, 2, 64}, 2);
  Tensor out = T(bf16, {2, 5, 4, 64}, 3);
  Tensor lse = T(f32, {2, 4, 5}, 4);
  AttentionParams p;
  void run() { attention_forward(q, k, v, out, &lse, p, nullptr); }
};

TEST(AttentionValidation, Dtypes) {
  {
    Args a;
    a.q = T(f32, {2, 5, 4, 64}, 0);
    EXPECT_INVALID(a.run(), "q", "f32");
  }
  {
    Args a;
    a.k = T(f16, {2, 7, 2, 64}, 1);
    EXPECT_INVALID(a.run(), "k", "f16");
  }
  {
    Args a;
    a.v = T(f16, {2, 7, 2, 64}, 2);
    EXPECT_INVALID(a.run(), "v", "f16");
  }
  {
    Args a;
    a.out = T(f16, {2, 5, 4, 64}, 3);
    EXPECT_INVALID(a.run(), "out", "f16");
  }
  {
    Args a;
    a.lse = T(bf16, {2, 4, 5}, 4);
    EXPECT_INVALID(a.run(), "lse", "bf16");
  }
  {
    Args a;
    Tensor sinks = T(bf16, {4}, 5);
    a.p.sinks = &sinks;
    EXPECT_INVALID(a.run(), "sinks", "bf16");
  }
  {
    Args a;
    a.q = T(f16, {2, 5, 4, 64}, 0);
    a.k = T(f16, {2, 7, 2, 64}, 1);
    a.v = T(f16, {2, 7, 2, 64}, 2);
    a.out = T(f16, {2, 5, 4, 64}, 3);
    a.q.device = a.k.device = a.v.device = a.out.device = Device{DeviceKind::cpu, 0};
    EXPECT_LAYOUT_ACCEPTED(a.run(), "q");
  }
}

TEST(AttentionValidation, Shapes) {
  {
    Args a;
    a.q = T(bf16, {2, 5, 4, 96}, 0);
    a.out = T(bf16, {2, 5, 4, 96}, 3);
    EXPECT_INVALID(a.run(), "q", "head dim 96");
  }
  {
    Args a;
    a.k = T(bf16, {2, 7, 2, 128}, 1);
    EXPECT_INVALID(a.run(), "k", "head dim 64");
  }
  {
    Args a;  // Hq % Hkv != 0
    a.k = T(bf16, {2, 7, 3, 64}, 1);
    a.v = T(bf16, {2, 7, 3, 64}, 2);
    EXPECT_INVALID(a.run(), "k", "3 heads");
  }
  {
    Args a;
    a.v = T(bf16, {2, 8, 2, 64}, 2);
    EXPECT_INVALID(a.run(), "v", "(2, 8, 2, 64)");
  }
  {
    Args a;
    a.out = T(bf16, {2, 5, 4, 128}, 3);
    EXPECT_INVALID(a.run(), "out");
  }
  {
    Args a;
    a.k = T(bf16, {3, 7, 2, 64}, 1);
    a.v = T(bf16, {3, 7, 2, 64}, 2);
    EXPECT_INVALID(a.run(), "k", "batch 2");
  }
  {
    Args a;
    a.lse = T(f32, {2, 5, 4}, 4);
    EXPECT_INVALID(a.run(), "lse", "(2, 4, 5)");
  }
  {
    Args a;
    a.q = T(bf16, {5, 4, 64}, 0);
    EXPECT_INVALID(a.run(), "q", "4-D");
  }
  {
    Args a;
    Tensor sinks = T(f32, {2}, 5);
    a.p.sinks = &sinks;
    EXPECT_INVALID(a.run(), "sinks", "(4,)");
  }
}

TEST(AttentionValidation, Strides) {
  {
    Args a;  // last axis not contiguous
    a.q = S(bf16, {2, 5, 4, 64}, {5 * 4 * 128, 4 * 128, 128, 2}, 0);
    EXPECT_INVALID(a.run(), "q", "stride 2");
  }
  {
    Args a;
    a.lse = S(f32, {2, 4, 5}, {40, 10, 1}, 4);
    EXPECT_INVALID(a.run(), "lse");
  }
  {
    // packed qkv: (B, S, 3, H, D) sliced: strides free apart from the last axis.
    Args a;
    a.q = S(bf16, {2, 5, 4, 64}, {5 * 3 * 4 * 64, 3 * 4 * 64, 64, 1}, 0);
    a.k = S(bf16, {2, 5, 4, 64}, {5 * 3 * 4 * 64, 3 * 4 * 64, 64, 1}, 1);
    a.v = S(bf16, {2, 5, 4, 64}, {5 * 3 * 4 * 64, 3 * 4 * 64, 64, 1}, 2);
    a.q = on_cpu(a.q);
    EXPECT_LAYOUT_ACCEPTED(a.run(), "q");
  }
}

TEST(AttentionValidation, Parameters) {
  {
    Args a;
    a.p.scale = std::numeric_limits<float>::quiet_NaN();
    EXPECT_INVALID(a.run(), "scale");
  }
  {
    Args a;
    a.p.softcap = -1.f;
    EXPECT_INVALID(a.run(), "softcap");
  }
  {
    Args a;
    a.p.window_left = -2;
    EXPECT_INVALID(a.run(), "window_left");
  }
  {
    Args a;
    a.p.window_right = -5;
    EXPECT_INVALID(a.run(), "window_right");
  }
}

TEST(AttentionValidation, Varlen) {
  Tensor cu_q = T(i32, {3}, 6), cu_k = T(i32, {3}, 7);
  auto varlen = [&] {
    Args a;
    a.q = T(bf16, {9, 4, 64}, 0);
    a.k = T(bf16, {11, 2, 64}, 1);
    a.v = T(bf16, {11, 2, 64}, 2);
    a.out = T(bf16, {9, 4, 64}, 3);
    a.lse = T(f32, {4, 9}, 4);
    a.p.cu_seqlens_q = &cu_q;
    a.p.cu_seqlens_k = &cu_k;
    return a;
  };
  {
    Args a = varlen();
    a.p.cu_seqlens_k = nullptr;
    EXPECT_INVALID(a.run(), "cu_seqlens_k", "only one");
  }
  {
    Args a = varlen();
    Tensor bad = T(f32, {3}, 7);
    a.p.cu_seqlens_k = &bad;
    EXPECT_INVALID(a.run(), "cu_seqlens_k", "f32");
  }
  {
    Args a = varlen();
    Tensor bad = T(i32, {4}, 7);
    a.p.cu_seqlens_k = &bad;
    EXPECT_INVALID(a.run(), "cu_seqlens_k", "(3,)");
  }
  {
    Args a = varlen();
    a.lse = T(f32, {2, 4, 9}, 4);
    EXPECT_INVALID(a.run(), "lse");
  }
  {
    Args a = varlen();
    a.q = T(bf16, {2, 9, 4, 64}, 0);  // padded layout with varlen offsets
    EXPECT_INVALID(a.run(), "q", "3-D");
  }
  {
    Args a = varlen();
    a.q = on_cpu(a.q);
    EXPECT_LAYOUT_ACCEPTED(a.run(), "q");
  }
}

TEST(AttentionValidation, EmptyIsNoop) {
  Args a;
  a.q = T(bf16, {2, 0, 4, 64}, 0);
  a.out = T(bf16, {2, 0, 4, 64}, 3);
  a.lse = T(f32, {2, 4, 0}, 4);
  a.q = on_cpu(a.q);  // never looked at: nothing to compute
  EXPECT_NO_THROW(a.run());
}

// ---- C ABI -------------------------------------------------------------------------------
TEST(AttentionValidation, CApi) {
  tessel_attention_params_t p;
  tessel_attention_params_init(&p);
  EXPECT_EQ(p.scale, 0.0f);
  EXPECT_EQ(p.causal, 0);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_EQ(p.softcap, 0.0f);
  tessel_tensor_t q{}, out{};
  const int64_t qs[4] = {2, 5, 4, 96};
  ASSERT_EQ(tessel_tensor_init(&q, fake(0), TESSEL_BF16, 4, qs), TESSEL_OK);
  ASSERT_EQ(tessel_tensor_init(&out, fake(3), TESSEL_BF16, 4, qs), TESSEL_OK);
  EXPECT_EQ(tessel_attention_forward(&q, nullptr, &q, &out, nullptr, &p, nullptr, nullptr, nullptr,
                                     nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("'k'"), std::string::npos) << tessel_last_error();
  EXPECT_EQ(tessel_attention_forward(&q, &q, &q, &out, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("head dim 96"), std::string::npos)
      << tessel_last_error();
}

// ---- the float64 reference ---------------------------------------------------------------
TEST(AttentionReference, HandComputed) {
  // One head, D=1, Sq=1, Skv=2: logits scale*q*k = {1*1, 1*2} * 1 -> softmax {e/(e+e^2), ...}
  const std::vector<double> q = {1.0}, k = {1.0, 2.0}, v = {10.0, 20.0};
  const std::vector<int64_t> cu_q = {0, 1}, cu_k = {0, 2};
  ref::AttentionOptions opt;
  opt.scale = 1.0;
  auto r = ref::attention_forward(q, k, v, cu_q, cu_k, 1, 1, 1, opt);
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_NEAR(r.out[0], (10 * e1 + 20 * e2) / (e1 + e2), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(e1 + e2), 1e-12);
  // Causal with Sq=1 < Skv=2: bottom-right alignment, the one query sees both keys.
  opt.causal = true;
  r = ref::attention_forward(q, k, v, cu_q, cu_k, 1, 1, 1, opt);
  EXPECT_NEAR(r.lse[0], std::log(e1 + e2), 1e-12);
  // window_left = 0 with causal: only the diagonal key (j = 1).
  opt.window_left = 0;
  r = ref::attention_forward(q, k, v, cu_q, cu_k, 1, 1, 1, opt);
  EXPECT_NEAR(r.out[0], 20.0, 1e-12);
  EXPECT_NEAR(r.lse[0], 2.0, 1e-12);
  // A sink adds exp(sink) to the denominator only.
  const std::vector<double> sinks = {2.0};
  opt.sinks = sinks;
  r = ref::attention_forward(q, k, v, cu_q, cu_k, 1, 1, 1, opt);
  EXPECT_NEAR(r.out[0], 20.0 * e2 / (e2 + e2), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(2 * e2), 1e-12);
  // Softcap 1: logit 2 -> tanh(2).
  opt.sinks = {};
  opt.softcap = 1.0;
  r = ref::attention_forward(q, k, v, cu_q, cu_k, 1, 1, 1, opt);
  EXPECT_NEAR(r.lse[0], std::tanh(2.0), 1e-12);
  // Causal with Sq=2 > Skv=1: query 0 sees nothing (out 0, lse -inf).
  const std::vector<double> q2 = {1.0, 1.0}, k1 = {1.0}, v1 = {5.0};
  const std::vector<int64_t> cq2 = {0, 2}, ck1 = {0, 1};
  ref::AttentionOptions c;
  c.scale = 1.0;
  c.causal = true;
  r = ref::attention_forward(q2, k1, v1, cq2, ck1, 1, 1, 1, c);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_NEAR(r.out[1], 5.0, 1e-12);
}

TEST(AttentionReference, BadSizes) {
  const std::vector<double> q(4), k(4), v(4);
  const std::vector<int64_t> cu = {0, 2};
  ref::AttentionOptions opt;
  opt.scale = 1.0;
  EXPECT_THROW(ref::attention_forward(q, k, v, cu, cu, 2, 3, 1, opt), std::invalid_argument);
  EXPECT_THROW(ref::attention_forward(q, k, v, cu, cu, 1, 1, 3, opt), std::invalid_argument);
}

}  // namespace
}  // namespace tessel
