// The engine's model graph on the CPU backend (src/llm/model, cpu_backend, generate): tiny random
// Llama / Qwen2 / GPT-2 models against a float64 reference written here from the published
// architectures, KV-cache and batching invariants, and the real SmolLM2-135M (skips if absent).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "expect_error.hpp"
#include "llm/generate.hpp"
#include "llm/gguf.hpp"
#include "llm/logits_dump.hpp"
#include "llm/model.hpp"
#include "llm_test_files.hpp"

namespace tessel::llm {
namespace {

class MemorySource : public WeightSource {
 public:
  std::map<std::string, HostTensor> t;
  bool has(const std::string& n) const override { return t.count(n) != 0; }
  std::vector<int64_t> shape(const std::string& n) const override { return t.at(n).shape; }
  HostTensor load(const std::string& n) const override { return t.at(n); }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [k, v] : t) out.push_back(k);
    return out;
  }
};

ModelConfig tiny(const std::string& arch, RopeStyle style = RopeStyle::gptj) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 37;
  c.hidden_size = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = arch == "gpt2" ? 4 : 2;
  c.head_dim = 6;
  c.ffn_size = 40;
  c.max_positions = 64;
  c.norm_eps = 1e-5;
  c.rope_theta = 100.0;
  c.rope_dim = 6;
  c.rope_style = style;
  if (arch == "qwen2") c.qkv_bias = true;
  if (arch == "gpt2") {
    c.rope_style = RopeStyle::none;
    c.norm = NormKind::layer;
    c.ffn = FfnKind::gelu;
    c.qkv_bias = c.all_biases = c.learned_positions = c.tie_embeddings = true;
  }
  return c;
}

MemorySource random_weights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  MemorySource s;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale,
                 float offset = 0.f) {
    HostTensor t;
    t.shape = shape;
    std::uniform_real_distribution<float> u(-scale, scale);
    t.data.resize(static_cast<size_t>(t.numel()));
    for (float& x : t.data) x = offset + u(rng);
    s.t[name] = std::move(t);
  };
  const int64_t H = c.hidden_size, F = c.ffn_size, V = c.vocab_size;
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const float wH = 1.5f / std::sqrt(static_cast<float>(H));
  add("token_embd.weight", {V, H}, 1.0f);
  add("output_norm.weight", {H}, 0.2f, 1.0f);
  if (c.arch == "gpt2") {
    add("position_embd.weight", {c.max_positions, H}, 0.3f);
    add("output_norm.bias", {H}, 0.1f);
  }
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string g = "blk." + std::to_string(i) + ".";
    add(g + "attn_norm.weight", {H}, 0.2f, 1.0f);
    add(g + "ffn_norm.weight", {H}, 0.2f, 1.0f);
    add(g + "attn_output.weight", {H, qd}, wH);
    add(g + "ffn_down.weight", {H, F}, 1.5f / std::sqrt(static_cast<float>(F)));
    if (c.arch == "gpt2") {
      add(g + "attn_norm.bias", {H}, 0.1f);
      add(g + "ffn_norm.bias", {H}, 0.1f);
      add(g + "attn_qkv.weight", {3 * H, H}, wH);
      add(g + "attn_qkv.bias", {3 * H}, 0.1f);
      add(g + "attn_output.bias", {H}, 0.1f);
      add(g + "ffn_up.weight", {F, H}, wH);
      add(g + "ffn_up.bias", {F}, 0.1f);
      add(g + "ffn_down.bias", {H}, 0.1f);
    } else {
      add(g + "attn_q.weight", {qd, H}, wH);
      add(g + "attn_k.weight", {kvd, H}, wH);
      add(g + "attn_v.weight", {kvd, H}, wH);
      if (c.qkv_bias) {
        add(g + "attn_q.bias", {qd}, 0.2f);
        add(g + "attn_k.bias", {kvd}, 0.2f);
        add(g + "attn_v.bias", {kvd}, 0.2f);
      }
      add(g + "ffn_gate.weight", {F, H}, wH);
      add(g + "ffn_up.weight", {F, H}, wH);
    }
  }
  if (!c.tie_embeddings) add("output.weight", {V, H}, wH);
  return s;
}

// ---- float64 reference: one sequence, full causal attention, no cache -------------------------
using Mat = std::vector<std::vector<double>>;

