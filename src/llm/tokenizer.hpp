// Byte-level BPE tokenizer (GPT-2, Llama-3, Qwen2, SmolLM2 families), built from a Hugging Face
// tokenizer.json, from GPT-2's encoder.json + vocab.bpe, or from GGUF metadata (tokenizer.ggml.*).
// encode/decode agree with Hugging Face `tokenizers` (tests/test_tokenizer.cpp checks fixtures made
// by tools/gen_tokenizer_fixtures.py). Errors throw tessel::Error naming "tessel::Tokenizer".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::llm {

// What a GGUF file's tokenizer.ggml.* keys hold (and what the other loaders fill in).
struct TokenizerData {
  std::string model;  // "gpt2" = byte-level BPE (the only model supported)
  std::string
      pre;  // "llama-bpe" (also "llama3"), "qwen2", "gpt2" (also "gpt-2", "default"), "smollm"
  std::vector<std::string>
      tokens;  // byte-level strings for normal tokens, raw text for control ones
  std::vector<int32_t>
      token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;  // "a b", rank = index
  int32_t bos_id = -1, eos_id = -1;
  std::vector<int32_t> eos_ids;  // every id that ends generation (eos_id first)
  bool add_bos = false;
  std::string chat_template;
};

struct ChatMessage {
  std::string role, content;
};

// Which pre-tokenizer regex splits text into words before BPE.
enum class PreTokenizer {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
            // ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|...
  kQwen2,   // as kLlama3 with \p{N} (single digits)
  kSmolLM,  // every \p{N} alone (HF Digits(individual_digits)), then kGpt2 on the rest
};

// Which chat template family apply_chat_template renders.
enum class ChatFormat { kPlain, kLlama3, kChatML };

class Tokenizer {
 public:
  // Reads tokenizer_config.json beside the file when present (chat template, bos/eos, add_bos).
  static Tokenizer from_hf_json(const std::string& tokenizer_json_path);
  static Tokenizer from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe);
  static Tokenizer from_data(const TokenizerData& data);

  // add_special: prepend BOS when the model adds it. Added/special tokens in the text are matched.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  // Invalid UTF-8 in the joined bytes becomes U+FFFD (as Hugging Face's decode).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Raw bytes of one token (may be a partial UTF-8 sequence: a streaming caller buffers).
  std::string decode_token(int32_t id) const;
  // Llama-3, ChatML (Qwen2/Qwen3, SmolLM2) or a plain "role: content" fallback.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) const;

  int32_t bos_id() const;
  int32_t eos_id() const;
  const std::vector<int32_t>& eos_ids() const;
  size_t vocab_size() const;

  // Beyond the engine's interface: introspection for tests and tools.
  PreTokenizer pre_tokenizer() const;
  ChatFormat chat_format() const;
  bool is_special(int32_t id) const;
  int32_t token_id(std::string_view raw_token) const;  // -1 when absent
  // The pre-tokenizer's word split (raw bytes), without added-token matching or normalization.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::llm
