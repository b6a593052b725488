// GPU tests of RoPE: neox and gptj, partial rotary dim, i32/i64 positions (up to 2^17),
// Llama-3 scaling, q and k with different head counts, q/k as slices of a fused qkv buffer,
// f32/f16/bf16; backward = inverse rotation (forward then backward returns the input).
#include <gtest/gtest.h>

#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "ref/llm_ref.hpp"
#include "tessel/rope.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

struct Case {
  int64_t tokens, hq, hkv, d, rd;
  bool neox, llama3, fused;
};

using Param = std::tuple<DType, int>;
const Case kCases[] = {
    {1, 1, 1, 2, 0, true, false, false},
    {7, 4, 2, 64, 0, true, false, false},
    {33, 3, 1, 128, 64, true, true, false},
    {127, 8, 2, 128, 0, false, true, false},
    {65, 5, 3, 80, 40, false, false, false},
    {17, 4, 1, 128, 0, true, true, true},
    {9, 2, 2, 6, 4, false, false, true},
    {300, 32, 8, 128, 0, true, true, true},
    // The wide-token path (128 ... 1024 items of heads x pair vectors per token): a ragged last
    // block with idle threads (160 items), items past 2 x 256 per block; then 1152 items, past
    // that path's 4 items per thread (the flat loop again).
    {301, 16, 4, 128, 0, true, false, false},
    {50, 64, 16, 128, 0, true, true, false},
    {37, 48, 16, 128, 0, false, false, false},
    {5, 128, 16, 128, 0, true, false, false},
};

class RopeGpu : public test::GpuTest, public ::testing::WithParamInterface<Param> {};

TEST_P(RopeGpu, ForwardBackward) {
  const auto [dt, ci] = GetParam();
  const Case c = kCases[ci];
  for (DType pdt : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(pdt));
    ref::RopeConfig cfg;
    cfg.neox = c.neox;
    cfg.rotary_dim = c.rd;
    cfg.theta = c.llama3 ? 500000.0 : 10000.0;
    cfg.llama3 = c.llama3;
    RopeParams prm;
    prm.style = c.neox ? RopeStyle::neox : RopeStyle::gptj;
    prm.rotary_dim = c.rd;
    prm.theta = cfg.theta;
    prm.llama3 = c.llama3;
    std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
    for (auto& p : pos) p = rng().integer(0, 131071);
    std::vector<uint8_t> pbytes(pos.size() * dtype_size(pdt));
    for (size_t i = 0; i < pos.size(); ++i) {
      if (pdt == DType::i32)
        reinterpret_cast<int32_t*>(pbytes.data())[i] = static_cast<int32_t>(pos[i]);
      else
        reinterpret_cast<int64_t*>(pbytes.data())[i] = pos[i];
    }
    DeviceTensor pt = test::alloc(pdt, {c.tokens});
    test::upload_bytes(pt, pbytes);
    std::vector<double> qv = rng().uniform(static_cast<size_t>(c.tokens * c.hq * c.d), -2.0, 2.0);
    std::vector<double> kv = rng().uniform(static_cast<size_t>(c.tokens * c.hkv * c.d), -2.0, 2.0);
    DeviceTensor q, k, buf;
    if (c.fused) {  // q, k views into one (T, hq + 2 hkv, D) qkv buffer
      const int64_t ts = (c.hq + 2 * c.hkv) * c.d;
      q = test::alloc_view(dt, {c.tokens, c.hq, c.d}, {ts, c.d, 1});
      k = test::alloc_view(dt, {c.tokens, c.hkv, c.d}, {ts, c.d, 1}, c.hq * c.d);
    } else {
      q = test::alloc(dt, {c.tokens, c.hq, c.d});
      k = test::alloc(dt, {c.tokens, c.hkv, c.d});
    }
    test::upload_values(q, qv);
    test::upload_values(k, kv);
    rope(q.t, k.t, pt.t, prm, stream());
    sync();
    std::vector<double> rq = qv, rk = kv;
    ref::rope(rq, c.tokens, c.hq, c.d, pos, cfg, false);
    ref::rope(rk, c.tokens, c.hkv, c.d, pos, cfg, false);
    const std::vector<double> gq = test::download_values(q), gk = test::download_values(k);
    EXPECT_TRUE(test::all_close(gq, rq, dt));
    EXPECT_TRUE(test::all_close(gk, rk, dt));
    // Backward of the (rounded) output: the inverse rotation.
    std::vector<double> bq = gq, bk = gk;
    rope_backward(q.t, k.t, pt.t, prm, stream());
    sync();
    ref::rope(bq, c.tokens, c.hq, c.d, pos, cfg, true);
    ref::rope(bk, c.tokens, c.hkv, c.d, pos, cfg, true);
    EXPECT_TRUE(test::all_close(test::download_values(q), bq, dt));
    EXPECT_TRUE(test::all_close(test::download_values(k), bk, dt));
  }
}

INSTANTIATE_TEST_SUITE_P(All, RopeGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Range(0,
                                                             static_cast<int>(std::size(kCases)))),
                         test::dtype_case_name);

}  // namespace
}  // namespace tessel
