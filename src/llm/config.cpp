#include "llm/config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "llm/file_util.hpp"
#include "llm/gguf.hpp"

namespace tessel::llm {

namespace {

[[noreturn]] void config_error(const std::string& field, const std::string& expected,
                               const std::string& got) {
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              "tessel::config: '" + field + "' expected " + expected + ", got " + got);
}

int64_t j_int(const nlohmann::json& j, const char* key, int64_t fallback, bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) config_error(key, "an integer in config.json", "nothing");
    return fallback;
  }
  if (!j[key].is_number_integer()) config_error(key, "an integer", j[key].dump());
  return j[key].get<int64_t>();
}

double j_num(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) config_error(key, "a number", j[key].dump());
  return j[key].get<double>();
}

void read_rope_scaling(const nlohmann::json& rs, ModelConfig& c) {
  if (!rs.is_object()) return;
  std::string type = rs.value("rope_type", rs.value("type", std::string()));
  if (type == "default") type = "";
  if (!type.empty() && type != "llama3" && type != "linear")
    throw Error(TESSEL_ERROR_UNSUPPORTED,
                "tessel::config: 'rope_scaling' expected none, linear or llama3, got " + type);
  c.rope_scaling.type = type;
  c.rope_scaling.factor = j_num(rs, "factor", 1.0);
  c.rope_scaling.low_freq_factor = j_num(rs, "low_freq_factor", 1.0);
  c.rope_scaling.high_freq_factor = j_num(rs, "high_freq_factor", 4.0);
  c.rope_scaling.original_max_positions =
      j_int(rs, "original_max_position_embeddings", 8192, false);
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](const char* f, int64_t v) {
    if (v <= 0) config_error(f, "> 0", std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", n_layers);
  positive("num_attention_heads", n_heads);
  positive("num_key_value_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("intermediate_size", ffn_size);
  positive("max_position_embeddings", max_positions);
  if (n_heads % n_kv_heads != 0)
    config_error("num_key_value_heads",
                 "a divisor of num_attention_heads (" + std::to_string(n_heads) + ")",
                 std::to_string(n_kv_heads));
  if (rope_style != RopeStyle::none && (rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2))
    config_error("rope_dim", "an even number in 1..head_dim (" + std::to_string(head_dim) + ")",
                 std::to_string(rope_dim));
  if (!(norm_eps > 0)) config_error("norm_eps", "> 0", std::to_string(norm_eps));
  if (rope_style != RopeStyle::none && !(rope_theta > 0))
    config_error("rope_theta", "> 0", std::to_string(rope_theta));
  if (rope_scaling.type == "llama3" &&
      !(rope_scaling.factor > 0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))
    config_error("rope_scaling", "factor > 0 and high_freq_factor > low_freq_factor",
                 std::to_string(rope_scaling.low_freq_factor) + "/" +
                     std::to_string(rope_scaling.high_freq_factor));
}

std::string ModelConfig::summary() const {
  std::ostringstream s;
  s << arch << ": " << n_layers << " layers, hidden " << hidden_size << ", heads " << n_heads << "/"
    << n_kv_heads << " x " << head_dim << ", ffn " << ffn_size << ", vocab " << vocab_size
    << ", ctx " << max_positions;
  if (!rope_scaling.type.empty()) s << ", rope " << rope_scaling.type;
  if (tie_embeddings) s << ", tied embeddings";
  return s.str();
}

ModelConfig config_from_hf(const nlohmann::json& j) {
  if (!j.is_object()) config_error("config.json", "a JSON object", j.type_name());
  ModelConfig c;
  c.arch = j.value("model_type", std::string());
  if (c.arch == "gpt2") {
    c.vocab_size = j_int(j, "vocab_size", 0, true);
    c.hidden_size = j_int(j, "n_embd", 0, true);
    c.n_layers = j_int(j, "n_layer", 0, true);
    c.n_heads = j_int(j, "n_head", 0, true);
    c.n_kv_heads = c.n_heads;
    c.ffn_size = j_int(j, "n_inner", 4 * c.hidden_size, false);
    c.max_positions = j_int(j, "n_positions", 1024, false);
    c.norm_eps = j_num(j, "layer_norm_epsilon", 1e-5);
    c.head_dim = c.n_heads > 0 ? c.hidden_size / c.n_heads : 0;
    c.rope_style = RopeStyle::none;
    c.norm = NormKind::layer;
    c.ffn = FfnKind::gelu;
    c.qkv_bias = c.all_biases = c.learned_positions = c.tie_embeddings = true;
  } else if (c.arch == "llama" || c.arch == "mistral" || c.arch == "qwen2") {
    c.vocab_size = j_int(j, "vocab_size", 0, true);
    c.hidden_size = j_int(j, "hidden_size", 0, true);
    c.n_layers = j_int(j, "num_hidden_layers", 0, true);
    c.n_heads = j_int(j, "num_attention_heads", 0, true);
    c.n_kv_heads = j_int(j, "num_key_value_heads", c.n_heads, false);
    c.head_dim = j_int(j, "head_dim", c.n_heads > 0 ? c.hidden_size / c.n_heads : 0, false);
    c.ffn_size = j_int(j, "intermediate_size", 0, true);
    c.max_positions = j_int(j, "max_position_embeddings", 2048, false);
    c.norm_eps = j_num(j, "rms_norm_eps", 1e-6);
    c.rope_theta = j_num(j, "rope_theta", 10000.0);
    // transformers >= 5 nests rope settings in rope_parameters.
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      c.rope_theta = j_num(j["rope_parameters"], "rope_theta", c.rope_theta);
      read_rope_scaling(j["rope_parameters"], c);
    }
    if (j.contains("rope_scaling")) read_rope_scaling(j["rope_scaling"], c);
    c.rope_dim = c.head_dim;
    c.rope_style = RopeStyle::neox;
    c.qkv_bias = c.arch == "qwen2" || j.value("attention_bias", false);
    c.tie_embeddings = j.value("tie_word_embeddings", false);
  } else {
    throw Error(TESSEL_ERROR_UNSUPPORTED,
                "tessel::config: 'model_type' expected llama, mistral, qwen2 or gpt2, got '" +
                    c.arch + "'");
  }
  c.validate();
  return c;
}

ModelConfig config_from_hf_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) file_error("config", path, "", "a readable config.json", "no such file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    file_error("config", path, "", "valid JSON", e.what());
  }
  return config_from_hf(j);
}