Mat linear(const Mat& x, const HostTensor& w, const HostTensor* b) {
  const int64_t N = w.shape[0], K = w.shape[1];
  Mat y(x.size(), std::vector<double>(static_cast<size_t>(N)));
  for (size_t m = 0; m < x.size(); ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b ? b->data[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) s += x[m][k] * static_cast<double>(w.data[n * K + k]);
      y[m][n] = s;
    }
  return y;
}

Mat ref_forward(const ModelConfig& c, const MemorySource& s, const std::vector<int32_t>& tokens) {
  auto W = [&](const std::string& n) -> const HostTensor& { return s.t.at(n); };
  auto Wopt = [&](const std::string& n) -> const HostTensor* {
    return s.has(n) ? &s.t.at(n) : nullptr;
  };
  const int64_t H = c.hidden_size, T = static_cast<int64_t>(tokens.size()), D = c.head_dim;
  Mat x(T, std::vector<double>(H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      x[t][h] = W("token_embd.weight").data[tokens[t] * H + h];
      if (c.learned_positions) x[t][h] += W("position_embd.weight").data[t * H + h];
    }
  auto norm = [&](const Mat& in, const std::string& w, const std::string& b) {
    Mat out = in;
    for (auto& row : out) {
      double mean = 0, sq = 0;
      for (double v : row) mean += v;
      mean /= H;
      if (c.norm == NormKind::rms) mean = 0;
      for (double v : row) sq += (v - mean) * (v - mean);
      const double inv = 1 / std::sqrt(sq / H + c.norm_eps);
      for (int64_t h = 0; h < H; ++h)
        row[h] =
            (row[h] - mean) * inv * W(w).data[h] + (c.norm == NormKind::layer ? W(b).data[h] : 0);
    }
    return out;
  };
  auto rope = [&](Mat& m, int64_t heads) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
          const double th = t * std::pow(c.rope_theta, -2.0 * i / c.rope_dim);
          const int64_t a = hd * D + (c.rope_style == RopeStyle::neox ? i : 2 * i);
          const int64_t b =
              hd * D + (c.rope_style == RopeStyle::neox ? i + c.rope_dim / 2 : 2 * i + 1);
          const double x0 = m[t][a], x1 = m[t][b];
          m[t][a] = x0 * std::cos(th) - x1 * std::sin(th);
          m[t][b] = x0 * std::sin(th) + x1 * std::cos(th);
        }
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".";
    const Mat xn = norm(x, g + "attn_norm.weight", g + "attn_norm.bias");
    Mat q, k, v;
    if (c.arch == "gpt2") {
      const Mat qkv = linear(xn, W(g + "attn_qkv.weight"), &W(g + "attn_qkv.bias"));
      for (const auto& row : qkv) {
        q.emplace_back(row.begin(), row.begin() + H);
        k.emplace_back(row.begin() + H, row.begin() + 2 * H);
        v.emplace_back(row.begin() + 2 * H, row.end());
      }
    } else {
      q = linear(xn, W(g + "attn_q.weight"), Wopt(g + "attn_q.bias"));
      k = linear(xn, W(g + "attn_k.weight"), Wopt(g + "attn_k.bias"));
      v = linear(xn, W(g + "attn_v.weight"), Wopt(g + "attn_v.bias"));
      rope(q, c.n_heads);
      rope(k, c.n_kv_heads);
    }
    Mat att(T, std::vector<double>(c.n_heads * D, 0.0));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hd = 0; hd < c.n_heads; ++hd) {
        const int64_t kh = hd / (c.n_heads / c.n_kv_heads);
        std::vector<double> p(t + 1);
        double mx = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[t][hd * D + e] * k[u][kh * D + e];
          p[u] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, p[u]);
        }
        for (double& e : p) sum += e = std::exp(e - mx);
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t e = 0; e < D; ++e) att[t][hd * D + e] += p[u] / sum * v[u][kh * D + e];
      }
    const Mat o = linear(att, W(g + "attn_output.weight"), Wopt(g + "attn_output.bias"));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) x[t][h] += o[t][h];
    const Mat xn2 = norm(x, g + "ffn_norm.weight", g + "ffn_norm.bias");
    Mat act;
    if (c.ffn == FfnKind::silu_gated) {
      const Mat ga = linear(xn2, W(g + "ffn_gate.weight"), nullptr);
      act = linear(xn2, W(g + "ffn_up.weight"), nullptr);
      for (size_t t = 0; t < act.size(); ++t)
        for (size_t f = 0; f < act[t].size(); ++f)
          act[t][f] *= ga[t][f] / (1 + std::exp(-ga[t][f]));
    } else {
      act = linear(xn2, W(g + "ffn_up.weight"), &W(g + "ffn_up.bias"));
      for (auto& row : act)
        for (double& a : row)
          a = 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
    }
    const Mat d = linear(act, W(g + "ffn_down.weight"), Wopt(g + "ffn_down.bias"));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) x[t][h] += d[t][h];
  }
  const Mat xf = norm(x, "output_norm.weight", "output_norm.bias");
  return linear(xf, c.tie_embeddings ? W("token_embd.weight") : W("output.weight"), nullptr);
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

