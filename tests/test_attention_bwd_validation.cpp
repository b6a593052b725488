// Argument validation of tessel::attention_backward (include/tessel/attention_backward.hpp),
// no GPU needed: fake, never dereferenced device pointers. Validation runs dtype -> shape ->
// strides -> parameters -> (empty: return) -> device pointers; a call that fails at the device
// check of a CPU-marked tensor has passed every layout check (the *Accepted cases).
// Also the float64 backward reference (src/ref/attention_bwd_ref.hpp) against central finite
// differences of the float64 forward reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "ref/attention_bwd_ref.hpp"
#include "tessel/attention_backward.hpp"
#include "tessel/tensor.hpp"
#include "tessel/tessel_attention_bwd.h"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_error;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32;
constexpr const char* kOp = "attention_backward";

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
  Tensor dout = T(bf16, {2, 5, 4, 64}, 4);
  Tensor lse = T(f32, {2, 4, 5}, 5);
  Tensor dq = T(bf16, {2, 5, 4, 64}, 6);
  Tensor dk = T(bf16, {2, 7, 2, 64}, 7);
  Tensor dv = T(bf16, {2, 7, 2, 64}, 8);
  AttentionBackwardParams p;
  void run() { attention_backward(q, k, v, out, dout, lse, dq, dk, dv, p, nullptr); }
};

TEST(AttentionBwdValidation, Dtypes) {
  {
    Args a;
    a.q = T(f32, {2, 5, 4, 64}, 0);
    EXPECT_INVALID(a.run(), "q", "f32");
  }
  {
    Args a;
    a.dout = T(f16, {2, 5, 4, 64}, 4);
    EXPECT_INVALID(a.run(), "dout", "f16");
  }
  {
    Args a;
    a.lse = T(bf16, {2, 4, 5}, 5);
    EXPECT_INVALID(a.run(), "lse", "bf16");
  }
  {
    Args a;
    a.dk = T(f16, {2, 7, 2, 64}, 7);
    EXPECT_INVALID(a.run(), "dk", "f16");
  }
  {
    Args a;
    a.dv = T(f32, {2, 7, 2, 64}, 8);
    EXPECT_INVALID(a.run(), "dv", "f32");
  }
  {
    Args a;
    Tensor ds = T(f32, {4}, 9);
    a.p.d_sinks = &ds;  // without sinks
    EXPECT_INVALID(a.run(), "d_sinks", "no sinks");
  }
  {
    Args a;
    Tensor sinks = T(f32, {4}, 9), ds = T(bf16, {4}, 10);
    a.p.sinks = &sinks;
    a.p.d_sinks = &ds;
    EXPECT_INVALID(a.run(), "d_sinks", "bf16");
  }
  {
    Args a;
    for (Tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) t->dtype = f16;
    a.q = on_cpu(a.q);
    EXPECT_LAYOUT_ACCEPTED(a.run(), "q");
  }
}

TEST(AttentionBwdValidation, Shapes) {
  {
    Args a;
    for (Tensor* t : {&a.q, &a.out, &a.dout, &a.dq}) *t = T(bf16, {2, 5, 4, 96}, 0);
    EXPECT_INVALID(a.run(), "q", "head dim 96");
  }
  {
    Args a;  // Hq % Hkv != 0
    a.k = T(bf16, {2, 7, 3, 64}, 1);
    EXPECT_INVALID(a.run(), "k", "3 heads");
  }
  {
    Args a;
    a.dout = T(bf16, {2, 6, 4, 64}, 4);
    EXPECT_INVALID(a.run(), "dout", "(2, 5, 4, 64)");
  }
  {
    Args a;
    a.dq = T(bf16, {2, 5, 2, 64}, 6);
    EXPECT_INVALID(a.run(), "dq", "(2, 5, 4, 64)");
  }
  {
    Args a;
    a.dk = T(bf16, {2, 7, 4, 64}, 7);
    EXPECT_INVALID(a.run(), "dk", "(2, 7, 2, 64)");
  }
  {
    Args a;
    a.dv = T(bf16, {2, 8, 2, 64}, 8);
    EXPECT_INVALID(a.run(), "dv", "(2, 7, 2, 64)");
  }
  {
    Args a;
    a.lse = T(f32, {2, 5, 4}, 5);
    EXPECT_INVALID(a.run(), "lse", "(2, 4, 5)");
  }
  {
    Args a;
    Tensor sinks = T(f32, {4}, 9), ds = T(f32, {2}, 10);
    a.p.sinks = &sinks;
    a.p.d_sinks = &ds;
    EXPECT_INVALID(a.run(), "d_sinks", "(4,)");
  }
}

