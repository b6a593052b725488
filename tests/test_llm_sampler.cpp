// The engine's sampler (src/llm/sampler): greedy, temperature, top-k, top-p, min-p, penalties,
// seeded determinism and stop-string streaming.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "llm/sampler.hpp"

namespace tessel::llm {
namespace {

SamplerConfig plain(float temperature) {
  SamplerConfig c;
  c.temperature = temperature;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  return c;
}

std::map<int32_t, int> histogram(const SamplerConfig& c, std::vector<float> logits, int draws) {
  Sampler s(c);
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> l = logits;
    ++h[s.sample(l, {})];
  }
  return h;
}

TEST(LlmSampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(plain(0));
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
}

// The 8-lane greedy search against std::max_element on ragged lengths (ties, tails, NaN).
TEST(LlmSampler, GreedyMatchesMaxElementOnRaggedRows) {
  Sampler s(plain(0));
  std::mt19937 rng(3);
  for (int n : {1, 7, 8, 9, 31, 1000, 128256}) {
    std::vector<float> l(static_cast<size_t>(n));
    for (float& x : l) x = static_cast<float>(rng() % 50) * 0.25f - 6.f;  // many ties
    if (n > 3) l[2] = NAN;
    std::vector<float> ref = l;
    for (float& x : ref)
      if (std::isnan(x)) x = -INFINITY;
    const auto want = std::max_element(ref.begin(), ref.end()) - ref.begin();
    EXPECT_EQ(s.sample(l, {}), want) << "n " << n;
    l[n - 1] = 100.f;  // the maximum in the tail
    EXPECT_EQ(s.sample(l, {}), n - 1) << "n " << n;
  }
}

TEST(LlmSampler, TemperatureFollowsSoftmax) {
  // logits ln(1), ln(2), ln(3), ln(4): probabilities 0.1 .. 0.4 at temperature 1.
  const std::vector<float> l = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};
  const int n = 40000;
  const auto h = histogram(plain(1.0f), l, n);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(h.count(i) ? h.at(i) / double(n) : 0, 0.1 * (i + 1), 0.01);
  // Low temperature concentrates on the maximum.
  const auto cold = histogram(plain(0.05f), l, 2000);
  EXPECT_GT(cold.at(3), 1990);
}

TEST(LlmSampler, TopKTopPMinP) {
  const std::vector<float> l = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};
  SamplerConfig k = plain(1.0f);
  k.top_k = 2;
  auto h = histogram(k, l, 20000);
  EXPECT_EQ(h.count(0) + h.count(1), 0u);
  EXPECT_NEAR(h.at(3) / 20000.0, 4.0 / 7.0, 0.015);
  SamplerConfig p = plain(1.0f);
  p.top_p = 0.65f;  // 0.4 + 0.3 reaches 0.65: keeps {3, 2}
  h = histogram(p, l, 5000);
  EXPECT_EQ(std::set<int32_t>({2, 3}), [&] {
    std::set<int32_t> s;
    for (auto& [t, c] : h) s.insert(t);
    return s;
  }());
  SamplerConfig m = plain(1.0f);
  m.min_p = 0.45f;  // keeps p >= 0.18: {1, 2, 3}
  h = histogram(m, l, 5000);
  EXPECT_EQ(h.count(0), 0u);
  EXPECT_GT(h.at(1), 0);
}

TEST(LlmSampler, SameSeedSameTokens) {
  const std::vector<float> l = {0.3f, 0.1f, 0.2f, 0.25f, 0.15f};
  SamplerConfig c = plain(1.0f);
  c.seed = 1234;
  Sampler a(c), b(c);
  c.seed = 1235;
  Sampler other(c);
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> x = l, y = l, z = l;
    const int32_t ta = a.sample(x, {});
    EXPECT_EQ(ta, b.sample(y, {}));
    differ += ta != other.sample(z, {});
  }
  EXPECT_GT(differ, 20);
}

TEST(LlmSampler, Penalties) {
  SamplerConfig c = plain(0);
  c.repetition_penalty = 2.0f;
  std::vector<float> l = {4.f, -1.f, 3.f};
  const std::vector<int32_t> hist = {0, 1, 1};
  apply_penalties(c, l, hist);
  EXPECT_FLOAT_EQ(l[0], 2.f);   // positive: divided
  EXPECT_FLOAT_EQ(l[1], -2.f);  // negative: multiplied (once, however often seen)
  EXPECT_FLOAT_EQ(l[2], 3.f);
  c = plain(0);
  c.presence_penalty = 0.5f;
  c.frequency_penalty = 0.25f;
  l = {4.f, -1.f, 3.f};
  apply_penalties(c, l, hist);
  EXPECT_FLOAT_EQ(l[0], 4.f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[1], -1.f - 0.5f - 0.5f);
  // The window only sees the last penalty_last_n tokens.
  c.penalty_last_n = 2;
  l = {4.f, -1.f, 3.f};
  apply_penalties(c, l, hist);
  EXPECT_FLOAT_EQ(l[0], 4.f);
  // Greedy with a repetition penalty switches away from the seen token.
  SamplerConfig g = plain(0);
  g.repetition_penalty = 2.0f;
  Sampler s(g);
  std::vector<float> x = {4.f, 3.f};
  EXPECT_EQ(s.sample(x, std::vector<int32_t>{0}), 1);
}

TEST(LlmSampler, StopStringsHoldBackPrefixes) {
  StopStrings s({"</end>", "STOP"});
  std::string out;
  out += s.feed("Hello </");
  EXPECT_EQ(out, "Hello ");  // "</" may start "</end>"
  out += s.feed("b> ST");
  EXPECT_EQ(out, "Hello </b> ");
  out += s.feed("OP and more");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out, "Hello </b> ");
  EXPECT_EQ(s.flush(), "");
  StopStrings t({"xyz"});
  EXPECT_EQ(t.feed("abx"), "ab");
  EXPECT_EQ(t.flush(), "x");
  EXPECT_FALSE(t.stopped());
}

}  // namespace
}  // namespace tessel::llm