std::vector<float> prefill_all(Model& m, const std::vector<int32_t>& toks, int32_t slot = 0) {
  std::vector<int32_t> slots(toks.size(), slot), pos(toks.size());
  std::vector<int64_t> rows(toks.size());
  for (size_t i = 0; i < toks.size(); ++i) pos[i] = static_cast<int32_t>(i), rows[i] = i;
  return m.forward(toks, slots, pos, rows);
}

void expect_matches_reference(const ModelConfig& c, uint32_t seed) {
  const MemorySource src = random_weights(c, seed);
  Model m(make_cpu_backend(2), c, src, false);
  m.reserve(1, 32);
  const auto toks = random_tokens(13, static_cast<int>(c.vocab_size), seed + 1);
  const auto got = prefill_all(m, toks);
  const Mat want = ref_forward(c, src, toks);
  double max_err = 0, max_ref = 0;
  for (size_t t = 0; t < toks.size(); ++t)
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      max_err = std::max(max_err, std::abs(got[t * c.vocab_size + v] - want[t][v]));
      max_ref = std::max(max_ref, std::abs(want[t][v]));
    }
  EXPECT_GT(max_ref, 0.1) << "degenerate test model";
  EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_ref)) << c.arch << " max |ref| " << max_ref;
}

TEST(LlmModelCpu, LlamaGptjRopeMatchesReference) { expect_matches_reference(tiny("llama"), 1); }
TEST(LlmModelCpu, LlamaNeoxRopeMatchesReference) {
  expect_matches_reference(tiny("llama", RopeStyle::neox), 2);
}
TEST(LlmModelCpu, Qwen2BiasMatchesReference) {
  expect_matches_reference(tiny("qwen2", RopeStyle::neox), 3);
}
TEST(LlmModelCpu, Gpt2MatchesReference) { expect_matches_reference(tiny("gpt2"), 4); }
TEST(LlmModelCpu, PartialRopeAndTiedHead) {
  ModelConfig c = tiny("llama");
  c.rope_dim = 4;
  c.tie_embeddings = true;
  expect_matches_reference(c, 5);
}

TEST(LlmModelCpu, DecodeWithCacheEqualsPrefill) {
  const ModelConfig c = tiny("llama");
  const MemorySource src = random_weights(c, 11);
  Model m(make_cpu_backend(2), c, src, false);
  m.reserve(2, 32);
  const auto toks = random_tokens(9, 37, 12);
  const auto full = prefill_all(m, toks, 0);
  // Slot 1: first 4 tokens at once, then one token per step.
  std::vector<int32_t> head(toks.begin(), toks.begin() + 4);
  std::vector<float> got;
  {
    std::vector<int32_t> slots(4, 1), pos{0, 1, 2, 3};
    got = m.forward(head, slots, pos, {0, 1, 2, 3});
  }
  for (int32_t p = 4; p < 9; ++p) {
    const auto l = m.forward({toks[p]}, {1}, {p}, {0});
    got.insert(got.end(), l.begin(), l.end());
  }
  ASSERT_EQ(got.size(), full.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], full[i], 1e-4) << i;
}