TEST(AttentionBwdValidation, Strides) {
  {
    Args a;  // last axis not contiguous
    a.dq = S(bf16, {2, 5, 4, 64}, {5 * 4 * 128, 4 * 128, 128, 2}, 6);
    EXPECT_INVALID(a.run(), "dq", "stride 2");
  }
  {
    Args a;
    a.dout = S(bf16, {2, 5, 4, 64}, {5 * 4 * 128, 4 * 128, 128, 2}, 4);
    EXPECT_INVALID(a.run(), "dout", "stride 2");
  }
  {
    Args a;
    a.lse = S(f32, {2, 4, 5}, {40, 10, 1}, 5);
    EXPECT_INVALID(a.run(), "lse");
  }
  {
    // packed qkv / dqkv: (B, S, 3, H, D) slices.
    Args a;
    const std::initializer_list<int64_t> st = {5 * 3 * 4 * 64, 3 * 4 * 64, 64, 1};
    a.q = S(bf16, {2, 5, 4, 64}, st, 0);
    a.k = a.v = S(bf16, {2, 5, 4, 64}, st, 1);
    a.dq = S(bf16, {2, 5, 4, 64}, st, 6);
    a.dk = a.dv = S(bf16, {2, 5, 4, 64}, st, 7);
    a.q = on_cpu(a.q);
    EXPECT_LAYOUT_ACCEPTED(a.run(), "q");
  }
}

TEST(AttentionBwdValidation, ParametersAndVarlen) {
  {
    Args a;
    a.p.scale = std::numeric_limits<float>::infinity();
    EXPECT_INVALID(a.run(), "scale");
  }
  {
    Args a;
    a.p.softcap = -1.f;
    EXPECT_INVALID(a.run(), "softcap");
  }
  {
    Args a;
    a.p.window_left = -3;
    EXPECT_INVALID(a.run(), "window_left");
  }
  Tensor cu_q = T(i32, {3}, 11), cu_k = T(i32, {3}, 12);
  auto varlen = [&] {
    Args a;
    a.q = a.out = a.dout = a.dq = T(bf16, {9, 4, 64}, 0);
    a.k = a.v = a.dk = a.dv = T(bf16, {11, 2, 64}, 1);
    a.lse = T(f32, {4, 9}, 5);
    a.p.cu_seqlens_q = &cu_q;
    a.p.cu_seqlens_k = &cu_k;
    return a;
  };
  {
    Args a = varlen();
    a.p.cu_seqlens_q = nullptr;
    EXPECT_INVALID(a.run(), "cu_seqlens_q", "only one");
  }
  {
    Args a = varlen();
    a.lse = T(f32, {2, 4, 9}, 5);
    EXPECT_INVALID(a.run(), "lse", "(4, 9)");
  }
  {
    Args a = varlen();
    a.dk = T(bf16, {2, 11, 2, 64}, 7);
    EXPECT_INVALID(a.run(), "dk", "(11, 2, 64)");
  }
  {
    Args a = varlen();
    a.q = on_cpu(a.q);
    EXPECT_LAYOUT_ACCEPTED(a.run(), "q");
  }
}

TEST(AttentionBwdValidation, EmptyIsNoop) {
  Args a;
  a.q = a.out = a.dout = a.dq = T(bf16, {2, 0, 4, 64}, 0);
  a.k = a.v = a.dk = a.dv = T(bf16, {2, 0, 2, 64}, 1);
  a.lse = T(f32, {2, 4, 0}, 5);
  a.q = on_cpu(a.q);  // never looked at: nothing to write
  EXPECT_NO_THROW(a.run());
  // No queries but keys: dk and dv are still zeroed, so the pointers are checked.
  Args b;
  b.q = b.out = b.dout = b.dq = T(bf16, {2, 0, 4, 64}, 0);
  b.lse = T(f32, {2, 4, 0}, 5);
  b.k = on_cpu(b.k);  // q, out, dout, dq are empty: k is the first pointer checked
  EXPECT_LAYOUT_ACCEPTED(b.run(), "k");
}

