// CPU tests of the float64 references (src/ref) against hand-computed values, and of the
// comparison helpers of test_util.hpp (a comparison that cannot fail is a defect).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "ref/reference.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using ref::Storage;
using test::SeededTest;
using Vec = std::vector<double>;

// ---- f16 / bf16 conversions -------------------------------------------------------------

TEST(RefConvert, F16KnownBitPatterns) {
  EXPECT_EQ(ref::float_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(ref::float_to_f16_bits(-2.0f), 0xC000);
  EXPECT_EQ(ref::float_to_f16_bits(0.5f), 0x3800);
  EXPECT_EQ(ref::float_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(ref::float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(ref::float_to_f16_bits(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(ref::float_to_f16_bits(65519.0f), 0x7BFF);  // below the tie
  EXPECT_EQ(ref::float_to_f16_bits(65520.0f), 0x7C00);  // tie rounds to even: inf
  EXPECT_EQ(ref::float_to_f16_bits(1e6f), 0x7C00);
  EXPECT_EQ(ref::float_to_f16_bits(-1e6f), 0xFC00);
  EXPECT_EQ(ref::float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(ref::float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(ref::float_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(ref::float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(ref::float_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(ref::float_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);     // tie 1.5 ulp -> even 2
  EXPECT_EQ(ref::float_to_f16_bits(std::ldexp(1023.5f, -24)), 0x0400);  // carries to normal
  // Ties in the normal range: 1 + 2^-11 is halfway between 0x3C00 and 0x3C01.
  EXPECT_EQ(ref::float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(ref::float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(ref::float_to_f16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(ref::float_to_f16_bits(3.14159265f), 0x4248);
  const uint16_t nan = ref::float_to_f16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  // A signalling NaN whose payload lives in the low bits must not become inf.
  const uint16_t snan = ref::float_to_f16_bits(std::bit_cast<float>(0x7F800001u));
  EXPECT_TRUE(std::isnan(ref::f16_bits_to_float(snan)));

  EXPECT_EQ(ref::f16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(ref::f16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(ref::f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(ref::f16_bits_to_float(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(ref::f16_bits_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(ref::f16_bits_to_float(0xFFFF)));  // the poison pattern
}

TEST(RefConvert, F16RoundTripsEveryBitPattern) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = ref::f16_bits_to_float(static_cast<uint16_t>(b));
    const uint16_t back = ref::float_to_f16_bits(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(ref::f16_bits_to_float(back))) << std::hex << b;
    } else {
      ASSERT_EQ(back, b) << std::hex << "pattern 0x" << b;
      ASSERT_EQ(ref::double_to_f16_bits(f), b) << std::hex << "pattern 0x" << b;
    }
  }
}

TEST(RefConvert, Bf16KnownBitPatterns) {
  EXPECT_EQ(ref::float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(ref::float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(ref::float_to_bf16_bits(3.14159265f), 0x4049);
  // 1 + 2^-8 is halfway between 0x3F80 and 0x3F81: to even.
  EXPECT_EQ(ref::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(ref::float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(ref::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(ref::float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // -> inf
  EXPECT_EQ(ref::float_to_bf16_bits(std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7F);  // max finite
  EXPECT_EQ(ref::float_to_bf16_bits(std::bit_cast<float>(0x00010000u)), 0x0001);  // subnormal
  EXPECT_EQ(ref::float_to_bf16_bits(-0.0f), 0x8000);
  const uint16_t nan = ref::float_to_bf16_bits(std::bit_cast<float>(0x7F800001u));
  EXPECT_TRUE(std::isnan(ref::bf16_bits_to_float(nan)));  // low-payload NaN stays NaN
  EXPECT_EQ(ref::bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(ref::bf16_bits_to_float(0x7F7F), std::bit_cast<float>(0x7F7F0000u));
  EXPECT_TRUE(std::isnan(ref::bf16_bits_to_float(0xFFFF)));  // the poison pattern
}

TEST(RefConvert, Bf16RoundTripsEveryBitPattern) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = ref::bf16_bits_to_float(static_cast<uint16_t>(b));
    const uint16_t back = ref::float_to_bf16_bits(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(ref::bf16_bits_to_float(back))) << std::hex << b;
    } else {
      ASSERT_EQ(back, b) << std::hex << "pattern 0x" << b;
      ASSERT_EQ(ref::double_to_bf16_bits(f), b) << std::hex << "pattern 0x" << b;
    }
  }
}

TEST(RefConvert, DoubleRoundsOnlyOnce) {
  // 1 + 2^-11 + 2^-40 is just above an f16 tie. double -> float rounds it to the tie
  // 1 + 2^-11, which would then go to even (0x3C00); the correct answer is 0x3C01.
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(ref::float_to_f16_bits(static_cast<float>(d)), 0x3C00);  // the double rounding
  EXPECT_EQ(ref::double_to_f16_bits(d), 0x3C01);
  EXPECT_EQ(ref::double_to_f16_bits(1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40)), 0x3C00);
  EXPECT_EQ(ref::double_to_f16_bits(1.0 + std::ldexp(1.0, -11)), 0x3C00);  // exact tie
  const double b = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(ref::double_to_bf16_bits(b), 0x3F81);
  EXPECT_EQ(ref::double_to_bf16_bits(-b), 0xBF81);
  EXPECT_EQ(ref::double_to_f16_bits(1e300), 0x7C00);
  EXPECT_EQ(ref::double_to_bf16_bits(-1e300), 0xFF80);
  EXPECT_EQ(ref::quantize(Storage::f32, 1e300), std::numeric_limits<double>::infinity());
  EXPECT_EQ(ref::quantize(Storage::f32, 0x1.fffffefp+127), std::numeric_limits<float>::max());
  EXPECT_EQ(ref::quantize(Storage::f32, 0x1.ffffffp+127), std::numeric_limits<double>::infinity());
  EXPECT_EQ(ref::double_to_f16_bits(1e-300), 0x0000);
  EXPECT_EQ(ref::double_to_bf16_bits(1e-300), 0x0000);
  EXPECT_EQ(ref::double_to_f16_bits(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)), 0x0001);
}

TEST(RefConvert, EncodeDecodeQuantize) {
  const Vec values = {1.0, -0.1, 3.14159265358979, 1e-3, 123456.789, -7.0 / 3.0};
  for (Storage s : {Storage::f32, Storage::f16, Storage::bf16}) {
    SCOPED_TRACE(ref::storage_name(s));
    std::vector<uint8_t> bytes(values.size() * ref::storage_size(s));
    ref::encode(s, values, bytes.data());
    const Vec back = ref::decode(s, bytes.data(), values.size());
    const Vec q = ref::quantize(s, values);
    ASSERT_EQ(back.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(back[i], q[i]);
      EXPECT_EQ(ref::quantize(s, q[i]), q[i]);  // idempotent
      if (std::fabs(values[i]) < 6e4 || s != Storage::f16) {
        EXPECT_LE(std::fabs(q[i] - values[i]), ref::unit_roundoff(s) * std::fabs(values[i]))
            << values[i];
      }
    }
  }
  EXPECT_EQ(ref::quantize(Storage::f16, 123456.789), std::numeric_limits<double>::infinity());
  EXPECT_EQ(ref::quantize(Storage::f32, 0.1), static_cast<double>(0.1f));
  EXPECT_EQ(ref::storage_size(Storage::f32), 4u);
  EXPECT_EQ(ref::storage_size(Storage::bf16), 2u);
  EXPECT_EQ(ref::unit_roundoff(Storage::bf16), std::ldexp(1.0, -8));
}

// ---- element-wise -----------------------------------------------------------------------

TEST(RefElementwise, UnaryKnownValues) {
  using ref::UnaryOp;
  EXPECT_EQ(ref::apply(UnaryOp::identity, -1.5), -1.5);
  EXPECT_EQ(ref::apply(UnaryOp::neg, 2.0), -2.0);
  EXPECT_EQ(ref::apply(UnaryOp::abs, -3.0), 3.0);
  EXPECT_DOUBLE_EQ(ref::apply(UnaryOp::exp, 1.0), 2.718281828459045);
  EXPECT_EQ(ref::apply(UnaryOp::relu, -2.0), 0.0);
  EXPECT_EQ(ref::apply(UnaryOp::relu, 2.5), 2.5);
  EXPECT_EQ(ref::apply(UnaryOp::sigmoid, 0.0), 0.5);
  EXPECT_DOUBLE_EQ(ref::apply(UnaryOp::sigmoid, 2.0), 0.8807970779778823);
  EXPECT_EQ(ref::apply(UnaryOp::sigmoid, -1000.0), 0.0);  // no NaN from exp overflow
  EXPECT_EQ(ref::apply(UnaryOp::sigmoid, 1000.0), 1.0);
  EXPECT_DOUBLE_EQ(ref::apply(UnaryOp::silu, 1.0), 0.7310585786300049);
  EXPECT_DOUBLE_EQ(ref::apply(UnaryOp::silu, -1.0), -0.2689414213699951);
  EXPECT_EQ(ref::apply(UnaryOp::silu, -1000.0), -0.0);
  EXPECT_EQ(ref::apply(UnaryOp::square, -3.0), 9.0);
  const Vec y = ref::unary(UnaryOp::square, Vec{1, 2, 3});
  EXPECT_EQ(y, (Vec{1, 4, 9}));
  Vec inplace = {1, -2};
  ref::unary(UnaryOp::neg, inplace, inplace);
  EXPECT_EQ(inplace, (Vec{-1, 2}));
}

TEST(RefElementwise, BinaryKnownValues) {
  using ref::BinaryOp;
  EXPECT_EQ(ref::apply(BinaryOp::add, 1.5, 2.0), 3.5);
  EXPECT_EQ(ref::apply(BinaryOp::sub, 1.5, 2.0), -0.5);
  EXPECT_EQ(ref::apply(BinaryOp::mul, 1.5, 2.0), 3.0);
  EXPECT_EQ(ref::apply(BinaryOp::div, 1.5, 2.0), 0.75);
  EXPECT_EQ(ref::apply(BinaryOp::maximum, -1.0, 2.0), 2.0);
  EXPECT_EQ(ref::apply(BinaryOp::minimum, -1.0, 2.0), -1.0);
  EXPECT_EQ(ref::apply(BinaryOp::maximum, std::nan(""), 2.0), 2.0);  // fmax semantics
}

TEST(RefElementwise, BroadcastModes) {
  using ref::BinaryOp;
  using ref::Broadcast;
  const Vec a = {1, 2, 3, 4, 5, 6};  // (2, 3)
  EXPECT_EQ(ref::binary(BinaryOp::add, a, Vec{10, 20, 30, 40, 50, 60}, 2, 3, Broadcast::same),
            (Vec{11, 22, 33, 44, 55, 66}));
  EXPECT_EQ(ref::binary(BinaryOp::sub, a, Vec{1, 2, 3}, 2, 3, Broadcast::row),
            (Vec{0, 0, 0, 3, 3, 3}));
  EXPECT_EQ(ref::binary(BinaryOp::mul, a, Vec{-2}, 2, 3, Broadcast::scalar),
            (Vec{-2, -4, -6, -8, -10, -12}));
  EXPECT_EQ(ref::binary(BinaryOp::div, a, Vec{1, 2, 4}, 2, 3, Broadcast::row),
            (Vec{1, 1, 0.75, 4, 2.5, 1.5}));
  EXPECT_EQ(ref::broadcast_size(Broadcast::same, 2, 3), 6u);
  EXPECT_EQ(ref::broadcast_size(Broadcast::row, 2, 3), 3u);
  EXPECT_EQ(ref::broadcast_size(Broadcast::scalar, 2, 3), 1u);
  // b of the wrong size for the mode is rejected.
  EXPECT_THROW(ref::binary(BinaryOp::add, a, Vec{1, 2}, 2, 3, Broadcast::row),
               std::invalid_argument);
  EXPECT_THROW(ref::binary(BinaryOp::add, a, Vec{1, 2, 3}, 2, 3, Broadcast::same),
               std::invalid_argument);
  EXPECT_THROW(ref::binary(BinaryOp::add, a, Vec{1, 2}, 2, 3, Broadcast::scalar),
               std::invalid_argument);
}

// ---- data movement / reductions ---------------------------------------------------------

TEST(RefTranspose, KnownAndRoundTrip) {
  const Vec a = {1, 2, 3, 4, 5, 6};  // (2, 3)
  EXPECT_EQ(ref::transpose(a, 2, 3), (Vec{1, 4, 2, 5, 3, 6}));
  Vec big(7 * 13);
  std::iota(big.begin(), big.end(), 0.0);
  EXPECT_EQ(ref::transpose(ref::transpose(big, 7, 13), 13, 7), big);
  EXPECT_EQ(ref::transpose(Vec{42}, 1, 1), (Vec{42}));
  EXPECT_THROW(ref::transpose(a, 4, 2), std::invalid_argument);
}

TEST(RefReduce, KnownSums) {
  Vec v(100);
  std::iota(v.begin(), v.end(), 1.0);
  EXPECT_EQ(ref::reduce_sum(v), 5050.0);
  EXPECT_EQ(ref::reduce_sum(Vec{}), 0.0);
  // Compensated: naive left-to-right summation gives 0 here.
  EXPECT_EQ(ref::reduce_sum(Vec{1e16, 1.0, -1e16}), 1.0);
  EXPECT_EQ(ref::reduce_sum(Vec{1.0, 1e100, 1.0, -1e100}), 2.0);
  EXPECT_EQ(ref::reduce_sum_rows(Vec{1, 2, 3, 4, 5, 6}, 2, 3), (Vec{6, 15}));
  EXPECT_EQ(ref::reduce_sum_rows(Vec{1, 2, 3, 4, 5, 6}, 3, 2), (Vec{3, 7, 11}));
  EXPECT_EQ(ref::reduce_sum_rows(Vec{}, 3, 0), (Vec{0, 0, 0}));
  EXPECT_THROW(ref::reduce_sum_rows(Vec{1, 2, 3}, 2, 2), std::invalid_argument);
}

// ---- softmax ------------------------------------------------------------------------------

TEST(RefSoftmax, KnownValues) {
  const Vec y = ref::softmax(Vec{0.0, std::log(2.0)}, 1, 2);
  EXPECT_NEAR(y[0], 1.0 / 3.0, 1e-15);
  EXPECT_NEAR(y[1], 2.0 / 3.0, 1e-15);
  // Large magnitudes: no overflow (exp(1000) is inf in double).
  const Vec big = ref::softmax(Vec{1000.0, 1000.0, -1000.0}, 1, 3);
  EXPECT_EQ(big[0], 0.5);
  EXPECT_EQ(big[1], 0.5);
  EXPECT_EQ(big[2], 0.0);
  EXPECT_EQ(ref::softmax(Vec{-3.0}, 1, 1), (Vec{1.0}));
}

TEST_F(SeededTest, RefSoftmaxRowsSumToOne) {
  const int64_t rows = 9, cols = 1000;
  const Vec x = rng().uniform(rows * cols, -20.0, 20.0);
  const Vec y = ref::softmax(x, rows, cols);
  const Vec sums = ref::reduce_sum_rows(y, rows, cols);
  for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(sums[r], 1.0, 1e-14) << "row " << r;
  for (double v : y) {
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
  }
  // Shift invariance: softmax(x + c) == softmax(x).
  Vec shifted = x;
  for (double& v : shifted) v += 50.0;
  const Vec y2 = ref::softmax(shifted, rows, cols);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y2[i], y[i], 1e-12 * (1 + y[i]));
}

TEST(RefSoftmax, ConstantRowIsUniform) {
  for (int64_t cols : {1, 7, 4097}) {
    const Vec x(static_cast<size_t>(cols), 3.25);
    const Vec y = ref::softmax(x, 1, cols);
    for (double v : y) EXPECT_DOUBLE_EQ(v, 1.0 / static_cast<double>(cols));
  }
}

TEST_F(SeededTest, RefSoftmaxBackwardMatchesFiniteDifference) {
  // L(x) = sum_i g_i * softmax(x)_i, so dL/dx = softmax_backward(softmax(x), g).
  const int64_t rows = 3, cols = 17;
  const Vec x = rng().uniform(rows * cols, -3.0, 3.0);
  const Vec g = rng().uniform(rows * cols, -1.0, 1.0);
  const Vec y = ref::softmax(x, rows, cols);
  const Vec dx = ref::softmax_backward(y, g, rows, cols);
  auto loss = [&](const Vec& xv) {
    const Vec yv = ref::softmax(xv, rows, cols);
    double l = 0.0;
    for (size_t i = 0; i < yv.size(); ++i) l += g[i] * yv[i];
    return l;
  };
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (loss(xp) - loss(xm)) / (2 * h);
    EXPECT_NEAR(dx[i], fd, 1e-8) << "element " << i;
  }
  // Each row of dx sums to zero (softmax outputs always sum to one).
  for (double s : ref::reduce_sum_rows(dx, rows, cols)) EXPECT_NEAR(s, 0.0, 1e-14);
}

TEST(RefSoftmax, SizeChecks) {
  EXPECT_THROW(ref::softmax(Vec{1, 2, 3}, 2, 2), std::invalid_argument);
  EXPECT_THROW(ref::softmax_backward(Vec{1, 2}, Vec{1}, 1, 2), std::invalid_argument);
  EXPECT_THROW(ref::softmax(Vec{}, -1, 0), std::invalid_argument);
}

// ---- comparison helpers (test_util.hpp) -------------------------------------------------

TEST_F(SeededTest, CompareHelpersCatchBadOutputs) {
  using test::all_close;
  using test::tolerance;
  const Vec ref = rng().uniform(4097, -2.0, 2.0);
  for (DType dt : test::kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // The reference rounded to the dtype passes...
    EXPECT_TRUE(all_close(ref::quantize(test::storage(dt), ref), ref, dt));
    // ...one poisoned (unwritten) element fails...
    Vec poisoned = ref;
    poisoned[4096] = test::decode(dt, std::vector<uint8_t>(dtype_size(dt), 0xFF))[0];
    ASSERT_TRUE(std::isnan(poisoned[4096]));
    EXPECT_FALSE(all_close(poisoned, ref, dt));
    // ...as does inf, one element off by 5% of the scale, and a uniform relative bias.
    Vec inf = ref;
    inf[0] = std::numeric_limits<double>::infinity();
    EXPECT_FALSE(all_close(inf, ref, dt));
    Vec one_off = ref;
    one_off[17] += 0.1;
    EXPECT_FALSE(all_close(one_off, ref, dt));
    Vec biased = ref;
    for (double& v : biased) v *= 1.0 + 2.5 * tolerance(dt).rel_l2;
    EXPECT_FALSE(all_close(biased, ref, dt));
  }
  EXPECT_FALSE(all_close(Vec{1.0}, Vec{std::nan("")}, DType::f32));  // NaN reference
  EXPECT_FALSE(all_close(Vec{1.0, 2.0}, Vec{1.0}, DType::f32));      // size mismatch
  EXPECT_TRUE(all_close(Vec{0.0, 0.0}, Vec{0.0, 0.0}, DType::f32));
  EXPECT_FALSE(all_close(Vec{0.0, 1e-3}, Vec{0.0, 0.0}, DType::f32));  // all-zero reference
  // Exact tolerance: any difference fails.
  EXPECT_FALSE(all_close(Vec{1.0}, Vec{std::nextafter(1.0, 2.0)}, test::Tolerance{0, 0}));
}

TEST_F(SeededTest, BitExactCatchesOneByte) {
  const std::vector<uint8_t> a = rng().bytes(1000, 8);
  EXPECT_TRUE(test::bit_exact(a, a, 8));
  std::vector<uint8_t> b = a;
  b[7 * 8 + 3] ^= 0x10;
  EXPECT_FALSE(test::bit_exact(b, a, 8));
  EXPECT_FALSE(test::bit_exact(std::vector<uint8_t>(a.begin(), a.end() - 8), a, 8));
}

TEST_F(SeededTest, RandomInputsAreNeverZeroNorPoison) {
  for (double v : rng().uniform(10000, -1.0, 1.0)) ASSERT_GE(std::fabs(v), 1e-3);
  for (double v : rng().signed_magnitude(1000, 0.25, 4.0)) ASSERT_GE(std::fabs(v), 0.25);
  for (double v : rng().small_halves(1000)) {
    ASSERT_NE(v, 0.0);
    ASSERT_EQ(v * 2, std::round(v * 2));
  }
  const std::vector<uint8_t> bytes = rng().bytes(100000, 1);
  for (uint8_t b : bytes) ASSERT_NE(b, 0xFF);
  // Fresh seeds: two draws from std::random_device virtually never coincide.
  if (std::getenv("TESSEL_TEST_SEED") == nullptr) {
    EXPECT_NE(test::fresh_seed(), test::fresh_seed());
  }
}

TEST(TestUtil, ElementOffsetsOfStridedViews) {
  Tensor t = Tensor::contiguous(reinterpret_cast<void*>(0x1000), DType::f32, {2, 3});
  EXPECT_EQ(test::element_offsets(t), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  t.strides[0] = 1;
  t.strides[1] = 2;  // transposed view of a (3, 2) buffer
  EXPECT_EQ(test::element_offsets(t), (std::vector<int64_t>{0, 2, 4, 1, 3, 5}));
  t.strides[0] = 10;
  t.strides[1] = 1;  // row pitch 10
  EXPECT_EQ(test::element_offsets(t), (std::vector<int64_t>{0, 1, 2, 10, 11, 12}));
  Tensor s = Tensor::contiguous(reinterpret_cast<void*>(0x1000), DType::f32, {});
  EXPECT_EQ(test::element_offsets(s), (std::vector<int64_t>{0}));
}

// ---- docs/testing.md carries the same tolerance table ----------------------------------

// Rows of the form "| `f32` | 1e-5 | 2e-5 | ..." in the "Tolerances" table.
TEST(Docs, ToleranceTableMatchesTestUtil) {
  const std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
  std::ifstream in(root / "docs" / "testing.md");
  if (!in) GTEST_SKIP() << "docs/testing.md not found next to " << __FILE__;
  std::map<std::string, test::Tolerance> doc;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    std::stringstream ss(line);
    std::string cell, name, rel, mx;
    std::getline(ss, cell, '|');  // empty before the first '|'
    std::getline(ss, name, '|');
    std::getline(ss, rel, '|');
    std::getline(ss, mx, '|');
    const auto tick = name.find('`');
    name = name.substr(tick + 1, name.find('`', tick + 1) - tick - 1);
    try {
      doc[name] = {std::stod(rel), std::stod(mx)};
    } catch (const std::exception&) {
      // Not a numeric row (e.g. "exact"); handled below.
      doc[name] = {-1, -1};
    }
  }
  for (DType dt : test::kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    ASSERT_TRUE(doc.count(dtype_name(dt))) << "docs/testing.md has no row for this dtype";
    EXPECT_EQ(doc[dtype_name(dt)].rel_l2, test::tolerance(dt).rel_l2);
    EXPECT_EQ(doc[dtype_name(dt)].max_abs, test::tolerance(dt).max_abs);
  }
  for (DType dt : {DType::i32, DType::i64, DType::u8, DType::f8_e4m3, DType::f8_e5m2}) {
    EXPECT_EQ(test::tolerance(dt).rel_l2, 0.0) << dtype_name(dt);
    EXPECT_EQ(test::tolerance(dt).max_abs, 0.0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace tessel
