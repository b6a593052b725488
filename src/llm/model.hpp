// The decoder-only transformer graph, once, over the Backend interface: token (+ learned
// position) embedding, per layer norm → q/k/v → RoPE → KV cache → attention → output
// projection → residual, norm → SiLU-gated or GELU MLP → residual; final norm and logits.
// One forward() handles prefill, decode and a mix of sequences (each row names its slot and
// position), so batched generation is the same call with more rows.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llm/backend.hpp"
#include "llm/config.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"

namespace tessel::llm {

class Model {
 public:
  // Uploads the weights of `src` (GGUF or HF tensor names, see model.cpp) to `backend`.
  Model(std::unique_ptr<Backend> backend, const ModelConfig& config, const WeightSource& src,
        bool hf_names);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return *backend_; }

  // (Re)allocates the KV cache for `slots` sequences of up to `max_seq` positions.
  void reserve(int64_t slots, int64_t max_seq);
  int64_t slots() const { return slots_; }
  int64_t max_seq() const { return max_seq_; }
  // Tokens whose keys/values the cache holds for `slot`, positions 0.. in order.
  const std::vector<int32_t>& cached_tokens(int64_t slot) const { return slot_tokens_.at(slot); }
  // Forgets what the cache holds for `slot` (its KV pages return to the pool).
  void release_slot(int64_t slot);

  // Runs tokens[r] of sequence slots[r] at positions[r] (positions of a slot must be written in
  // order; earlier positions must already be cached). Returns the logits (vocab floats each) of
  // the rows listed in logits_rows, in that order.
  std::vector<float> forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& slots,
                             const std::vector<int32_t>& positions,
                             const std::vector<int64_t>& logits_rows);
  // The same step, returning the greedy token (argmax, lowest id on ties) of each logits row
  // instead of the logits: on the GPU only the ids leave the device.
  std::vector<int32_t> forward_greedy(const std::vector<int32_t>& tokens,
                                      const std::vector<int32_t>& slots,
                                      const std::vector<int32_t>& positions,
                                      const std::vector<int64_t>& logits_rows);

  // Pipelined greedy decode: greedy_start enqueues the step and returns at once (false, doing
  // nothing, when the backend cannot pipeline); greedy_finish returns the picks of the oldest
  // started step. tokens_on_device: the step's tokens are the previous started step's picks,
  // row for row (`tokens` are placeholders; cached_tokens records them once those picks are
  // finished). At most two steps may be started and not finished.
  bool greedy_start(const std::vector<int32_t>& tokens, const std::vector<int32_t>& slots,
                    const std::vector<int32_t>& positions, const std::vector<int64_t>& logits_rows,
                    bool tokens_on_device);
  std::vector<int32_t> greedy_finish();
  int64_t greedy_started() const { return static_cast<int64_t>(started_.size()); }

 private:
  // How forward_impl returns the step's result.
  enum class Out { logits, greedy, greedy_started };
  std::vector<float> forward_impl(const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& slots,
                                  const std::vector<int32_t>& positions,
                                  const std::vector<int64_t>& logits_rows, Out mode,
                                  std::vector<int32_t>* greedy, bool tokens_on_device = false);
  // wqkv = wq | wk | wv stacked along the output dim (one GEMM; q, k, v are column views of
  // its output); w_up = w_gate | w_up likewise for SiLU-gated FFNs (GELU FFNs: just w_up).
  struct Layer {
    Buf attn_norm, attn_norm_b, wqkv, bqkv, wo, bo;
    Buf ffn_norm, ffn_norm_b, w_up, w_down, b_up, b_down;
  };
  // Activation buffers of one step. Decode steps use the first M rows of buffers kept for the
  // model's lifetime (grown for a larger batch, with a new generation), so a recorded step
  // (CUDA graph, keyed by M and the generation) always sees the same pointers.
  struct StepBuffers {
    Buf x, xn, qkv, att, proj, ffn, act, last, last_n, out;
  };
  void alloc_step_buffers(StepBuffers& s, int64_t rows, int64_t n_out);
  void release_step_buffers(StepBuffers& s);
  void load(const WeightSource& src, bool hf_names);
  void release_weights();
  void rope_tables(const std::vector<int32_t>& positions, std::vector<float>& cos,
                   std::vector<float>& sin) const;

  std::unique_ptr<Backend> backend_;
  ModelConfig config_;
  std::vector<double> inv_freq_;  // rope_dim / 2 rotation frequencies after scaling
  Buf tok_embd_, pos_embd_, out_norm_, out_norm_b_, lm_head_;
  bool lm_head_is_embd_ = false;
  std::vector<Layer> layers_;
  int64_t slots_ = 0, max_seq_ = 0;
  std::vector<std::vector<int32_t>> slot_tokens_;
  // Started greedy steps (greedy_start), oldest first: their row count, and for a step whose
  // tokens came from the device the (slot, position) of each row, recorded as -1 in
  // slot_tokens_ until the previous step's picks are finished.
  struct StartedStep {
    int64_t rows = 0;
    bool fed = false;
    std::vector<std::pair<int32_t, int32_t>> at;
  };
  std::vector<StartedStep> started_;
  StepBuffers decode_buffers_;  // decode_rows_ rows
  int64_t decode_rows_ = 0, decode_generation_ = 0;
};

// A model and its tokenizer from a path: a .gguf file or a Hugging Face folder (config.json,
// *.safetensors, tokenizer.json).
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::optional<TokenizerData> gguf_tokenizer;  // GGUF files carry their tokenizer
  std::string tokenizer_json;                   // HF folders: path of tokenizer.json
  std::string format;                           // "gguf" or "safetensors"
  double load_seconds = 0;
};
LoadedModel load_model(const std::string& path, std::unique_ptr<Backend> backend);

}  // namespace tessel::llm
