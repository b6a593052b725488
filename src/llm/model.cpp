#include "llm/model.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "llm/gguf.hpp"
#include "llm/safetensors.hpp"
#include "tessel/tensor.hpp"

namespace tessel::llm {

namespace {

[[noreturn]] void weight_error(const std::string& name, const std::string& expected,
                               const std::string& got) {
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              "tessel::model: '" + name + "' expected " + expected + ", got " + got);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

// HF name of a GGUF-style canonical tensor name ("blk.3.attn_q.weight" ...), llama family.
std::string hf_llama_name(const std::string& canon) {
  static const std::pair<const char*, const char*> global[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto& [g, h] : global)
    if (canon == g) return h;
  static const std::pair<const char*, const char*> per_layer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  const size_t dot = canon.find('.', 4);  // "blk.N.<rest>"
  const std::string layer = canon.substr(4, dot - 4), rest = canon.substr(dot + 1);
  for (const auto& [g, h] : per_layer)
    if (rest == g) return "model.layers." + layer + "." + h;
  return canon;
}

}  // namespace

Model::Model(std::unique_ptr<Backend> backend, const ModelConfig& config, const WeightSource& src,
             bool hf_names)
    : backend_(std::move(backend)), config_(config) {
  config_.validate();
  try {
    load(src, hf_names);
  } catch (...) {
    release_weights();  // the destructor does not run for a throwing constructor
    throw;
  }
}

Model::~Model() { release_weights(); }

void Model::release_weights() {
  Backend& b = *backend_;
  for (Layer& l : layers_)
    for (Buf* x :
         {&l.attn_norm, &l.attn_norm_b, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo, &l.bo,
          &l.ffn_norm, &l.ffn_norm_b, &l.w_gate, &l.w_up, &l.w_down, &l.b_up, &l.b_down})
      b.release(*x);
  if (lm_head_is_embd_) lm_head_ = Buf{};
  for (Buf* x : {&tok_embd_, &pos_embd_, &out_norm_, &out_norm_b_, &lm_head_}) b.release(*x);
}

void Model::load(const WeightSource& src, bool hf_names) {
  const ModelConfig& c = config_;
  const bool gpt2 = c.arch == "gpt2";
  // GPT-2 on HF: Conv1D weights are (in, out), names under an optional "transformer." prefix.
  std::string gpt2_prefix;
  if (gpt2 && hf_names && src.has("transformer.wte.weight")) gpt2_prefix = "transformer.";

  auto fetch = [&](const std::string& name, std::vector<int64_t> want) -> HostTensor {
    if (!src.has(name)) weight_error(name, "a tensor " + shape_str(want), "none in the file");
    HostTensor t = src.load(name);
    if (t.shape != want) weight_error(name, "shape " + shape_str(want), shape_str(t.shape));
    return t;
  };
  auto up = [&](const HostTensor& t) { return backend_->upload(t); };
  auto transpose = [](HostTensor t) {  // (in, out) -> (out, in)
    HostTensor o;
    o.shape = {t.shape[1], t.shape[0]};
    o.data.resize(t.data.size());
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t j = 0; j < t.shape[1]; ++j)
        o.data[j * t.shape[0] + i] = t.data[i * t.shape[1] + j];
    return o;
  };
  auto rows_of = [](const HostTensor& t, int64_t r0, int64_t r1) {
    HostTensor o;
    const int64_t cols = t.numel() / t.shape[0];
    o.shape = t.shape;
    o.shape[0] = r1 - r0;
    o.data.assign(t.data.begin() + r0 * cols, t.data.begin() + r1 * cols);
    return o;
  };
  const int64_t H = c.hidden_size, F = c.ffn_size, V = c.vocab_size;
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;

