// GPU tests of dropout: the mask is bit-exact against the host Philox 4x32-10 reference,
// values against the float64 reference, determinism for (seed, offset), different offsets
// give different masks, backward regenerates the mask, keep rate ≈ 1 - p.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ref/llm_ref.hpp"
#include "tessel/dropout.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

TEST(PhiloxReference, KnownAnswer) {
  // Random123 known-answer vectors for philox4x32_10.
  auto r = ref::philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  r = ref::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(r[0], 0xd16cfe09u);
  EXPECT_EQ(r[1], 0x94fdccebu);
  EXPECT_EQ(r[2], 0x5001e420u);
  EXPECT_EQ(r[3], 0x24126ea1u);
}

using Param = std::tuple<DType, int64_t>;
class DropoutGpu : public test::GpuTest, public ::testing::WithParamInterface<Param> {};

TEST_P(DropoutGpu, MatchesReferenceAndRegenerates) {
  const auto [dt, n] = GetParam();
  // 1e-6 rounds to a threshold of 0 (all kept); 1 - 1e-6 to 2^16 (all dropped, as p = 1).
  for (double p : {0.0, 0.1, 0.5, 1.0, 1e-6, 1.0 - 1e-6}) {
    SCOPED_TRACE("p " + std::to_string(p));
    const uint64_t seed = static_cast<uint64_t>(rng().integer(0, int64_t{1} << 62));
    const uint64_t offset = static_cast<uint64_t>(rng().integer(0, 1000000));
    std::vector<double> xv = rng().uniform(static_cast<size_t>(n), -3.0, 3.0);
    std::vector<double> gv = rng().uniform(static_cast<size_t>(n), -3.0, 3.0);
    DeviceTensor x = test::to_device(dt, {n}, xv), dy = test::to_device(dt, {n}, gv);
    DeviceTensor y = test::alloc(dt, {n}), y2 = test::alloc(dt, {n}), dx = test::alloc(dt, {n});
    DeviceTensor mask = test::alloc(DType::u8, {n});
    dropout_with_mask(x.t, y.t, mask.t, p, seed, offset, stream());
    dropout(x.t, y2.t, p, seed, offset, stream());
    dropout_backward(dy.t, dx.t, p, seed, offset, stream());
    sync();
    const std::vector<uint8_t> m = ref::dropout_mask(static_cast<size_t>(n), p, seed, offset);
    EXPECT_TRUE(test::bit_exact(test::download_bytes(mask), m, 1));
    const std::vector<double> ry = ref::dropout(xv, p, seed, offset);
    if (p < 1.0) {
      EXPECT_TRUE(test::all_close(test::download_values(y), ry, dt));
      EXPECT_TRUE(test::all_close(test::download_values(dx), ref::dropout(gv, p, seed, offset), dt));
    } else {
      for (double v : test::download_values(y)) ASSERT_EQ(v, 0.0);
    }
    EXPECT_TRUE(test::bit_exact(test::download_bytes(y2), test::download_bytes(y), dtype_size(dt)));
    // Rate and offset checks where the mask is random (0 < threshold < 2^16).
    const uint32_t thr = ref::dropout_threshold(p);
    if (n >= 100000 && thr > 0 && thr < 65536) {
      size_t kept = 0;
      for (uint8_t b : m) kept += b;
      const double rate = static_cast<double>(kept) / static_cast<double>(n);
      EXPECT_NEAR(rate, 1.0 - p, 5.0 * std::sqrt(p * (1 - p) / static_cast<double>(n)));
      // Another offset, another mask.
      dropout_with_mask(x.t, y2.t, mask.t, p, seed, offset + 1, stream());
      sync();
      EXPECT_NE(test::download_bytes(mask), m);
    }
  }
}

// Unaligned views take the scalar path and must produce the same mask.
TEST_P(DropoutGpu, UnalignedView) {
  const auto [dt, n] = GetParam();
  std::vector<double> xv = rng().uniform(static_cast<size_t>(n), -3.0, 3.0);
  DeviceTensor x = test::alloc(dt, {n}, 3);
  test::upload_values(x, xv);
  DeviceTensor y = test::alloc(dt, {n}, 1), mask = test::alloc(DType::u8, {n}, 1);
  dropout_with_mask(x.t, y.t, mask.t, 0.3, 1234, 99, stream());
  sync();
  EXPECT_TRUE(test::bit_exact(test::download_bytes(mask), ref::dropout_mask(static_cast<size_t>(n), 0.3, 1234, 99), 1));
  EXPECT_TRUE(test::all_close(test::download_values(y), ref::dropout(xv, 0.3, 1234, 99), dt));
  EXPECT_TRUE(test::outside_untouched(y));
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_n" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, DropoutGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(1, 7, 127, 4097, 1000003)),
                         name);

}  // namespace
}  // namespace tessel
