// Helpers of `tessel run --prompt-ids / --dump-logits` (checking the engine against another
// implementation, e.g. tools/llm/hf_compare.py): token ids from text, and the logits of every
// sampling step saved as one float32 NPY (v1.0) array.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tessel::llm {

// "1,2, 3" -> {1, 2, 3}. Throws tessel::Error naming 'prompt-ids' for an empty list, a non-number
// or an id outside [0, vocab_size).
std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab_size);

// A C-order little-endian float32 array as NPY format version 1.0 (numpy.load reads it).
void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   std::span<const float> data);

// Logits rows per sequence in step order (step 0: the last prompt position after the prefill,
// step k: the decode step that produced generated token k). Written as shape
// (sequences, max steps, vocab); the steps of a sequence that finished early are NaN.
class LogitsRecorder {
 public:
  LogitsRecorder(size_t sequences, int64_t vocab_size);
  void record(size_t sequence, std::span<const float> logits);
  int64_t steps(size_t sequence) const;
  void write_npy(const std::string& path) const;

 private:
  int64_t vocab_;
  std::vector<std::vector<float>> rows_;
};

}  // namespace tessel::llm
