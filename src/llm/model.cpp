#include "llm/model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <span>

#include "llm/gguf.hpp"
#include "llm/safetensors.hpp"
#include "llm/sampler.hpp"
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
    for (Buf* x : {&l.attn_norm, &l.attn_norm_b, &l.wqkv, &l.bqkv, &l.wo, &l.bo, &l.ffn_norm,
                   &l.ffn_norm_b, &l.w_up, &l.w_down, &l.b_up, &l.b_down})
      b.release(*x);
  release_step_buffers(decode_buffers_);
  decode_rows_ = 0;
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
  // Stacks tensors of equal trailing shape along dim 0 (fused projection weights / biases).
  auto stack = [](std::initializer_list<const HostTensor*> parts) {
    HostTensor o;
    o.shape = (*parts.begin())->shape;
    o.shape[0] = 0;
    for (const HostTensor* p : parts) {
      o.shape[0] += p->shape[0];
      o.data.insert(o.data.end(), p->data.begin(), p->data.end());
    }
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
      l.wqkv = up(qkv);  // already q | k | v
      l.bqkv = up(qkv_b);
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
      {
        const HostTensor wq = fetch(name(g + "attn_q.weight"), {qd, H});
        const HostTensor wk = fetch(name(g + "attn_k.weight"), {kvd, H});
        const HostTensor wv = fetch(name(g + "attn_v.weight"), {kvd, H});
        l.wqkv = up(stack({&wq, &wk, &wv}));
      }
      if (c.qkv_bias) {
        const HostTensor bq = fetch(name(g + "attn_q.bias"), {qd});
        const HostTensor bk = fetch(name(g + "attn_k.bias"), {kvd});
        const HostTensor bv = fetch(name(g + "attn_v.bias"), {kvd});
        l.bqkv = up(stack({&bq, &bk, &bv}));
      }
      l.wo = get(g + "attn_output.weight", {H, qd});
      l.ffn_norm = get(g + "ffn_norm.weight", {H});
      {
        const HostTensor wg = fetch(name(g + "ffn_gate.weight"), {F, H});
        const HostTensor wu = fetch(name(g + "ffn_up.weight"), {F, H});
        l.w_up = up(stack({&wg, &wu}));
      }
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

void Model::release_slot(int64_t slot) {
  if (slot < 0 || slot >= slots_)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT, "tessel::model: 'slot' expected < " +
                                                   std::to_string(slots_) + ", got " +
                                                   std::to_string(slot));
  backend_->kv_free(slot);
  slot_tokens_[slot].clear();
}

void Model::alloc_step_buffers(StepBuffers& s, int64_t M, int64_t n_out) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, F = c.ffn_size;
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const bool gated = c.ffn == FfnKind::silu_gated;
  Backend& b = *backend_;
  s.x = b.alloc(M, H);
  s.xn = b.alloc(M, H);
  s.qkv = b.alloc(M, qd + 2 * kvd);
  s.att = b.alloc(M, qd);
  s.proj = b.alloc(M, H);
  s.ffn = b.alloc(M, gated ? 2 * F : F);
  if (gated) s.act = b.alloc(M, F);
  if (n_out > 0) {
    s.last = b.alloc(n_out, H);
    s.last_n = b.alloc(n_out, H);
    s.out = b.alloc(n_out, c.vocab_size);
  }
}

void Model::release_step_buffers(StepBuffers& s) {
  for (Buf* x : {&s.x, &s.xn, &s.qkv, &s.att, &s.proj, &s.ffn, &s.act, &s.last, &s.last_n, &s.out})
    backend_->release(*x);
}

std::vector<float> Model::forward(const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& slots,
                                  const std::vector<int32_t>& positions,
                                  const std::vector<int64_t>& logits_rows) {
  if (!started_.empty())
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'greedy steps' expected all finished before forward(), got " +
                    std::to_string(started_.size()) + " started");
  return forward_impl(tokens, slots, positions, logits_rows, Out::logits, nullptr);
}

std::vector<int32_t> Model::forward_greedy(const std::vector<int32_t>& tokens,
                                           const std::vector<int32_t>& slots,
                                           const std::vector<int32_t>& positions,
                                           const std::vector<int64_t>& logits_rows) {
  if (!started_.empty())
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'greedy steps' expected all finished before forward_greedy(), "
                "got " +
                    std::to_string(started_.size()) + " started");
  std::vector<int32_t> ids;
  forward_impl(tokens, slots, positions, logits_rows, Out::greedy, &ids);
  return ids;
}

bool Model::greedy_start(const std::vector<int32_t>& tokens, const std::vector<int32_t>& slots,
                         const std::vector<int32_t>& positions,
                         const std::vector<int64_t>& logits_rows, bool tokens_on_device) {
  if (!backend_->can_pipeline_greedy()) return false;
  if (started_.size() >= 2)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'greedy steps' expected at most 2 started, got 3");
  if (tokens_on_device &&
      (started_.empty() || started_.back().rows != static_cast<int64_t>(tokens.size())))
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'tokens_on_device' expected a started step of " +
                    std::to_string(tokens.size()) + " rows, got " +
                    (started_.empty() ? std::string("none")
                                      : std::to_string(started_.back().rows) + " rows"));
  forward_impl(tokens, slots, positions, logits_rows, Out::greedy_started, nullptr,
               tokens_on_device);
  return true;
}