TEST(AttentionBwdValidation, CApi) {
  tessel_attention_params_t p;
  tessel_attention_params_init(&p);
  tessel_tensor_t q{}, k{}, lse{};
  const int64_t qs[4] = {2, 5, 4, 64}, ks[4] = {2, 7, 2, 64}, ls[3] = {2, 4, 5};
  ASSERT_EQ(tessel_tensor_init(&q, fake(0), TESSEL_BF16, 4, qs), TESSEL_OK);
  ASSERT_EQ(tessel_tensor_init(&k, fake(1), TESSEL_BF16, 4, ks), TESSEL_OK);
  ASSERT_EQ(tessel_tensor_init(&lse, fake(5), TESSEL_BF16, 3, ls), TESSEL_OK);
  EXPECT_EQ(tessel_attention_backward(&q, &k, &k, &q, &q, &lse, &q, &k, &k, &p, nullptr, nullptr,
                                      nullptr, nullptr, 0, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("'lse'"), std::string::npos)
      << tessel_last_error();
  EXPECT_EQ(tessel_attention_backward(&q, &k, &k, &q, nullptr, &lse, &q, &k, &k, &p, nullptr,
                                      nullptr, nullptr, nullptr, 1, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("'dout'"), std::string::npos)
      << tessel_last_error();
}

// ---- the float64 reference against finite differences ------------------------------------
TEST(AttentionBwdReference, FiniteDifferences) {
  // Two sequences (varlen, Sq != Skv), GQA 2:1, causal + left window, softcap and sinks.
  const std::vector<int64_t> cu_q = {0, 3, 5}, cu_k = {0, 4, 7};
  const int64_t hq = 2, hkv = 1, d = 3, tq = 5, tk = 7;
  std::mt19937_64 gen(1234);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto rand_vec = [&](int64_t n) {
    std::vector<double> x(static_cast<size_t>(n));
    for (double& e : x) e = u(gen);
    return x;
  };
  std::vector<double> q = rand_vec(tq * hq * d), k = rand_vec(tk * hkv * d),
                      v = rand_vec(tk * hkv * d), g = rand_vec(tq * hq * d);
  std::vector<double> sinks = {0.3, -0.5};
  ref::AttentionOptions opt;
  opt.scale = 0.7;
  opt.causal = true;
  opt.window_left = 2;
  opt.softcap = 1.3;
  opt.sinks = sinks;
  auto loss = [&] {
    const auto f = ref::attention_forward(q, k, v, cu_q, cu_k, hq, hkv, d, opt);
    double s = 0;
    for (size_t i = 0; i < f.out.size(); ++i) s += g[i] * f.out[i];
    return s;
  };
  const auto r = ref::attention_backward(q, k, v, g, cu_q, cu_k, hq, hkv, d, opt);
  const double eps = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    ASSERT_EQ(x.size(), grad.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + eps;
      const double up = loss();
      x[i] = keep - eps;
      const double down = loss();
      x[i] = keep;
      EXPECT_NEAR(grad[i], (up - down) / (2 * eps), 1e-7) << name << "[" << i << "]";
    }
  };
  check(q, r.dq, "dq");
  check(k, r.dk, "dk");
  check(v, r.dv, "dv");
  check(sinks, r.d_sinks, "d_sinks");
  // A query that sees nothing (causal, Sq > Skv, no sink) has dq = 0 and adds nothing.
  const std::vector<int64_t> cq = {0, 2}, ck = {0, 1};
  ref::AttentionOptions c;
  c.scale = 1.0;
  c.causal = true;
  const std::vector<double> q2 = {1.0, 2.0}, k1 = {0.5}, v1 = {3.0}, g2 = {1.0, 1.0};
  const auto e = ref::attention_backward(q2, k1, v1, g2, cq, ck, 1, 1, 1, c);
  EXPECT_EQ(e.dq[0], 0.0);
  EXPECT_NEAR(e.dv[0], 1.0, 1e-12);  // P = 1 for query 1
  EXPECT_NEAR(e.dk[0], 0.0, 1e-12);  // softmax over one key: no gradient through the logit
}

}  // namespace
}  // namespace tessel