TEST(LlmModelCpu, BatchedGenerationEqualsOneByOne) {
  const ModelConfig c = tiny("qwen2", RopeStyle::neox);
  const MemorySource src = random_weights(c, 21);
  Model m(make_cpu_backend(2), c, src, false);
  const std::vector<std::vector<int32_t>> prompts = {
      random_tokens(5, 37, 1), random_tokens(1, 37, 2), random_tokens(11, 37, 3)};
  GenerateOptions o;
  o.max_tokens = 12;
  o.sampling.temperature = 0;
  auto detok = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  std::vector<std::string> streamed(3);
  const auto batched =
      generate(m, prompts, o, detok, [&](size_t i, const std::string& p) { streamed[i] += p; });
  for (size_t i = 0; i < prompts.size(); ++i) {
    Model single(make_cpu_backend(1), c, src, false);
    const auto one = generate(single, {prompts[i]}, o, detok);
    EXPECT_EQ(batched[i].tokens, one[0].tokens) << "prompt " << i;
    EXPECT_EQ(batched[i].tokens.size(), 12u);
    EXPECT_EQ(batched[i].finish_reason, "length");
    EXPECT_EQ(streamed[i], batched[i].text);
  }
  // Sampling with a seed is reproducible.
  o.sampling.temperature = 1.0f;
  o.sampling.seed = 99;
  const auto s1 = generate(m, prompts, o, detok);
  const auto s2 = generate(m, prompts, o, detok);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(s1[i].tokens, s2[i].tokens);
}

TEST(LlmModelCpu, ReusedPrefixEqualsFullPrefill) {
  const ModelConfig c = tiny("llama");
  const MemorySource src = random_weights(c, 71);
  GenerateOptions o;
  o.max_tokens = 6;
  o.sampling.temperature = 0;
  auto detok = [](int32_t id) { return std::to_string(id); };
  Model fresh(make_cpu_backend(2), c, src, false), reused(make_cpu_backend(2), c, src, false);
  reused.reserve(1, 64);
  const auto turn1 = random_tokens(9, 37, 72);
  const auto first = generate(reused, {turn1}, o, detok)[0];
  // The next turn extends the conversation: turn 1, its answer, new tokens.
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
  const auto extra = random_tokens(5, 37, 73);
  turn2.insert(turn2.end(), extra.begin(), extra.end());
  o.reuse_prefix = true;
  GenerateStats st;
  const auto a = generate(reused, {turn2}, o, detok, {}, &st)[0];
  // The cache held turn 1 and all but the last answer token (never fed back).
  EXPECT_EQ(st.prefill_tokens, 1 + 5);
  o.reuse_prefix = false;
  const auto b = generate(fresh, {turn2}, o, detok)[0];
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(reused.cached_tokens(0).size(), turn2.size() + a.tokens.size() - 1);
}

TEST(LlmModelCpu, StopTokensAndStrings) {
  const ModelConfig c = tiny("llama");
  const MemorySource src = random_weights(c, 31);
  Model m(make_cpu_backend(2), c, src, false);
  GenerateOptions o;
  o.max_tokens = 10;
  o.sampling.temperature = 0;
  auto detok = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  const auto prompt = random_tokens(4, 37, 5);
  const auto free_run = generate(m, {prompt}, o, detok)[0];
  ASSERT_EQ(free_run.tokens.size(), 10u);
  o.stop_tokens = {free_run.tokens[3]};
  const auto stopped = generate(m, {prompt}, o, detok)[0];
  EXPECT_EQ(stopped.finish_reason, "stop_token");
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), first));
  o.stop_tokens.clear();
  o.stop_strings = {"<" + std::to_string(free_run.tokens[2]) + "><"};
  const auto by_string = generate(m, {prompt}, o, detok)[0];
  EXPECT_EQ(by_string.finish_reason, "stop_string");
  EXPECT_EQ(by_string.text.find(o.stop_strings[0]), std::string::npos);
}