ModelConfig config_from_gguf(const GgufFile& g) {
  ModelConfig c;
  c.arch = g.architecture();
  const std::string a = c.arch + ".";
  auto need = [&](const std::string& key) {
    const int64_t v = g.get_int(key, -1);
    if (v < 0) config_error(key, "an integer in the GGUF metadata", "nothing");
    return v;
  };
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "gpt2" && c.arch != "mistral")
    throw Error(TESSEL_ERROR_UNSUPPORTED,
                "tessel::config: 'general.architecture' expected llama, qwen2 or gpt2, got '" +
                    c.arch + "'");
  c.hidden_size = need(a + "embedding_length");
  c.n_layers = need(a + "block_count");
  c.n_heads = need(a + "attention.head_count");
  c.n_kv_heads = g.get_int(a + "attention.head_count_kv", c.n_heads);
  c.head_dim = g.get_int(a + "attention.key_length", c.n_heads > 0 ? c.hidden_size / c.n_heads : 0);
  c.ffn_size = need(a + "feed_forward_length");
  c.max_positions = need(a + "context_length");
  c.vocab_size = g.get_int(a + "vocab_size", -1);
  if (c.vocab_size < 0) {
    const GgufValue* toks = g.find("tokenizer.ggml.tokens");
    c.vocab_size = toks ? static_cast<int64_t>(toks->items.size()) : 0;
  }
  if (c.arch == "gpt2") {
    c.norm_eps = g.get_double(a + "attention.layer_norm_epsilon", 1e-5);
    c.rope_style = RopeStyle::none;
    c.norm = NormKind::layer;
    c.ffn = FfnKind::gelu;
    c.qkv_bias = c.all_biases = c.learned_positions = true;
  } else {
    c.norm_eps = g.get_double(a + "attention.layer_norm_rms_epsilon", 1e-5);
    c.rope_theta = g.get_double(a + "rope.freq_base", 10000.0);
    c.rope_dim = g.get_int(a + "rope.dimension_count", c.head_dim);
    c.rope_style = c.arch == "qwen2" ? RopeStyle::neox : RopeStyle::gptj;
    c.qkv_bias = g.has("blk.0.attn_q.bias");
    const std::string st = g.get_string(a + "rope.scaling.type");
    if (st == "linear") {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = g.get_double(a + "rope.scaling.factor", 1.0);
    }
    // llama3 scaling arrives as the rope_freqs.weight tensor (per-frequency divisors).
  }
  c.tie_embeddings = !g.has("output.weight");
  c.validate();
  return c;
}

}  // namespace tessel::llm