std::vector<int32_t> Model::greedy_finish() {
  if (started_.empty())
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::model: 'greedy steps' expected one started, got none");
  std::vector<int32_t> ids(static_cast<size_t>(started_.front().rows));
  backend_->argmax_rows_finish(ids.data());
  started_.erase(started_.begin());
  if (!started_.empty() && started_.front().fed) {  // its tokens were these picks
    for (size_t r = 0; r < started_.front().at.size(); ++r) {
      const auto [slot, pos] = started_.front().at[r];
      std::vector<int32_t>& cached = slot_tokens_[slot];
      if (static_cast<size_t>(pos) < cached.size() && cached[pos] == -1) cached[pos] = ids[r];
    }
    started_.front().fed = false;
  }
  return ids;
}

std::vector<float> Model::forward_impl(const std::vector<int32_t>& tokens,
                                       const std::vector<int32_t>& slots,
                                       const std::vector<int32_t>& positions,
                                       const std::vector<int64_t>& logits_rows, Out mode,
                                       std::vector<int32_t>* greedy, bool tokens_on_device) {
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
  // Checked here (not only by the backend's embedding) because a replayed step skips the ops.
  // Fed tokens are the device's own argmax picks.
  for (int32_t t : tokens)
    if (!tokens_on_device && (t < 0 || t >= c.vocab_size))
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT, "tessel::model: 'tokens' expected ids in [0, " +
                                                     std::to_string(c.vocab_size) + "), got " +
                                                     std::to_string(t));
  for (int64_t r = 0; r < M; ++r) {
    if (slots[r] < 0 || slots[r] >= slots_ || positions[r] < 0 || positions[r] >= max_seq_)
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                  "tessel::model: 'slots/positions' expected slot < " + std::to_string(slots_) +
                      " and position < " + std::to_string(max_seq_) + ", got " +
                      std::to_string(slots[r]) + "/" + std::to_string(positions[r]));
  }
  StartedStep started;
  started.rows = static_cast<int64_t>(logits_rows.size());
  started.fed = tokens_on_device;
  for (int64_t r = 0; r < M; ++r) {
    // Writing position p makes the cache's contents of this slot tokens[0..p].
    std::vector<int32_t>& cached = slot_tokens_[slots[r]];
    cached.resize(std::min(cached.size(), static_cast<size_t>(positions[r])), -1);
    cached.resize(static_cast<size_t>(positions[r]), -1);
    cached.push_back(tokens_on_device ? -1 : tokens[r]);
    if (tokens_on_device) started.at.emplace_back(slots[r], positions[r]);
  }
  Backend& b = *backend_;
  const int64_t F = c.ffn_size;
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const RowLayout rows{slots.data(), positions.data(), M};
  const int64_t n_out = static_cast<int64_t>(logits_rows.size());

  // A decode step (one token of each of M distinct slots, logits of every row in order) has
  // the same op sequence for every step of its batch size: it runs on fixed buffers and the
  // backend may record and replay it.
  bool decode = M <= 256 && n_out == M;
  for (int64_t r = 0; r < M && decode; ++r) decode = logits_rows[r] == r;
  if (decode) {
    std::vector<char> seen(static_cast<size_t>(slots_), 0);
    for (int64_t r = 0; r < M && decode; ++r) decode = !seen[slots[r]]++;
  }
  StepBuffers eager;
  struct Release {
    Model* m;
    StepBuffers* s;
    ~Release() {
      if (s) m->release_step_buffers(*s);
    }
  } release{this, nullptr};
  StepBuffers s;
  if (decode) {
    if (M > decode_rows_) {
      // Earlier recorded steps keep their keys (older generation) and are never replayed.
      release_step_buffers(decode_buffers_);
      decode_rows_ = std::max<int64_t>(M, std::min<int64_t>(2 * decode_rows_, 256));
      alloc_step_buffers(decode_buffers_, decode_rows_, decode_rows_);
      ++decode_generation_;
    }
    s = decode_buffers_;
    for (Buf* x :
         {&s.x, &s.xn, &s.qkv, &s.att, &s.proj, &s.ffn, &s.act, &s.last, &s.last_n, &s.out})
      if (*x) x->rows = M;  // the first M rows of a dense buffer: same pointer
  } else {
    release.s = &eager;
    alloc_step_buffers(eager, M, n_out);
    s = eager;
  }

  std::vector<float> cos, sin;
  if (c.rope_style != RopeStyle::none) rope_tables(positions, cos, sin);
  StepInputs in;
  in.tokens = tokens.data();
  in.slot = slots.data();
  in.pos = positions.data();
  in.rows = M;
  if (!cos.empty()) {
    in.cos = cos.data();
    in.sin = sin.data();
    in.rope_half = c.rope_dim / 2;
  }
  in.logits_rows = logits_rows.data();
  in.n_logits = n_out;
  if (tokens_on_device) b.feed_picked_tokens();
  b.begin_step(in);

  const float eps = static_cast<float>(c.norm_eps);
  auto norm = [&](const Buf& x, const Buf& w, const Buf& bias, Buf& out) {
    if (c.norm == NormKind::rms)
      b.rms_norm(x, w, eps, out);
    else
      b.layer_norm(x, w, bias, eps, out);
  };
  // x += y, then out = norm(x): fused for RMSNorm.
  auto add_norm = [&](Buf& x, const Buf& y, const Buf& w, const Buf& bias, Buf& out) {
    if (c.norm == NormKind::rms) {
      b.add_rms_norm(x, y, w, eps, out);
    } else {
      b.add(x, y);
      b.layer_norm(x, w, bias, eps, out);
    }
  };
  auto opt = [](const Buf& bias) { return bias ? &bias : nullptr; };
  // Decode-sized steps of RMSNorm / SiLU-gated models where the backend fuses them: each norm
  // inside the GEMM after it, each residual add inside the GEMM before it (two launches fewer
  // per layer on the GPU).
  const bool fused =
      c.norm == NormKind::rms && c.ffn == FfnKind::silu_gated && b.fuses_norm_matmul(M);
  auto ops = [&] {
    b.embedding(tokens.data(), tok_embd_, s.x);
    if (c.learned_positions) b.add_rows(positions.data(), pos_embd_, s.x);
    const Buf q = b.cols_view(s.qkv, 0, qd);
    const Buf k = b.cols_view(s.qkv, qd, kvd);
    const Buf v = b.cols_view(s.qkv, qd + kvd, kvd);
    Buf qk = b.cols_view(s.qkv, 0, qd + kvd);  // q and k heads are adjacent: one rotation
    for (int64_t li = 0; li < c.n_layers; ++li) {
      const Layer& l = layers_[li];
      if (fused) {
        b.norm_matmul(s.x, l.attn_norm, eps, l.wqkv, opt(l.bqkv), s.xn, s.qkv);
      } else {
        if (li == 0)
          norm(s.x, l.attn_norm, l.attn_norm_b, s.xn);
        else  // the previous layer's MLP residual, fused with this layer's norm
          add_norm(s.x, s.proj, l.attn_norm, l.attn_norm_b, s.xn);
        b.matmul(s.xn, l.wqkv, opt(l.bqkv), s.qkv);
      }
      if (c.rope_style != RopeStyle::none) {
        b.rope_kv_attention(li, qk, q, c.n_heads, c.n_kv_heads, c.head_dim, c.rope_dim,
                            c.rope_style, cos.data(), sin.data(), k, v, rows, s.att);
      } else {
        b.kv_store(li, k, v, rows);
        b.attention(li, q, c.n_heads, c.n_kv_heads, c.head_dim, rows, s.att);
      }
      if (fused) {
        b.matmul_add(s.att, l.wo, opt(l.bo), s.proj, s.x);
        b.norm_matmul(s.x, l.ffn_norm, eps, l.w_up, nullptr, s.xn, s.ffn);
        b.silu_mul_matmul_add(s.ffn, F, s.act, l.w_down, opt(l.b_down), s.proj, s.x);
        continue;
      }
      b.matmul(s.att, l.wo, opt(l.bo), s.proj);
      add_norm(s.x, s.proj, l.ffn_norm, l.ffn_norm_b, s.xn);
      if (c.ffn == FfnKind::silu_gated) {
        b.matmul(s.xn, l.w_up, nullptr, s.ffn);
        b.silu_mul_matmul(s.ffn, F, s.act, l.w_down, opt(l.b_down), s.proj);
      } else {
        b.matmul(s.xn, l.w_up, opt(l.b_up), s.ffn);
        b.gelu(s.ffn);
        b.matmul(s.ffn, l.w_down, opt(l.b_down), s.proj);
      }
    }
    if (!fused) b.add(s.x, s.proj);
    if (n_out == 0) return;
    b.gather_rows(s.x, logits_rows.data(), n_out, s.last);
    norm(s.last, out_norm_, out_norm_b_, s.last_n);
    b.matmul(s.last_n, lm_head_, nullptr, s.out);
  };
  b.run_step(decode ? (decode_generation_ << 16) + M : -1, ops);
  if (mode == Out::greedy_started) {
    b.argmax_rows_start(s.out);
    started_.push_back(std::move(started));
    return {};
  }
  if (greedy) {
    greedy->assign(static_cast<size_t>(n_out), 0);
    if (n_out > 0 && !b.argmax_rows(s.out, greedy->data())) {
      std::vector<float> logits(static_cast<size_t>(n_out * c.vocab_size));
      b.download(s.out, logits.data());
      for (int64_t r = 0; r < n_out; ++r)
        (*greedy)[r] = greedy_argmax(std::span<const float>(logits.data() + r * c.vocab_size,
                                                            static_cast<size_t>(c.vocab_size)));
    }
    return {};
  }
  std::vector<float> logits(static_cast<size_t>(n_out * c.vocab_size));
  if (n_out > 0) b.download(s.out, logits.data());
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