TEST(LlmModelCpu, HfNamesAndConv1DLayout) {
  // Llama: HF names map onto the same graph.
  const ModelConfig c = tiny("llama", RopeStyle::neox);
  const MemorySource gg = random_weights(c, 41);
  MemorySource hf;
  auto rename = [](const std::string& n) {
    static const std::map<std::string, std::string> layer = {
        {"attn_norm.weight", "input_layernorm.weight"},
        {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"}};
    if (n == "token_embd.weight") return std::string("model.embed_tokens.weight");
    if (n == "output_norm.weight") return std::string("model.norm.weight");
    if (n == "output.weight") return std::string("lm_head.weight");
    const size_t dot = n.find('.', 4);
    return "model.layers." + n.substr(4, dot - 4) + "." + layer.at(n.substr(dot + 1));
  };
  for (const auto& [n, t] : gg.t) hf.t[rename(n)] = t;
  Model a(make_cpu_backend(2), c, gg, false), b(make_cpu_backend(2), c, hf, true);
  a.reserve(1, 16);
  b.reserve(1, 16);
  const auto toks = random_tokens(6, 37, 9);
  EXPECT_EQ(prefill_all(a, toks), prefill_all(b, toks));

  // GPT-2: HF Conv1D weights are (in, out) under "transformer."; the loader transposes them.
  const ModelConfig g2 = tiny("gpt2");
  const MemorySource gs = random_weights(g2, 42);
  MemorySource hs;
  auto tr = [](const HostTensor& t) {
    HostTensor o;
    o.shape = {t.shape[1], t.shape[0]};
    o.data.resize(t.data.size());
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t j = 0; j < t.shape[1]; ++j)
        o.data[j * t.shape[0] + i] = t.data[i * t.shape[1] + j];
    return o;
  };
  const std::map<std::string, std::string> g2names = {
      {"attn_norm", "ln_1"},          {"ffn_norm", "ln_2"},   {"attn_qkv", "attn.c_attn"},
      {"attn_output", "attn.c_proj"}, {"ffn_up", "mlp.c_fc"}, {"ffn_down", "mlp.c_proj"}};
  for (const auto& [n, t] : gs.t) {
    std::string h;
    if (n == "token_embd.weight")
      h = "wte.weight";
    else if (n == "position_embd.weight")
      h = "wpe.weight";
    else if (n.rfind("output_norm.", 0) == 0)
      h = "ln_f." + n.substr(12);
    else {
      const size_t dot = n.find('.', 4), dot2 = n.rfind('.');
      const std::string part = n.substr(dot + 1, dot2 - dot - 1), kind = n.substr(dot2 + 1);
      h = "h." + n.substr(4, dot - 4) + "." + g2names.at(part) + "." + kind;
      if (kind == "weight" && t.shape.size() == 2) {
        hs.t["transformer." + h] = tr(t);
        continue;
      }
    }
    hs.t["transformer." + h] = t;
  }
  Model c2(make_cpu_backend(2), g2, gs, false), d2(make_cpu_backend(2), g2, hs, true);
  c2.reserve(1, 16);
  d2.reserve(1, 16);
  EXPECT_EQ(prefill_all(c2, toks), prefill_all(d2, toks));
}

// load_model() on a Hugging Face folder: config.json + model.safetensors (BF16 weights, HF names).
TEST(LlmModelCpu, LoadsHfFolder) {
  ModelConfig c = tiny("qwen2", RopeStyle::neox);
  c.max_positions = 32;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-6;
  c.tie_embeddings = true;
  MemorySource src = random_weights(c, 61);
  // Round the weights to bf16 so the folder and the in-memory model hold the same values.
  for (auto& [n, t] : src.t)
    for (float& v : t.data) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      bits &= 0xffff0000u;
      std::memcpy(&v, &bits, 4);
    }
  auto hf = [](const std::string& n) -> std::string {
    static const std::map<std::string, std::string> layer = {
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
        {"ffn_down.weight", "mlp.down_proj.weight"}};
    if (n == "token_embd.weight") return "model.embed_tokens.weight";
    if (n == "output_norm.weight") return "model.norm.weight";
    const size_t dot = n.find('.', 4);
    return "model.layers." + n.substr(4, dot - 4) + "." + layer.at(n.substr(dot + 1));
  };
  std::vector<test::StTensor> ts;
  for (const auto& [n, t] : src.t) {
    std::vector<uint8_t> bytes;
    for (float v : t.data) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      test::put(bytes, static_cast<uint16_t>(bits >> 16));
    }
    ts.push_back({hf(n), "BF16", t.shape, bytes});
  }
  const auto dir =
      std::filesystem::temp_directory_path() / ("tessel_llm_hf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    const auto img = test::build_safetensors(ts);
    std::ofstream(dir / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    std::ofstream(dir / "config.json") << R"({"model_type": "qwen2", "vocab_size": 37,
      "hidden_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 40, "max_position_embeddings": 32,
      "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true})";
  }
  LoadedModel lm = load_model(dir.string(), make_cpu_backend(2));
  EXPECT_EQ(lm.format, "safetensors");
  EXPECT_EQ(lm.tokenizer_json, (dir / "tokenizer.json").string());
  EXPECT_FALSE(lm.gguf_tokenizer.has_value());
  Model direct(make_cpu_backend(2), c, src, false);
  lm.model->reserve(1, 16);
  direct.reserve(1, 16);
  const auto toks = random_tokens(7, 37, 3);
  EXPECT_EQ(prefill_all(*lm.model, toks), prefill_all(direct, toks));
  std::filesystem::remove_all(dir);
}

