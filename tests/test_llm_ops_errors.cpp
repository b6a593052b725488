// Argument validation of the LLM operator set (activation.hpp, dropout.hpp, rope.hpp,
// embedding.hpp). CPU only: fake, never dereferenced device pointers; a tensor marked as CPU
// memory fails at the last (device-pointer) step, which proves every layout check before it
// accepted the arguments.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "tessel/activation.hpp"
#include "tessel/dropout.hpp"
#include "tessel/embedding.hpp"
#include "tessel/rope.hpp"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_error;
using tessel::test::expect_invalid;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32,
                i64 = DType::i64, u8 = DType::u8;

cudaStream_t S = nullptr;

TEST(LlmOpsErrors, SiluAndMul) {
  Tensor x = T(bf16, {4, 16}, 0), out = T(bf16, {4, 8}, 1);
  expect_invalid(
      [&] {
        Tensor o = T(f16, {4, 8}, 1);
        silu_and_mul(x, o, S);
      },
      "silu_and_mul", "out", "f16");
  expect_invalid(
      [&] {
        Tensor o = T(bf16, {4, 16}, 1);
        silu_and_mul(x, o, S);
      },
      "silu_and_mul", "out", "(4, 8)");
  expect_invalid(
      [&] {
        Tensor xo = T(bf16, {4, 15});
        Tensor o = T(bf16, {4, 7}, 1);
        silu_and_mul(xo, o, S);
      },
      "silu_and_mul", "x", "even");
  expect_invalid(
      [&] {
        Tensor xi = T(i32, {4, 16});
        silu_and_mul(xi, out, S);
      },
      "silu_and_mul", "x", "i32");
  expect_invalid([&] { silu_and_mul(on_cpu(x), out, S); }, "silu_and_mul", "x", "CUDA tensor");
  Tensor dx = T(bf16, {4, 16}, 2), g = T(bf16, {4, 8}, 3);
  expect_invalid(
      [&] {
        Tensor d = T(bf16, {4, 8}, 2);
        silu_and_mul_backward(x, g, d, S);
      },
      "silu_and_mul_backward", "dx");
  expect_invalid([&] { silu_and_mul_backward(on_cpu(x), g, dx, S); }, "silu_and_mul_backward", "x",
                 "CUDA tensor");
  Tensor e0 = T(bf16, {0, 16}), e1 = T(bf16, {0, 8});
  silu_and_mul(e0, e1, S);  // zero-size: no-op
}

TEST(LlmOpsErrors, GluAndGelu) {
  Tensor a = T(f32, {3, 5}, 0), b = T(f32, {3, 5}, 1), o = T(f32, {3, 5}, 2),
         d1 = T(f32, {3, 5}, 3), d2 = T(f32, {3, 5}, 4);
  expect_invalid(
      [&] {
        Tensor bb = T(f32, {3, 4}, 1);
        swiglu(a, bb, o, S);
      },
      "swiglu", "up");
  expect_invalid(
      [&] {
        Tensor bb = T(f16, {3, 5}, 1);
        geglu(a, bb, o, GeluApprox::tanh, S);
      },
      "geglu", "up", "f16");
  expect_invalid([&] { geglu(a, b, o, static_cast<GeluApprox>(7), S); }, "geglu", "approx");
  expect_invalid([&] { swiglu_backward(on_cpu(a), b, o, d1, d2, S); }, "swiglu_backward", "gate",
                 "CUDA tensor");
  expect_invalid(
      [&] {
        Tensor y = T(f32, {5, 3}, 1);
        gelu(a, y, GeluApprox::none, S);
      },
      "gelu", "y");
  expect_invalid(
      [&] {
        Tensor y = T(f32, {3, 5}, 1);
        gelu(on_cpu(a), y, GeluApprox::none, S);
      },
      "gelu", "x", "CUDA tensor");
  expect_invalid([&] { gelu_backward(a, b, o, static_cast<GeluApprox>(-1), S); }, "gelu_backward",
                 "approx");
  Tensor strided = a;
  strided.strides[1] = 2;
  expect_invalid([&] { gelu(strided, o, GeluApprox::none, S); }, "gelu", "x", "unit stride");
  expect_invalid(
      [&] {
        Tensor bb = T(bf16, {3, 10}, 1);
        gelu_and_mul(on_cpu(T(bf16, {3, 20})), bb, GeluApprox::tanh, S);
      },
      "gelu_and_mul", "x", "CUDA tensor");
}

TEST(LlmOpsErrors, Dropout) {
  Tensor x = T(bf16, {8, 8}, 0), y = T(bf16, {8, 8}, 1), m = T(u8, {8, 8}, 2);
  expect_invalid([&] { dropout(x, y, 1.5, 1, 0, S); }, "dropout", "p");
  expect_invalid([&] { dropout(x, y, -0.1, 1, 0, S); }, "dropout", "p");
  expect_invalid(
      [&] {
        Tensor yy = T(f32, {8, 8}, 1);
        dropout(x, yy, 0.1, 1, 0, S);
      },
      "dropout", "y", "f32");
  expect_invalid(
      [&] {
        Tensor mm = T(i32, {8, 8}, 2);
        dropout_with_mask(x, y, mm, 0.1, 1, 0, S);
      },
      "dropout_with_mask", "mask", "u8");
  expect_invalid(
      [&] {
        Tensor mm = T(u8, {8, 7}, 2);
        dropout_with_mask(x, y, mm, 0.1, 1, 0, S);
      },
      "dropout_with_mask", "mask");
  expect_invalid([&] { dropout_with_mask(on_cpu(x), y, m, 0.1, 1, 0, S); }, "dropout_with_mask",
                 "x", "CUDA tensor");
  expect_invalid([&] { dropout_backward(on_cpu(x), y, 0.1, 1, 0, S); }, "dropout_backward", "dy",
                 "CUDA tensor");
}

