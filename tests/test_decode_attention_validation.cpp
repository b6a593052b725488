// Argument validation of decode_attention, append_kv, mla_decode and append_latent. CPU only:
// fake, never dereferenced device pointers; a tensor marked as CPU memory fails at the last
// (device-pointer) step, which proves every layout check before it accepted the arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "expect_error.hpp"
#include "fake_tensor.hpp"
#include "tessel/decode_attention.hpp"
#include "tessel/tessel_decode_attention.h"

namespace tessel {
namespace {

using namespace tessel::fake_args;
using tessel::test::expect_invalid;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, i32 = DType::i32,
                i64 = DType::i64;
cudaStream_t kS = nullptr;

struct Args {
  Tensor q = T(bf16, {2, 1, 8, 128}, 0);
  Tensor k = T(bf16, {2, 64, 2, 128}, 1);
  Tensor v = T(bf16, {2, 64, 2, 128}, 2);
  Tensor sl = T(i32, {2}, 3);
  Tensor out = T(bf16, {2, 1, 8, 128}, 4);
  Tensor lse = T(f32, {2, 1, 8}, 5);
  Tensor pk = T(bf16, {10, 16, 2, 128}, 6);  // paged
  Tensor pv = T(bf16, {10, 16, 2, 128}, 7);
  Tensor bt = T(i32, {2, 4}, 8);
  DecodeParams p;
  void run() { decode_attention(q, k, v, sl, out, &lse, p, kS); }
  void run_paged() {
    DecodeParams pp = p;
    pp.block_table = &bt;
    decode_attention(q, pk, pv, sl, out, &lse, pp, kS);
  }
};

const char* kOp = "decode_attention";

TEST(DecodeAttentionErrors, DtypesAndShapes) {
  {
    Args a;
    a.q = T(f32, {2, 1, 8, 128}, 0);
    expect_invalid([&] { a.run(); }, kOp, "q", "f32");
  }
  {
    Args a;
    a.k = T(f16, {2, 64, 2, 128}, 1);
    expect_invalid([&] { a.run(); }, kOp, "k_cache", "bf16");
  }
  {
    Args a;  // 6 query heads over 4 KV heads
    a.q = T(bf16, {2, 1, 6, 128}, 0);
    a.out = T(bf16, {2, 1, 6, 128}, 4);
    a.lse = T(f32, {2, 1, 6}, 5);
    a.k = T(bf16, {2, 64, 4, 128}, 1);
    a.v = T(bf16, {2, 64, 4, 128}, 2);
    expect_invalid([&] { a.run(); }, kOp, "k_cache", "divides");
  }
  {
    Args a;  // head dim mismatch
    a.k = T(bf16, {2, 64, 2, 64}, 1);
    a.v = T(bf16, {2, 64, 2, 64}, 2);
    expect_invalid([&] { a.run(); }, kOp, "k_cache", "head dim 128");
  }
  {
    Args a;  // unsupported head dim
    a.q = T(bf16, {2, 1, 8, 96}, 0);
    a.out = T(bf16, {2, 1, 8, 96}, 4);
    a.k = T(bf16, {2, 64, 2, 96}, 1);
    a.v = T(bf16, {2, 64, 2, 96}, 2);
    expect_invalid([&] { a.run(); }, kOp, "q", "64, 128 or 256");
  }
  {
    Args a;
    a.v = T(bf16, {2, 63, 2, 128}, 2);
    expect_invalid([&] { a.run(); }, kOp, "v_cache", "(2, 64, 2, 128)");
  }
  {
    Args a;
    a.out = T(bf16, {2, 2, 8, 128}, 4);
    expect_invalid([&] { a.run(); }, kOp, "out");
  }
  {
    Args a;  // contiguous cache whose batch differs (a paged cache without a block table)
    a.k = T(bf16, {3, 64, 2, 128}, 1);
    a.v = T(bf16, {3, 64, 2, 128}, 2);
    expect_invalid([&] { a.run(); }, kOp, "k_cache", "block_table");
  }
  {
    Args a;
    a.sl = T(i64, {2}, 3);
    expect_invalid([&] { a.run(); }, kOp, "seqlens", "i64");
  }
  {
    Args a;
    a.sl = T(i32, {3}, 3);
    expect_invalid([&] { a.run(); }, kOp, "seqlens", "(2,)");
  }
  {
    Args a;
    a.lse = T(f32, {2, 8}, 5);
    expect_invalid([&] { a.run(); }, kOp, "lse");
  }
  {
    Args a;
    a.lse = T(bf16, {2, 1, 8}, 5);
    expect_invalid([&] { a.run(); }, kOp, "lse", "f32");
  }
  {
    Args a;  // fewer cache slots than new tokens
    a.q = T(bf16, {2, 4, 8, 128}, 0);
    a.out = T(bf16, {2, 4, 8, 128}, 4);
    a.lse = T(f32, {2, 4, 8}, 5);
    a.k = T(bf16, {2, 3, 2, 128}, 1);
    a.v = T(bf16, {2, 3, 2, 128}, 2);
    expect_invalid([&] { a.run(); }, kOp, "k_cache", "room");
  }
}

TEST(DecodeAttentionErrors, PagedShapes) {
  {
    Args a;
    a.bt = T(i32, {3, 4}, 8);
    expect_invalid([&] { a.run_paged(); }, kOp, "block_table", "(2, max_pages");
  }
  {
    Args a;
    a.bt = T(i64, {2, 4}, 8);
    expect_invalid([&] { a.run_paged(); }, kOp, "block_table", "i64");
  }
  {
    Args a;
    a.bt = T(i32, {8}, 8);
    expect_invalid([&] { a.run_paged(); }, kOp, "block_table", "2-D");
  }
  {
    Args a;
    a.bt = S(i32, {2, 4}, {4, 2}, 8);
    expect_invalid([&] { a.run_paged(); }, kOp, "block_table", "unit stride");
  }
  {
    Args a;
    a.pv = T(bf16, {10, 32, 2, 128}, 7);
    expect_invalid([&] { a.run_paged(); }, kOp, "v_cache");
  }
  {
    Args a;  // paged caches may have any page count: fails only at the pointer step
    a.q = on_cpu(a.q);
    expect_invalid([&] { a.run_paged(); }, kOp, "q", "CUDA tensor");
  }
}

TEST(DecodeAttentionErrors, StridesAlignmentParams) {
  {
    Args a;
    a.q = S(bf16, {2, 1, 8, 128}, {2048, 2048, 256, 2}, 0);
    expect_invalid([&] { a.run(); }, kOp, "q", "unit stride");
  }
  {
    Args a;
    a.k = S(bf16, {2, 64, 2, 128}, {64 * 2 * 130, 2 * 130, 130, 1}, 1);
    a.v = a.k;
    a.v.data = fake(2);
    expect_invalid([&] { a.run(); }, kOp, "k_cache", "multiples of 8");
  }
  {
    Args a;
    a.out.data = static_cast<char*>(fake(4)) + 2;
    expect_invalid([&] { a.run(); }, kOp, "out", "16-byte");
  }
  {
    Args a;
    a.p.scale = -1.0;
    expect_invalid([&] { a.run(); }, kOp, "params.scale");
  }
  {
    Args a;
    a.p.softcap = std::nan("");
    expect_invalid([&] { a.run(); }, kOp, "params.softcap");
  }
  {
    Args a;
    a.p.num_splits = 300;
    expect_invalid([&] { a.run(); }, kOp, "params.num_splits");
  }
  {
    Args a;
    a.p.max_seqlen = -1;
    expect_invalid([&] { a.run(); }, kOp, "params.max_seqlen");
  }
  {
    Args a;  // strided q (slice of a fused qkv buffer) and padded out accepted
    a.q = on_cpu(S(bf16, {2, 1, 8, 128}, {12 * 128, 12 * 128, 128, 1}, 0));
    a.out = S(bf16, {2, 1, 8, 128}, {8 * 136, 8 * 136, 136, 1}, 4);
    expect_invalid([&] { a.run(); }, kOp, "q", "CUDA tensor");
  }
  {
    Args a;  // empty batch: a no-op before any pointer is looked at
    a.q = T(bf16, {0, 1, 8, 128}, 0);
    a.out = T(bf16, {0, 1, 8, 128}, 4);
    a.k = T(bf16, {0, 64, 2, 128}, 1);
    a.v = T(bf16, {0, 64, 2, 128}, 2);
    a.sl = T(i32, {0}, 3);
    a.lse = T(f32, {0, 1, 8}, 5);
    EXPECT_NO_THROW(a.run());
  }
}

TEST(DecodeAttentionErrors, AppendKv) {
  Tensor kn = T(bf16, {2, 1, 2, 128}, 0), vn = T(bf16, {2, 1, 2, 128}, 1);
  Tensor kc = T(bf16, {2, 64, 2, 128}, 2), vc = T(bf16, {2, 64, 2, 128}, 3);
  Tensor sl = T(i32, {2}, 4), bt = T(i32, {2, 4}, 5);
  Tensor pk = T(bf16, {9, 16, 2, 128}, 6), pv = T(bf16, {9, 16, 2, 128}, 7);
  expect_invalid(
      [&] {
        Tensor k2 = T(bf16, {2, 64, 2, 64}, 2);
        append_kv(kn, vn, k2, vc, nullptr, sl, false, kS);
      },
      "append_kv", "k_cache");
  expect_invalid(
      [&] {
        Tensor v2 = T(bf16, {2, 2, 2, 128}, 1);
        append_kv(kn, v2, kc, vc, nullptr, sl, false, kS);
      },
      "append_kv", "v_new");
  expect_invalid(
      [&] {
        Tensor v2 = T(f16, {2, 1, 2, 128}, 1);
        append_kv(kn, v2, kc, vc, nullptr, sl, false, kS);
      },
      "append_kv", "v_new", "f16");
  expect_invalid(
      [&] {
        Tensor k3 = T(bf16, {2, 2, 128}, 0);
        append_kv(k3, vn, kc, vc, nullptr, sl, false, kS);
      },
      "append_kv", "k_new", "4-D");
  expect_invalid(
      [&] {
        Tensor s2 = T(i32, {3}, 4);
        append_kv(kn, vn, pk, pv, &bt, s2, false, kS);
      },
      "append_kv", "seqlens");
  expect_invalid([&] { append_kv(on_cpu(kn), vn, kc, vc, nullptr, sl, false, kS); }, "append_kv",
                 "k_new", "CUDA tensor");
  expect_invalid([&] { append_kv(on_cpu(kn), vn, pk, pv, &bt, sl, false, kS); }, "append_kv",
                 "k_new", "CUDA tensor");
}

TEST(DecodeAttentionErrors, Mla) {
  Tensor ql = T(bf16, {2, 1, 16, 512}, 0), qr = T(bf16, {2, 1, 16, 64}, 1);
  Tensor cache = T(bf16, {20, 64, 576}, 2), sl = T(i32, {2}, 3), bt = T(i32, {2, 8}, 4);
  Tensor out = T(bf16, {2, 1, 16, 512}, 5);
  DecodeParams p;
  p.block_table = &bt;
  const char* op = "mla_decode";
  expect_invalid(
      [&] {
        Tensor q2 = T(bf16, {2, 1, 16, 256}, 0);
        mla_decode(q2, qr, cache, sl, out, nullptr, p, kS);
      },
      op, "q_latent", "512");
  expect_invalid(
      [&] {
        Tensor r2 = T(bf16, {2, 1, 8, 64}, 1);
        mla_decode(ql, r2, cache, sl, out, nullptr, p, kS);
      },
      op, "q_rope", "(2, 1, 16, 64)");
  expect_invalid(
      [&] {
        Tensor c2 = T(bf16, {20, 64, 512}, 2);
        mla_decode(ql, qr, c2, sl, out, nullptr, p, kS);
      },
      op, "latent_cache", "576");
  expect_invalid(
      [&] {
        Tensor c2 = T(f16, {20, 64, 576}, 2);
        mla_decode(ql, qr, c2, sl, out, nullptr, p, kS);
      },
      op, "latent_cache", "bf16");
  expect_invalid(
      [&] {
        DecodeParams p2 = p;
        p2.softcap = 50.0;
        mla_decode(ql, qr, cache, sl, out, nullptr, p2, kS);
      },
      op, "params.softcap");
  expect_invalid(
      [&] {
        Tensor l = T(f32, {2, 1, 8}, 6);
        mla_decode(ql, qr, cache, sl, out, &l, p, kS);
      },
      op, "lse");
  expect_invalid(
      [&] {
        DecodeParams p2;  // contiguous form: (B, Smax, 576)
        mla_decode(ql, qr, cache, sl, out, nullptr, p2, kS);
      },
      op, "latent_cache", "block_table");
  expect_invalid([&] { mla_decode(on_cpu(ql), qr, cache, sl, out, nullptr, p, kS); }, op,
                 "q_latent", "CUDA tensor");
  expect_invalid(
      [&] {
        Tensor cn = T(bf16, {2, 1, 512}, 7);
        append_latent(cn, cache, &bt, sl, false, kS);
      },
      "append_latent", "latent_cache", "512");
  expect_invalid(
      [&] {
        Tensor cn = on_cpu(T(bf16, {2, 1, 576}, 7));
        append_latent(cn, cache, &bt, sl, false, kS);
      },
      "append_latent", "c_new", "CUDA tensor");
}

// The C ABI: status code, thread-local message naming op and argument; NULL lse / block_table /
// params accepted (defaults), NULL tensors rejected.
TEST(DecodeAttentionErrors, CApi) {
  auto ct = [](DType dt, std::initializer_list<int64_t> shape, int i, bool cpu = false) {
    tessel_tensor_t t{};
    std::vector<int64_t> dims(shape);
    tessel_tensor_init(&t, fake(i), static_cast<int32_t>(dt), static_cast<int32_t>(dims.size()),
                       dims.data());
    t.device_kind = cpu ? TESSEL_CPU : TESSEL_CUDA;
    return t;
  };
  tessel_tensor_t q = ct(bf16, {2, 1, 8, 128}, 0, true), k = ct(bf16, {2, 64, 2, 128}, 1),
                  v = ct(bf16, {2, 64, 2, 128}, 2), sl = ct(i32, {2}, 3),
                  out = ct(bf16, {2, 1, 8, 128}, 4);
  EXPECT_EQ(tessel_decode_attention(&q, &k, &v, nullptr, &sl, &out, nullptr, nullptr, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  std::string msg = tessel_last_error();
  EXPECT_NE(msg.find("tessel::decode_attention: argument 'q'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA tensor"), std::string::npos) << msg;
  EXPECT_EQ(tessel_decode_attention(nullptr, &k, &v, nullptr, &sl, &out, nullptr, nullptr, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  msg = tessel_last_error();
  EXPECT_NE(msg.find("'q'"), std::string::npos) << msg;
  tessel_decode_params_t p{};
  p.softcap = -1.0;
  EXPECT_EQ(tessel_decode_attention(&q, &k, &v, nullptr, &sl, &out, nullptr, &p, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("params.softcap"), std::string::npos);
  p.softcap = 0.0;
  p.max_seqlen = -5;  // reaches DecodeParams::max_seqlen through the C ABI
  EXPECT_EQ(tessel_decode_attention(&q, &k, &v, nullptr, &sl, &out, nullptr, &p, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("params.max_seqlen"), std::string::npos);
  tessel_tensor_t ql = ct(bf16, {2, 1, 16, 512}, 0, true), qr = ct(bf16, {2, 1, 16, 64}, 1),
                  cache = ct(bf16, {2, 64, 576}, 2), mo = ct(bf16, {2, 1, 16, 512}, 4);
  EXPECT_EQ(tessel_mla_decode(&ql, &qr, &cache, nullptr, &sl, &mo, nullptr, nullptr, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("tessel::mla_decode: argument 'q_latent'"),
            std::string::npos);
  tessel_tensor_t kn = ct(bf16, {2, 1, 2, 128}, 5, true), vn = ct(bf16, {2, 1, 2, 128}, 6);
  EXPECT_EQ(tessel_append_kv(&kn, &vn, &k, &v, nullptr, &sl, 0, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("tessel::append_kv: argument 'k_new'"),
            std::string::npos);
  tessel_tensor_t cn = ct(bf16, {2, 1, 576}, 5, true);
  EXPECT_EQ(tessel_append_latent(&cn, &cache, nullptr, &sl, 0, nullptr),
            TESSEL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessel_last_error()).find("'c_new'"), std::string::npos);
}

}  // namespace
}  // namespace tessel