TEST(LlmModelCpu, BadWeightsAndCallsAreErrors) {
  const ModelConfig c = tiny("llama");
  MemorySource src = random_weights(c, 51);
  src.t["blk.1.attn_k.weight"].shape = {12, 25};
  try {
    Model m(make_cpu_backend(1), c, src, false);
    ADD_FAILURE() << "accepted a wrong shape";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'blk.1.attn_k.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected shape (12, 24)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got (12, 25)"), std::string::npos) << msg;
  }
  src = random_weights(c, 51);
  src.t.erase("blk.0.ffn_gate.weight");
  EXPECT_THROW(Model(make_cpu_backend(1), c, src, false), Error);
  src = random_weights(c, 51);
  Model m(make_cpu_backend(1), c, src, false);
  EXPECT_THROW(m.forward({1}, {0}, {0}, {0}), Error);  // no cache reserved
  m.reserve(1, 8);
  EXPECT_THROW(m.forward({1}, {0}, {8}, {0}), Error);   // past the cache
  EXPECT_THROW(m.forward({99}, {0}, {0}, {0}), Error);  // token id out of range
  EXPECT_THROW(m.forward({1}, {1}, {0}, {0}), Error);   // no such slot
  EXPECT_THROW(m.reserve(1, 65), Error);                // beyond the context
}

// ---- the real model ---------------------------------------------------------------------------

std::string smollm2_path() {
  if (const char* p = std::getenv("TESSEL_SMOLLM2_GGUF")) return p;
#ifdef TESSEL_MODELS_DIR
  return std::string(TESSEL_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
#else
  return "";
#endif
}

// `tessel run --warmup N` runs generate() on the same prompts before the reported run: a
// shorter earlier run must leave no trace (the cache is reserved anew; same tokens as a fresh
// model, batch of two ragged prompts).
TEST(LlmGenerate, EarlierRunsLeaveNoTrace) {
  const ModelConfig c = tiny("llama", RopeStyle::neox);
  const MemorySource src = random_weights(c, 73);
  const auto p0 = random_tokens(6, 37, 11), p1 = random_tokens(2, 37, 12);
  GenerateOptions o;
  o.max_tokens = 7;
  o.sampling.temperature = 0;
  Model fresh(make_cpu_backend(2), c, src, false);
  const auto want = generate(fresh, {p0, p1}, o, {});
  Model warmed(make_cpu_backend(2), c, src, false);
  GenerateOptions w = o;
  w.max_tokens = 3;
  generate(warmed, {p0, p1}, w, {});
  const auto got = generate(warmed, {p0, p1}, o, {});
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
}

// `tessel run --prompt-ids`: ids parse exactly; bad lists name 'prompt-ids'.
TEST(LlmLogitsDump, ParsesTokenIds) {
  EXPECT_EQ(parse_token_ids("1,2, 3", 10), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_token_ids(" 9 ,0,", 10), (std::vector<int32_t>{9, 0}));
  EXPECT_EQ(parse_token_ids("7", 10), (std::vector<int32_t>{7}));
  for (const char* bad : {"", ",", "1,,2", "1;2", "x", "1.5", "99999999999999999999"})
    test::expect_invalid([&] { parse_token_ids(bad, 10); }, "run", "prompt-ids");
  test::expect_invalid([] { parse_token_ids("1,10", 10); }, "run", "prompt-ids", "10");
  test::expect_invalid([] { parse_token_ids("-1", 10); }, "run", "prompt-ids", "-1");
}

// The NPY 1.0 layout numpy.load expects: magic, version, little-endian header length, a header
// dict padded with spaces to a multiple of 64 ending in '\n', then the raw float32 data.
TEST(LlmLogitsDump, WritesNpyV1) {
  const auto path =
      std::filesystem::temp_directory_path() / ("tessel_npy_" + std::to_string(::getpid()));
  const std::vector<float> v = {1.5f, -2.f, 0.f, 3.25f, 1e-8f, -7.f};
  write_npy_f32(path.string(), {2, 3}, v);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  ASSERT_EQ(bytes.size(), 10 + hlen + v.size() * 4);
  const std::string header = bytes.substr(10, hlen);
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u)
      << header;
  std::vector<float> back(v.size());
  std::memcpy(back.data(), bytes.data() + 10 + hlen, back.size() * 4);
  EXPECT_EQ(back, v);
  write_npy_f32(path.string(), {4}, std::span<const float>(v).first(4));
  std::ifstream in1(path, std::ios::binary);
  const std::string b1((std::istreambuf_iterator<char>(in1)), std::istreambuf_iterator<char>());
  EXPECT_NE(b1.find("'shape': (4, )"), std::string::npos);
  test::expect_invalid([&] { write_npy_f32(path.string(), {4, 2}, v); }, "run", "logits");
  test::expect_invalid([&] { write_npy_f32("/nonexistent_dir/x.npy", {6}, v); }, "run",
                       "dump-logits");
  std::filesystem::remove(path);
}