  if (gpt2) {
    auto name = [&](const std::string& gguf, const std::string& hf) {
      return hf_names ? gpt2_prefix + hf : gguf;
    };
    auto lin = [&](const std::string& gguf, const std::string& hf, int64_t out, int64_t in) {
      return hf_names ? transpose(fetch(name(gguf, hf), {in, out})) : fetch(gguf, {out, in});
    };
    tok_embd_ = up(fetch(name("token_embd.weight", "wte.weight"), {V, H}));
    pos_embd_ = up(fetch(name("position_embd.weight", "wpe.weight"), {c.max_positions, H}));
    out_norm_ = up(fetch(name("output_norm.weight", "ln_f.weight"), {H}));
    out_norm_b_ = up(fetch(name("output_norm.bias", "ln_f.bias"), {H}));
    layers_.resize(static_cast<size_t>(c.n_layers));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      Layer& l = layers_[i];
      const std::string g = "blk." + std::to_string(i) + ".", h = "h." + std::to_string(i) + ".";
      l.attn_norm = up(fetch(name(g + "attn_norm.weight", h + "ln_1.weight"), {H}));
      l.attn_norm_b = up(fetch(name(g + "attn_norm.bias", h + "ln_1.bias"), {H}));
      const HostTensor qkv = lin(g + "attn_qkv.weight", h + "attn.c_attn.weight", 3 * H, H);
      const HostTensor qkv_b = fetch(name(g + "attn_qkv.bias", h + "attn.c_attn.bias"), {3 * H});
      l.wq = up(rows_of(qkv, 0, H));
      l.wk = up(rows_of(qkv, H, 2 * H));
      l.wv = up(rows_of(qkv, 2 * H, 3 * H));
      l.bq = up(rows_of(qkv_b, 0, H));
      l.bk = up(rows_of(qkv_b, H, 2 * H));
      l.bv = up(rows_of(qkv_b, 2 * H, 3 * H));
      l.wo = up(lin(g + "attn_output.weight", h + "attn.c_proj.weight", H, H));
      l.bo = up(fetch(name(g + "attn_output.bias", h + "attn.c_proj.bias"), {H}));
      l.ffn_norm = up(fetch(name(g + "ffn_norm.weight", h + "ln_2.weight"), {H}));
      l.ffn_norm_b = up(fetch(name(g + "ffn_norm.bias", h + "ln_2.bias"), {H}));
      l.w_up = up(lin(g + "ffn_up.weight", h + "mlp.c_fc.weight", F, H));
      l.b_up = up(fetch(name(g + "ffn_up.bias", h + "mlp.c_fc.bias"), {F}));
      l.w_down = up(lin(g + "ffn_down.weight", h + "mlp.c_proj.weight", H, F));
      l.b_down = up(fetch(name(g + "ffn_down.bias", h + "mlp.c_proj.bias"), {H}));
    }
    lm_head_ = tok_embd_;
    lm_head_is_embd_ = true;
    if (!hf_names && src.has("output.weight")) {
      lm_head_ = up(fetch("output.weight", {V, H}));
      lm_head_is_embd_ = false;
    }
  } else {
    auto name = [&](const std::string& canon) { return hf_names ? hf_llama_name(canon) : canon; };
    auto get = [&](const std::string& canon, std::vector<int64_t> want) {
      return up(fetch(name(canon), std::move(want)));
    };
    tok_embd_ = get("token_embd.weight", {V, H});
    out_norm_ = get("output_norm.weight", {H});
    layers_.resize(static_cast<size_t>(c.n_layers));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      Layer& l = layers_[i];
      const std::string g = "blk." + std::to_string(i) + ".";
      l.attn_norm = get(g + "attn_norm.weight", {H});
      l.wq = get(g + "attn_q.weight", {qd, H});
      l.wk = get(g + "attn_k.weight", {kvd, H});
      l.wv = get(g + "attn_v.weight", {kvd, H});
      if (c.qkv_bias) {
        l.bq = get(g + "attn_q.bias", {qd});
        l.bk = get(g + "attn_k.bias", {kvd});
        l.bv = get(g + "attn_v.bias", {kvd});
      }
      l.wo = get(g + "attn_output.weight", {H, qd});
      l.ffn_norm = get(g + "ffn_norm.weight", {H});
      l.w_gate = get(g + "ffn_gate.weight", {F, H});
      l.w_up = get(g + "ffn_up.weight", {F, H});
      l.w_down = get(g + "ffn_down.weight", {H, F});
    }
    const std::string head = name("output.weight");
    if (src.has(head) && !c.tie_embeddings) {
      lm_head_ = up(fetch(head, {V, H}));
    } else {
      lm_head_ = tok_embd_;
      lm_head_is_embd_ = true;
    }
  }

  // RoPE frequencies, with llama3 / linear scaling or GGUF's per-frequency divisors.
  if (c.rope_style != RopeStyle::none) {
    const int64_t half = c.rope_dim / 2;
    inv_freq_.resize(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv_freq_[i] = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / c.rope_dim);
    const RopeScaling& s = c.rope_scaling;
    if (s.type == "linear") {
      for (double& f : inv_freq_) f /= s.factor;
    } else if (s.type == "llama3") {
      const double low_wl = s.original_max_positions / s.low_freq_factor;
      const double high_wl = s.original_max_positions / s.high_freq_factor;
      for (double& f : inv_freq_) {
        const double wl = 2 * std::numbers::pi / f;
        if (wl > low_wl) {
          f /= s.factor;
        } else if (wl >= high_wl) {
          const double smooth = (s.original_max_positions / wl - s.low_freq_factor) /
                                (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
    }
    if (!hf_names && src.has("rope_freqs.weight")) {
      const HostTensor rf = fetch("rope_freqs.weight", {half});
      for (int64_t i = 0; i < half; ++i) inv_freq_[i] /= rf.data[i];
    }
  }
}

void Model::reserve(int64_t slots, int64_t max_seq) {
  if (slots <= 0 || max_seq <= 0 || max_seq > config_.max_positions)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'max_seq' expected 1.." + std::to_string(config_.max_positions) +
                    " with slots > 0, got " + std::to_string(max_seq) + " (slots " +
                    std::to_string(slots) + ")");
  backend_->kv_reserve(config_.n_layers, slots, max_seq, config_.n_kv_heads * config_.head_dim);
  slots_ = slots;
  max_seq_ = max_seq;
  slot_tokens_.assign(static_cast<size_t>(slots), {});
}

void Model::rope_tables(const std::vector<int32_t>& positions, std::vector<float>& cos,
                        std::vector<float>& sin) const {
  const size_t half = inv_freq_.size();
  cos.resize(positions.size() * half);
  sin.resize(positions.size() * half);
  for (size_t r = 0; r < positions.size(); ++r)
    for (size_t i = 0; i < half; ++i) {
      const double a = positions[r] * inv_freq_[i];
      cos[r * half + i] = static_cast<float>(std::cos(a));
      sin[r * half + i] = static_cast<float>(std::sin(a));
    }
}

std::vector<float> Model::forward(const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& slots,
                                  const std::vector<int32_t>& positions,
                                  const std::vector<int64_t>& logits_rows) {
  const ModelConfig& c = config_;
  const int64_t M = static_cast<int64_t>(tokens.size());
  if (M == 0 || slots.size() != tokens.size() || positions.size() != tokens.size())
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'slots/positions' expected one per token (" + std::to_string(M) +
                    " > 0), got " + std::to_string(slots.size()) + "/" +
                    std::to_string(positions.size()));
  if (slots_ == 0)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'kv cache' expected reserve() before forward(), got none");
  for (int64_t r : logits_rows)
    if (r < 0 || r >= M)
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT, "tessel::model: 'logits_rows' expected < " +
                                                     std::to_string(M) + ", got " +
                                                     std::to_string(r));
  for (int64_t r = 0; r < M; ++r) {
    if (slots[r] < 0 || slots[r] >= slots_ || positions[r] < 0 || positions[r] >= max_seq_)
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                  "tessel::model: 'slots/positions' expected slot < " + std::to_string(slots_) +
                      " and position < " + std::to_string(max_seq_) + ", got " +
                      std::to_string(slots[r]) + "/" + std::to_string(positions[r]));
    // Writing position p makes the cache's contents of this slot tokens[0..p].
    std::vector<int32_t>& cached = slot_tokens_[slots[r]];
    cached.resize(std::min(cached.size(), static_cast<size_t>(positions[r])), -1);
    cached.resize(static_cast<size_t>(positions[r]), -1);
    cached.push_back(tokens[r]);
  }
  Backend& b = *backend_;
  const int64_t H = c.hidden_size, F = c.ffn_size;
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const RowLayout rows{slots.data(), positions.data(), M};

  struct Scratch {
    Backend& b;
    std::vector<Buf> bufs;
    Buf& make(int64_t r, int64_t cc) { return bufs.emplace_back(b.alloc(r, cc)); }
    ~Scratch() {
      for (Buf& x : bufs) b.release(x);
    }
  } s{b, {}};
  s.bufs.reserve(16);
  Buf& x = s.make(M, H);
  Buf& xn = s.make(M, H);
  Buf& q = s.make(M, qd);
  Buf& k = s.make(M, kvd);
  Buf& v = s.make(M, kvd);
  Buf& att = s.make(M, qd);
  Buf& proj = s.make(M, H);
  Buf& gate = s.make(M, F);
  Buf& upb = s.make(M, F);

  std::vector<float> cos, sin;
  if (c.rope_style != RopeStyle::none) rope_tables(positions, cos, sin);

  b.embedding(tokens.data(), tok_embd_, x);
  if (c.learned_positions) b.add_rows(positions.data(), pos_embd_, x);
  const float eps = static_cast<float>(c.norm_eps);
  auto norm = [&](const Buf& in, const Buf& w, const Buf& bias, Buf& out) {
    if (c.norm == NormKind::rms)
      b.rms_norm(in, w, eps, out);
    else
      b.layer_norm(in, w, bias, eps, out);
  };
  auto opt = [](const Buf& bias) { return bias ? &bias : nullptr; };
  for (int64_t li = 0; li < c.n_layers; ++li) {
    const Layer& l = layers_[li];
    norm(x, l.attn_norm, l.attn_norm_b, xn);
    b.matmul(xn, l.wq, opt(l.bq), q);
    b.matmul(xn, l.wk, opt(l.bk), k);
    b.matmul(xn, l.wv, opt(l.bv), v);
    if (c.rope_style != RopeStyle::none) {
      b.rope(q, c.n_heads, c.head_dim, c.rope_dim, c.rope_style, cos.data(), sin.data());
      b.rope(k, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_style, cos.data(), sin.data());
    }
    b.kv_store(li, k, v, rows);
    b.attention(li, q, c.n_heads, c.n_kv_heads, c.head_dim, rows, att);
    b.matmul(att, l.wo, opt(l.bo), proj);
    b.add(x, proj);
    norm(x, l.ffn_norm, l.ffn_norm_b, xn);
    if (c.ffn == FfnKind::silu_gated) {
      b.matmul(xn, l.w_gate, nullptr, gate);
      b.matmul(xn, l.w_up, nullptr, upb);
      b.silu_mul(gate, upb, gate);
    } else {
      b.matmul(xn, l.w_up, opt(l.b_up), gate);
      b.gelu(gate);
    }
    b.matmul(gate, l.w_down, opt(l.b_down), proj);
    b.add(x, proj);
  }
  const int64_t n_out = static_cast<int64_t>(logits_rows.size());
  std::vector<float> logits(static_cast<size_t>(n_out * c.vocab_size));
  if (n_out == 0) return logits;
  Buf& last = s.make(n_out, H);
  Buf& last_n = s.make(n_out, H);
  Buf& out = s.make(n_out, c.vocab_size);
  b.gather_rows(x, logits_rows.data(), n_out, last);
  norm(last, out_norm_, out_norm_b_, last_n);
  b.matmul(last_n, lm_head_, nullptr, out);
  b.download(out, logits.data());
  return logits;
}

LoadedModel load_model(const std::string& path, std::unique_ptr<Backend> backend) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel lm;
  if (fs::is_directory(path)) {
    const ModelConfig cfg = config_from_hf_file((fs::path(path) / "config.json").string());
    SafetensorsModel st(path);
    lm.model = std::make_unique<Model>(std::move(backend), cfg, st, true);
    lm.tokenizer_json = (fs::path(path) / "tokenizer.json").string();
    lm.format = "safetensors";
  } else {
    GgufFile g(path);
    const ModelConfig cfg = config_from_gguf(g);
    lm.model = std::make_unique<Model>(std::move(backend), cfg, g, false);
    lm.gguf_tokenizer = g.tokenizer_data();
    lm.format = "gguf";
  }
  lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lm;
}

}  // namespace tessel::llm
