// One description of a decoder-only transformer, filled from a Hugging Face config.json or
// from GGUF metadata: Llama 2/3.x (llama3 RoPE scaling), SmolLM2 (llama), Mistral, Qwen2
// (q/k/v bias) and GPT-2 (learned positions, LayerNorm, GELU, tied embeddings).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace tessel::llm {

class GgufFile;

enum class RopeStyle { none, neox, gptj };  // neox: rotate halves; gptj: rotate adjacent pairs
enum class NormKind { rms, layer };
enum class FfnKind { silu_gated, gelu };  // gelu: tanh approximation (GPT-2's gelu_new)

struct RopeScaling {
  std::string type;  // "" (none), "linear" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct ModelConfig {
  std::string arch;  // "llama", "mistral", "qwen2", "gpt2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn_size = 0;
  int64_t max_positions = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t rope_dim = 0;  // rotated dimensions per head (<= head_dim)
  RopeStyle rope_style = RopeStyle::neox;
  RopeScaling rope_scaling;
  NormKind norm = NormKind::rms;
  FfnKind ffn = FfnKind::silu_gated;
  bool qkv_bias = false;
  bool all_biases = false;  // GPT-2: every linear and norm has a bias
  bool learned_positions = false;
  bool tie_embeddings = false;

  // Throws tessel::Error ("tessel::config: '<field>' expected ..., got ...") if inconsistent.
  void validate() const;
  std::string summary() const;
};

// From a parsed config.json (HF safetensors weights: Llama-family q/k are in neox order).
ModelConfig config_from_hf(const nlohmann::json& j);
ModelConfig config_from_hf_file(const std::string& path);
// From GGUF metadata (llama.cpp's converter stores llama q/k in gptj order; qwen2 in neox).
ModelConfig config_from_gguf(const GgufFile& g);

}  // namespace tessel::llm