// The on_logits hook behind --dump-logits: step 0 is the prefill's last row, every later step a
// decode row; greedy tokens are the argmax of the recorded rows; a sequence that stops early
// leaves NaN rows in the (sequences, steps, vocab) array.
TEST(LlmLogitsDump, RecordsEveryStepOfABatch) {
  const ModelConfig c = tiny("qwen2", RopeStyle::neox);
  const MemorySource src = random_weights(c, 71);
  Model m(make_cpu_backend(2), c, src, false);
  const auto p0 = random_tokens(5, 37, 8), p1 = random_tokens(3, 37, 9);
  GenerateOptions o;
  o.max_tokens = 6;
  o.sampling.temperature = 0;
  const auto free_run = generate(m, {p1}, o, {})[0];
  ASSERT_EQ(free_run.tokens.size(), 6u);
  o.stop_tokens = {free_run.tokens[2]};  // sequence 1 stops at its 3rd step (or earlier)
  LogitsRecorder rec(2, c.vocab_size);
  o.on_logits = [&](size_t i, std::span<const float> l) { rec.record(i, l); };
  const auto res = generate(m, {p0, p1}, o, {});
  ASSERT_EQ(rec.steps(1), static_cast<int64_t>(res[1].tokens.size()) + 1);  // + the stop step
  for (size_t i = 0; i < 2; ++i) {
    const int64_t steps = rec.steps(i);
    ASSERT_GE(steps, static_cast<int64_t>(res[i].tokens.size()));
    const auto path = std::filesystem::temp_directory_path() /
                      ("tessel_rec_" + std::to_string(::getpid()) + ".npy");
    rec.write_npy(path.string());
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove(path);
    const size_t hlen = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    const int64_t max_steps = std::max(rec.steps(0), rec.steps(1));
    EXPECT_NE(bytes.find("'shape': (2, " + std::to_string(max_steps) + ", 37)"), std::string::npos);
    ASSERT_EQ(bytes.size(), 10 + hlen + static_cast<size_t>(2 * max_steps * 37 * 4));
    std::vector<float> all(static_cast<size_t>(2 * max_steps * 37));
    std::memcpy(all.data(), bytes.data() + 10 + hlen, all.size() * 4);
    const float* seq = all.data() + i * max_steps * 37;
    for (int64_t t = 0; t < max_steps; ++t) {
      const float* row = seq + t * 37;
      if (t >= steps) {
        EXPECT_TRUE(std::isnan(row[0])) << "seq " << i << " step " << t;
        continue;
      }
      const int32_t arg = static_cast<int32_t>(std::max_element(row, row + 37) - row);
      const int32_t want =
          t < static_cast<int64_t>(res[i].tokens.size()) ? res[i].tokens[t] : o.stop_tokens[0];
      EXPECT_EQ(arg, want) << "seq " << i << " step " << t;
    }
    // Step 0 equals the logits of a plain prefill of the prompt (another row blocking in the
    // matmul may round differently).
    Model fresh(make_cpu_backend(2), c, src, false);
    fresh.reserve(1, 16);
    const auto ref = prefill_all(fresh, i == 0 ? p0 : p1);
    const size_t last = ref.size() - 37;
    for (int v = 0; v < 37; ++v) EXPECT_NEAR(seq[v], ref[last + v], 1e-5f) << v;
  }
  if (res[0].finish_reason == "length") EXPECT_EQ(rec.steps(0), 6);
  EXPECT_EQ(res[1].finish_reason, "stop_token");
}

