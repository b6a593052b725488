#include "llm/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

namespace tessel::llm {

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void apply_penalties(const SamplerConfig& cfg, std::span<float> logits,
                     std::span<const int32_t> history) {
  if (cfg.repetition_penalty == 1.0f && cfg.presence_penalty == 0.0f &&
      cfg.frequency_penalty == 0.0f)
    return;
  size_t start = 0;
  if (cfg.penalty_last_n >= 0 && history.size() > static_cast<size_t>(cfg.penalty_last_n))
    start = history.size() - static_cast<size_t>(cfg.penalty_last_n);
  std::unordered_map<int32_t, int> counts;
  for (size_t i = start; i < history.size(); ++i)
    if (history[i] >= 0 && static_cast<size_t>(history[i]) < logits.size()) ++counts[history[i]];
  for (const auto& [tok, n] : counts) {
    float& l = logits[tok];
    if (cfg.repetition_penalty != 1.0f)
      l = l > 0 ? l / cfg.repetition_penalty : l * cfg.repetition_penalty;
    l -= cfg.presence_penalty + cfg.frequency_penalty * static_cast<float>(n);
  }
}

// Greedy; ties go to the lowest id, NaN is never the maximum (as std::max_element). The
// maximum is found 8 floats at a time first: a 128k vocabulary per row per step is host time
// that every decode step pays (std::max_element: ~70 us per row).
int32_t greedy_argmax(std::span<const float> logits) {
  // Two 4-lane accumulators: native SSE on every x86-64 (an 8-lane vector without AVX is
  // split into scalar code and is slower than a plain loop).
  typedef float v4 __attribute__((vector_size(16)));
  const size_t n = logits.size(), n8 = n / 8 * 8;
  float mx = -INFINITY;
  if (n8 > 0) {
    v4 a = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, b = a;
    for (size_t i = 0; i < n8; i += 8) {
      v4 x, y;
      std::memcpy(&x, logits.data() + i, sizeof x);
      std::memcpy(&y, logits.data() + i + 4, sizeof y);
      a = x > a ? x : a;  // NaN compares false: never taken
      b = y > b ? y : b;
    }
    for (int l = 0; l < 4; ++l) {
      mx = a[l] > mx ? a[l] : mx;
      mx = b[l] > mx ? b[l] : mx;
    }
  }
  for (size_t i = n8; i < n; ++i) mx = logits[i] > mx ? logits[i] : mx;
  for (size_t i = 0; i < n; ++i)
    if (logits[i] == mx) return static_cast<int32_t>(i);
  return 0;  // every logit NaN (or empty)
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  apply_penalties(cfg_, logits, history);
  const int32_t n = static_cast<int32_t>(logits.size());
  if (cfg_.temperature <= 0.0f) return greedy_argmax(logits);
  cand_.clear();
  cand_.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) cand_.emplace_back(logits[i], i);
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = cand_.size();
  if (cfg_.top_k > 0 && static_cast<size_t>(cfg_.top_k) < keep) {
    keep = static_cast<size_t>(cfg_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax at temperature over the survivors (sorted, so cand_[0] is the maximum).
  const double mx = cand_[0].first;
  std::vector<double> p(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); ++i)
    sum += p[i] = std::exp((cand_[i].first - mx) / cfg_.temperature);
  for (double& x : p) x /= sum;
  if (cfg_.top_p < 1.0f) {
    double cum = 0;
    size_t cut = p.size();
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= cfg_.top_p) {
        cut = i + 1;
        break;
      }
    }
    p.resize(cut);
  }
  if (cfg_.min_p > 0.0f) {
    const double floor = cfg_.min_p * p[0];
    size_t cut = 1;
    while (cut < p.size() && p[cut] >= floor) ++cut;
    p.resize(cut);
  }
  double total = 0;
  for (double x : p) total += x;
  const double r = uniform() * total;
  double cum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (r < cum) return cand_[i].second;
  }
  return cand_[p.size() - 1].second;
}

std::string StopStrings::feed(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    if (at != std::string::npos) {
      stopped_ = true;
      std::string out = pending_.substr(0, at);
      pending_.clear();
      return out;
    }
  }
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t len = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  return out;
}

}  // namespace tessel::llm