TEST(LlmOpsErrors, Rope) {
  Tensor q = T(bf16, {4, 8, 64}, 0), k = T(bf16, {4, 2, 64}, 1), pos = T(i64, {4}, 2);
  RopeParams p;
  expect_invalid(
      [&] {
        Tensor kk = T(f16, {4, 2, 64}, 1);
        rope(q, kk, pos, p, S);
      },
      "rope", "k", "f16");
  expect_invalid(
      [&] {
        Tensor kk = T(bf16, {4, 2, 32}, 1);
        rope(q, kk, pos, p, S);
      },
      "rope", "k");
  expect_invalid(
      [&] {
        Tensor pp = T(i64, {5}, 2);
        rope(q, k, pp, p, S);
      },
      "rope", "positions");
  expect_invalid(
      [&] {
        Tensor pp = T(f32, {4}, 2);
        rope(q, k, pp, p, S);
      },
      "rope", "positions", "f32");
  expect_invalid(
      [&] {
        Tensor qq = T(bf16, {4, 512}, 0);
        rope(qq, k, pos, p, S);
      },
      "rope", "q");
  RopeParams odd = p;
  odd.rotary_dim = 33;
  expect_invalid([&] { rope(q, k, pos, odd, S); }, "rope", "params.rotary_dim");
  RopeParams big = p;
  big.rotary_dim = 128;
  expect_invalid([&] { rope(q, k, pos, big, S); }, "rope", "params.rotary_dim");
  RopeParams bad_theta = p;
  bad_theta.theta = 0.0;
  expect_invalid([&] { rope(q, k, pos, bad_theta, S); }, "rope", "params.theta");
  RopeParams bad_l3 = p;
  bad_l3.llama3 = true;
  bad_l3.high_freq_factor = 0.5;
  expect_invalid([&] { rope(q, k, pos, bad_l3, S); }, "rope", "params");
  RopeParams bad_style = p;
  bad_style.style = static_cast<RopeStyle>(5);
  expect_invalid([&] { rope(q, k, pos, bad_style, S); }, "rope", "params.style");
  expect_invalid(
      [&] {
        Tensor qq = q;
        qq.strides[2] = 2;
        rope(qq, k, pos, p, S);
      },
      "rope", "q", "unit stride");
  expect_invalid(
      [&] {
        Tensor qq = on_cpu(q);
        rope_backward(qq, k, pos, p, S);
      },
      "rope_backward", "dq", "CUDA tensor");
  // Fused-qkv strides accepted (fails only at the device-pointer step).
  Tensor qv = q;
  qv.strides[0] = (8 + 2 * 2) * 64;
  expect_invalid(
      [&] {
        Tensor qq = on_cpu(qv);
        rope(qq, k, pos, p, S);
      },
      "rope", "q", "CUDA tensor");
}

TEST(LlmOpsErrors, Embedding) {
  Tensor ids = T(i32, {2, 5}, 0), w = T(bf16, {100, 64}, 1), out = T(bf16, {2, 5, 64}, 2);
  expect_invalid(
      [&] {
        Tensor ii = T(f32, {2, 5}, 0);
        embedding(ii, w, out, false, S);
      },
      "embedding", "ids", "f32");
  expect_invalid(
      [&] {
        Tensor oo = T(bf16, {10, 64}, 2);
        embedding(ids, w, oo, false, S);
      },
      "embedding", "out", "(2, 5, 64)");
  expect_invalid(
      [&] {
        Tensor oo = T(f16, {2, 5, 64}, 2);
        embedding(ids, w, oo, false, S);
      },
      "embedding", "out", "f16");
  expect_invalid(
      [&] {
        Tensor ww = T(bf16, {100}, 1);
        embedding(ids, ww, out, false, S);
      },
      "embedding", "weight");
  expect_invalid([&] { embedding(on_cpu(ids), w, out, true, S); }, "embedding", "ids",
                 "CUDA tensor");
  Tensor g = T(bf16, {2, 5, 64}, 3), dw = T(f32, {100, 64}, 4);
  expect_invalid(
      [&] {
        Tensor d = T(f16, {100, 64}, 4);
        embedding_backward(ids, g, d, EmbeddingGradMode::atomic, false, S);
      },
      "embedding_backward", "dweight", "f16");
  expect_invalid(
      [&] { embedding_backward(ids, g, dw, static_cast<EmbeddingGradMode>(9), false, S); },
      "embedding_backward", "mode");
  expect_invalid(
      [&] {
        Tensor gg = T(bf16, {2, 5, 63}, 3);
        embedding_backward(ids, gg, dw, EmbeddingGradMode::deterministic, false, S);
      },
      "embedding_backward", "dout");
  expect_invalid(
      [&] {
        Tensor d = on_cpu(dw);
        embedding_backward(ids, g, d, EmbeddingGradMode::deterministic, false, S);
      },
      "embedding_backward", "dweight", "CUDA tensor");
  Tensor e_ids = T(i64, {0}), e_out = T(bf16, {0, 64});
  embedding(e_ids, w, e_out, true, S);  // zero-size: no-op
}

}  // namespace
}  // namespace tessel
