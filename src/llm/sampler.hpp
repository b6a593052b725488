// Token sampling: repetition / presence / frequency penalties, then greedy (temperature 0) or
// temperature → top-k → top-p → min-p → a draw from a seeded generator (same seed, same
// tokens). StopStrings holds back streamed text that may be the start of a stop string.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace tessel::llm {

struct SamplerConfig {
  float temperature = 0.8f;         // <= 0: greedy
  int32_t top_k = 40;               // <= 0: off
  float top_p = 0.95f;              // >= 1: off
  float min_p = 0.05f;              // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off; > 1 discourages tokens seen in the window
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;  // window of the history the penalties look at (<0: all)
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  // Picks a token from `logits` (vocab floats; modified in place by the penalties) given the
  // sequence so far (prompt + generated).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);
  const SamplerConfig& config() const { return cfg_; }
  // Greedy with no penalties: the pick depends on the logits only (may run on the device).
  bool plain_greedy() const {
    return cfg_.temperature <= 0.0f && cfg_.repetition_penalty == 1.0f &&
           cfg_.presence_penalty == 0.0f && cfg_.frequency_penalty == 0.0f;
  }

 private:
  double uniform();  // [0, 1) from the 64-bit generator, independent of the library's distributions
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// The greedy pick of Sampler::sample: the lowest index of the largest non-NaN logit (0 when
// every logit is NaN or there is none).
int32_t greedy_argmax(std::span<const float> logits);

// Applies the three penalties of `cfg` to `logits` in place (exposed for tests).
void apply_penalties(const SamplerConfig& cfg, std::span<float> logits,
                     std::span<const int32_t> history);

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds a decoded piece; returns the text that is safe to emit now. After a stop string
  // matched, stopped() is true and the stop string and all after it are dropped.
  std::string feed(const std::string& piece);
  // Text still held back (emit at the end of generation when no stop string matched).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace tessel::llm