// Prompts as token ids of SmolLM2's vocabulary (looked up in the GGUF's token list), so the test
// does not depend on the tokenizer: the chat-formatted
// "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n" and the
// plain "Once upon a time".
const std::vector<int32_t> kSmolChatPrompt = {1,    4093, 198, 1780, 314, 260, 3575, 282,
                                              4649, 47,   2,   198,  1,   520, 9531, 198};
const std::vector<int32_t> kSmolPlainPrompt = {6403, 1980, 253, 655};

TEST(LlmSmolLM2Cpu, GreedyMatchesRecordedTokens) {
  const std::string path = smollm2_path();
  if (path.empty() || !std::filesystem::exists(path))
    GTEST_SKIP() << "SmolLM2 GGUF not found at '" << path
                 << "' (scripts/setup.sh fetches it; or set TESSEL_SMOLLM2_GGUF)";
  LoadedModel lm = load_model(path, make_cpu_backend(0));
  ASSERT_TRUE(lm.gguf_tokenizer.has_value());
  const auto& vocab = lm.gguf_tokenizer->tokens;
  ASSERT_EQ(vocab.size(), 49152u);
  EXPECT_EQ(vocab[kSmolChatPrompt[3]], "What");
  EXPECT_EQ(vocab[kSmolChatPrompt[8]], "ĠFrance");
  EXPECT_EQ(vocab[kSmolPlainPrompt[1]], "Ġupon");
  // The tokenizer built from the same metadata agrees with the hand-looked-up ids.
  const Tokenizer tok = Tokenizer::from_data(*lm.gguf_tokenizer);
  EXPECT_EQ(tok.encode("Once upon a time", false), kSmolPlainPrompt);
  EXPECT_EQ(tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\n",
                       false),
            kSmolChatPrompt);
  GenerateOptions o;
  o.max_tokens = 24;
  o.sampling.temperature = 0;
  o.stop_tokens = {2};  // <|im_end|>
  // Both prompts in one batch: the batched path must give each prompt's own greedy tokens.
  const auto out = generate(*lm.model, {kSmolChatPrompt, kSmolPlainPrompt}, o,
                            [&](int32_t id) { return vocab[id]; });
  // Recorded from this engine (greedy, float32 CPU). The chat answer reads "The capital of France
  // is Paris."; docs/engine.md says how these were cross-checked.
  const std::vector<int32_t> want_chat = {504, 3575, 282, 4649, 314, 7042, 30};
  // ", the city of Nova Haven was a thriving metropolis, with towering skyscrapers and bustling
  // streets. But as the years went by"
  const std::vector<int32_t> want_plain = {28,    260,   2240, 282, 23324, 27108, 436,  253,
                                           15114, 39228, 28,   351, 25854, 41658, 284,  14055,
                                           9018,  30,    1249, 347, 260,   929,   3514, 411};
  auto show = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s += std::to_string(t) + ":" + vocab[t] + " ";
    return s;
  };
  EXPECT_EQ(out[0].tokens, want_chat) << show(out[0].tokens);
  EXPECT_EQ(out[0].finish_reason, "stop_token");
  EXPECT_EQ(out[1].tokens, want_plain) << show(out[1].tokens);

  // First-step logits against a float64 numpy forward over gguf-py's dequantized weights
  // (tools/llm/smollm2_numpy_reference.py): the top 5 of each prompt.
  const std::vector<std::vector<std::pair<int32_t, double>>> top5 = {
      {{504, 27.8588}, {60, 26.1295}, {38634, 26.1015}, {15319, 25.9623}, {7026, 25.1814}},
      {{28, 18.142}, {281, 14.0825}, {665, 13.3672}, {260, 12.9355}, {253, 12.928}}};
  const std::vector<std::vector<int32_t>> prompts = {kSmolChatPrompt, kSmolPlainPrompt};
  for (size_t p = 0; p < prompts.size(); ++p) {
    lm.model->reserve(1, 64);
    std::vector<int32_t> slots(prompts[p].size(), 0), pos(prompts[p].size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    const auto logits =
        lm.model->forward(prompts[p], slots, pos, {static_cast<int64_t>(pos.size()) - 1});
    for (const auto& [id, want] : top5[p]) EXPECT_NEAR(logits[id], want, 2e-3) << "token " << id;
  }
}

}  // namespace
}  // namespace tessel::llm
