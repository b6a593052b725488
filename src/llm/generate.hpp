// Batched generation: every prompt gets a KV-cache slot, all prompts prefill in one forward,
// then each decode step runs one row per unfinished sequence. Pieces stream through a callback
// as they are sampled (held back while they may start a stop string).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "llm/sampler.hpp"

namespace tessel::llm {

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplerConfig sampling;  // sequence i draws with seed sampling.seed + i
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;
  // Skip the prefill of the longest prefix a slot's cache already holds (chat turns): sequence i
  // reuses slot i. Requires the cache to be reserved large enough beforehand.
  bool reuse_prefix = false;
  // Sees each sequence's logits before sampling (penalties not applied): --dump-logits.
  std::function<void(size_t sequence, std::span<const float> logits)> on_logits;
};

struct Generation {
  std::vector<int32_t> tokens;  // generated ids (a stop token is not included)
  std::string text;             // streamed text, stop string excluded
  std::string finish_reason;    // "stop_token", "stop_string", "length" or "context"
};

struct GenerateStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0;
  int64_t decode_tokens = 0;  // tokens produced by decode steps (all sequences)
  double decode_seconds = 0;
  double decode_forward_seconds = 0;      // of decode_seconds: inside Model::forward (the rest is
                                          // sampling, stop checks and streaming on the host)
  double decode_device_wait_seconds = 0;  // of that: the backend waiting for the device
  double prefill_tok_per_s() const {
    return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0;
  }
  double decode_tok_per_s() const {
    return decode_seconds > 0 ? decode_tokens / decode_seconds : 0;
  }
};

using Detokenize = std::function<std::string(int32_t)>;
using StreamCallback = std::function<void(size_t sequence, const std::string& piece)>;

// Reserves the cache (prompts.size() slots) itself. Throws tessel::Error if a prompt is empty or
// does not fit the model's context.
std::vector<Generation> generate(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& options, const Detokenize& detokenize,
                                 const StreamCallback& on_piece = {},
                                 GenerateStats* stats = nullptr);

}  // namespace tessel::llm
