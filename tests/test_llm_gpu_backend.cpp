// The engine's GPU backend (src/llm/gpu_backend.cpp) against its float32 CPU backend: the same
// model graph on tiny random Llama / Qwen2 / GPT-2 models (head_dim 64, as decode_attention
// needs), batched ragged prefill then decode steps, and SmolLM2-135M when its GGUF is present.
//
// Tolerance: the weights are rounded to bf16 before both backends see them, so the backends
// differ only by the GPU's bf16 activations (one rounding per op output, fp32 math inside):
// |gpu − cpu| <= 0.08·max|cpu| + 0.02 over every logit of a step. Measured on H100: the
// Llama-like models (peaked attention on purpose: 3× q/k weights, |logit| ~3) reach 0.14 (~5%);
// the GPT-2-like one 0.35 over |logit| 80 (0.4%). A wrong position, slot or rotation gives
// O(100%). Greedy tokens must agree wherever the CPU's top-2 gap exceeds twice that bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "expect_error.hpp"
#include "llm/generate.hpp"
#include "llm/model.hpp"
#include "test_util.hpp"

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

float round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// Ragged but kernel-legal sizes: gemm needs row pitches of 8 elements, decode attention D 64.
ModelConfig small(const std::string& arch, RopeStyle style = RopeStyle::neox) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 136;
  c.hidden_size = 200;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = arch == "gpt2" ? 4 : 2;
  c.head_dim = 64;
  c.ffn_size = 328;
  c.max_positions = 96;
  c.norm_eps = 1e-5;
  c.rope_theta = 1000.0;
  c.rope_dim = 64;
  c.rope_style = style;
  if (arch == "qwen2") c.qkv_bias = true;
  if (arch == "gpt2") {
    c.rope_style = RopeStyle::none;
    c.norm = NormKind::layer;
    c.ffn = FfnKind::gelu;
    c.qkv_bias = c.all_biases = c.learned_positions = c.tie_embeddings = true;
    c.hidden_size = c.n_heads * c.head_dim;  // GPT-2's fused qkv is (3·H, H)
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
    for (float& x : t.data) x = round_bf16(offset + u(rng));
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
    add(g + "attn_output.weight", {H, qd}, 1.5f / std::sqrt(static_cast<float>(qd)));
    add(g + "ffn_down.weight", {H, F}, 1.5f / std::sqrt(static_cast<float>(F)));
    if (c.arch == "gpt2") {
      add(g + "attn_norm.bias", {H}, 0.1f);
      add(g + "ffn_norm.bias", {H}, 0.1f);
      add(g + "attn_qkv.weight", {3 * qd, H}, wH);
      add(g + "attn_qkv.bias", {3 * qd}, 0.1f);
      add(g + "attn_output.bias", {H}, 0.1f);
      add(g + "ffn_up.weight", {F, H}, wH);
      add(g + "ffn_up.bias", {F}, 0.1f);
      add(g + "ffn_down.bias", {H}, 0.1f);
    } else {
      // Larger q/k weights give peaked attention, so a wrong position or slot shows.
      add(g + "attn_q.weight", {qd, H}, 3 * wH);
      add(g + "attn_k.weight", {kvd, H}, 3 * wH);
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

std::vector<int32_t> random_tokens(int n, int vocab, std::mt19937& rng) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

struct Compare {
  double max_err = 0, max_ref = 0;
  int greedy_checked = 0;
};

// Compares one step's logits (rows × V); checks argmax where the CPU's top-2 gap is clear.
void compare_step(const std::vector<float>& cpu, const std::vector<float>& gpu, int64_t V,
                  const std::string& what, Compare& acc) {
  ASSERT_EQ(cpu.size(), gpu.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << what << " logit " << i;
    err = std::max(err, std::abs(static_cast<double>(gpu[i]) - cpu[i]));
    ref = std::max(ref, std::abs(static_cast<double>(cpu[i])));
  }
  const double tol = 0.08 * ref + 0.02;
  EXPECT_LE(err, tol) << what << ": max |gpu - cpu| " << err << ", max |cpu| " << ref;
  acc.max_err = std::max(acc.max_err, err);
  acc.max_ref = std::max(acc.max_ref, ref);
  for (size_t r = 0; r < cpu.size() / V; ++r) {
    const float* c = cpu.data() + r * V;
    const float* g = gpu.data() + r * V;
    std::vector<int> idx(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(),
                      [&](int a, int b) { return c[a] > c[b]; });
    if (c[idx[0]] - c[idx[1]] <= 2 * tol) continue;
    ++acc.greedy_checked;
    EXPECT_EQ(std::max_element(g, g + V) - g, idx[0]) << what << " row " << r;
  }
}

int argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

class LlmGpuBackend : public test::GpuTest {};

// Sets an environment variable for the lifetime of the object (backends read theirs when made
// or when the cache is reserved).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

// Two prompts of different lengths prefilled in one step (one attention call per sequence),
// then decode steps of both (one batched call; the rows' slot order flips every step).
void prefill_then_decode(const ModelConfig& c, uint32_t seed, int min_greedy = 5) {
  const MemorySource src = random_weights(c, seed);
  Model cpu(make_cpu_backend(2), c, src, false);
  Model gpu(make_backend("gpu"), c, src, false);
  cpu.reserve(3, 64);
  gpu.reserve(3, 64);
  std::mt19937 rng(seed + 7);
  const int64_t V = c.vocab_size;
  const std::vector<int32_t> a = random_tokens(7, static_cast<int>(V), rng);
  const std::vector<int32_t> b = random_tokens(19, static_cast<int>(V), rng);
  // Slots 2 and 0: the cache rows need not follow the batch order.
  std::vector<int32_t> toks, slots, pos;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < a.size(); ++i)
    toks.push_back(a[i]), slots.push_back(2), pos.push_back(static_cast<int32_t>(i));
  for (size_t i = 0; i < b.size(); ++i)
    toks.push_back(b[i]), slots.push_back(0), pos.push_back(static_cast<int32_t>(i));
  for (size_t i = 0; i < toks.size(); ++i) rows.push_back(static_cast<int64_t>(i));
  Compare acc;
  const auto lc = cpu.forward(toks, slots, pos, rows);
  const auto lg = gpu.forward(toks, slots, pos, rows);
  compare_step(lc, lg, V, c.arch + " prefill", acc);
  int32_t next_a = argmax(lc.data() + (a.size() - 1) * V, V);
  int32_t next_b = argmax(lc.data() + (toks.size() - 1) * V, V);
  int32_t pa = static_cast<int32_t>(a.size()), pb = static_cast<int32_t>(b.size());
  for (int step = 0; step < 8; ++step) {
    // The CPU's greedy tokens drive both, so a near-tie cannot make the two runs diverge.
    const bool flip = step % 2 == 1;
    const std::vector<int32_t> t =
        flip ? std::vector<int32_t>{next_b, next_a} : std::vector<int32_t>{next_a, next_b};
    const std::vector<int32_t> s = flip ? std::vector<int32_t>{0, 2} : std::vector<int32_t>{2, 0};
    const std::vector<int32_t> p =
        flip ? std::vector<int32_t>{pb, pa} : std::vector<int32_t>{pa, pb};
    const auto dc = cpu.forward(t, s, p, {0, 1});
    const auto dg = gpu.forward(t, s, p, {0, 1});
    compare_step(dc, dg, V, c.arch + " decode step " + std::to_string(step), acc);
    next_a = argmax(dc.data() + (flip ? V : 0), V);
    next_b = argmax(dc.data() + (flip ? 0 : V), V);
    ++pa, ++pb;
  }
  EXPECT_GT(acc.max_ref, 0.5) << "degenerate test model";
  // 7 to 41 of the 42 rows have a top-2 gap above 2·tol on H100; fewer means a degenerate check.
  EXPECT_GE(acc.greedy_checked, min_greedy) << "too few clear greedy decisions to check";
  std::printf("[ %s ] max |gpu - cpu| %.4f over max |logit| %.3f; %d greedy rows checked\n",
              c.arch.c_str(), acc.max_err, acc.max_ref, acc.greedy_checked);
}

TEST_F(LlmGpuBackend, LlamaNeoxMatchesCpu) { prefill_then_decode(small("llama"), 11); }
// Llama-3.2-1B's layer widths (two layers): the decode GEMMs on the shapes the engine tunes for
// (whole-slab ring runs over the SMs, the 2048-wide fused norms), decode steps of 2 rows. Its
// 2048-wide rows leave fewer logits rows with a top-2 gap above 2·tol (3 of 42 on an H200):
// 2 required.
TEST_F(LlmGpuBackend, WideLlamaDecodeMatchesCpu) {
  ModelConfig c = small("llama");
  c.hidden_size = 2048;
  c.n_layers = 2;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.ffn_size = 8192;
  prefill_then_decode(c, 12, 2);
}
// Pages of 8 tokens: the 7- and 19-token prompts and their decode steps cross page boundaries
// (pages allocated as the sequences grow, the pool grows and moves mid-decode).
TEST_F(LlmGpuBackend, PagedCacheAcrossPagesMatchesCpu) {
  ScopedEnv page("TESSEL_KV_PAGE_SIZE", "8");
  prefill_then_decode(small("llama"), 15);
}
TEST_F(LlmGpuBackend, PagedCacheOnePageMatchesCpu) {
  ScopedEnv page("TESSEL_KV_PAGE_SIZE", "1");
  prefill_then_decode(small("qwen2"), 16);
}

// Decode steps replayed from CUDA graphs give bit-identical logits to the same steps launched
// one op at a time: 3 sequences, positions advancing, the rows' slot order rotating, a batch
// size change (a sequence finishes, its slot is released and a new prompt reuses it), and
// 8-token pages so that page allocation and pool growth happen between replays.
TEST_F(LlmGpuBackend, CudaGraphStepsEqualEagerSteps) {
  const ModelConfig c = small("llama");
  const MemorySource src = random_weights(c, 41);
  ScopedEnv page("TESSEL_KV_PAGE_SIZE", "8");
  std::unique_ptr<Model> eager;
  {
    ScopedEnv off("TESSEL_CUDA_GRAPHS", "0");
    eager = std::make_unique<Model>(make_backend("gpu"), c, src, false);
  }
  Model graphs(make_backend("gpu"), c, src, false);
  ASSERT_NE(graphs.backend().name().find("CUDA graphs"), std::string::npos)
      << graphs.backend().name();
  ASSERT_EQ(eager->backend().name().find("CUDA graphs"), std::string::npos);
  eager->reserve(4, 64);
  graphs.reserve(4, 64);
  std::mt19937 rng(9);
  const int64_t V = c.vocab_size;
  auto both = [&](const std::vector<int32_t>& t, const std::vector<int32_t>& s,
                  const std::vector<int32_t>& p, const std::vector<int64_t>& rows,
                  const std::string& what) {
    const auto le = eager->forward(t, s, p, rows);
    const auto lg = graphs.forward(t, s, p, rows);
    EXPECT_EQ(le.size(), lg.size());
    EXPECT_EQ(std::memcmp(le.data(), lg.data(), le.size() * 4), 0) << what;
    return le;
  };
  auto prefill = [&](int32_t slot, int n) {
    const std::vector<int32_t> t = random_tokens(n, static_cast<int>(V), rng);
    std::vector<int32_t> s(n, slot), p(n);
    for (int i = 0; i < n; ++i) p[i] = i;
    const auto l = both(t, s, p, {n - 1}, "prefill of slot " + std::to_string(slot));
    return argmax(l.data(), V);
  };
  std::map<int32_t, std::pair<int32_t, int32_t>> seq;  // slot -> (next token, position)
  seq[1] = {prefill(1, 5), 5};
  seq[0] = {prefill(0, 12), 12};
  seq[3] = {prefill(3, 3), 3};
  double spread = 0;
  for (int step = 0; step < 20; ++step) {
    if (step == 9) {  // slot 3 finishes; slot 2 starts a new 6-token prompt
      seq.erase(3);
      graphs.release_slot(3);
      eager->release_slot(3);
      seq[2] = {prefill(2, 6), 6};
    }
    std::vector<int32_t> order;
    for (const auto& [slot, st] : seq) order.push_back(slot);
    std::rotate(order.begin(), order.begin() + step % order.size(), order.end());
    std::vector<int32_t> t, s, p;
    std::vector<int64_t> rows;
    for (int32_t slot : order) {
      t.push_back(seq[slot].first);
      s.push_back(slot);
      p.push_back(seq[slot].second);
      rows.push_back(static_cast<int64_t>(rows.size()));
    }
    const auto l = both(t, s, p, rows, "decode step " + std::to_string(step));
    for (size_t i = 0; i < order.size(); ++i) {
      seq[order[i]] = {argmax(l.data() + i * V, V), seq[order[i]].second + 1};
      const auto [lo, hi] = std::minmax_element(l.begin() + i * V, l.begin() + (i + 1) * V);
      spread = std::max(spread, static_cast<double>(*hi - *lo));
    }
  }
  EXPECT_GT(spread, 0.5) << "degenerate logits";
}
TEST_F(LlmGpuBackend, LlamaGptjRopeMatchesCpu) {
  prefill_then_decode(small("llama", RopeStyle::gptj), 12);
}
// Partial rotary (rope_dim 32 of head_dim 64): the fused rope + KV append copies the k
// features past rope_dim into the cache unrotated.
TEST_F(LlmGpuBackend, PartialRotaryMatchesCpu) {
  ModelConfig c = small("llama");
  c.rope_dim = 32;
  ScopedEnv page("TESSEL_KV_PAGE_SIZE", "8");
  prefill_then_decode(c, 17);
}
TEST_F(LlmGpuBackend, Qwen2BiasMatchesCpu) { prefill_then_decode(small("qwen2"), 13); }
TEST_F(LlmGpuBackend, Gpt2MatchesCpu) { prefill_then_decode(small("gpt2"), 14); }

// Equal-length prompts take the batched prefill path (B = 2, Sq = 9); generate() batches too.
TEST_F(LlmGpuBackend, BatchedGenerateMatchesCpu) {
  const ModelConfig c = small("qwen2");
  const MemorySource src = random_weights(c, 21);
  Model cpu(make_cpu_backend(2), c, src, false);
  Model gpu(make_backend("gpu"), c, src, false);
  std::mt19937 rng(5);
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(9, 136, rng),
                                                     random_tokens(9, 136, rng)};
  cpu.reserve(2, 32);
  gpu.reserve(2, 32);
  std::vector<int32_t> toks, slots, pos;
  std::vector<int64_t> rows;
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 9; ++i)
      toks.push_back(prompts[s][i]), slots.push_back(s), pos.push_back(i),
          rows.push_back(s * 9 + i);
  Compare acc;
  compare_step(cpu.forward(toks, slots, pos, rows), gpu.forward(toks, slots, pos, rows),
               c.vocab_size, "batched prefill", acc);
  GenerateOptions o;
  o.max_tokens = 10;
  o.sampling.temperature = 0;
  auto detok = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  const auto rc = generate(cpu, prompts, o, detok);
  const auto rg = generate(gpu, prompts, o, detok);
  // Each GPU pick against the CPU's logits after the same tokens (the CPU teacher-forced on the
  // GPU's continuation): where the CPU's top-2 gap is clear (> 2 · the logits bound) the pick is
  // the CPU's argmax; in a near tie it must be within that bound of the CPU's best. Until the
  // first near tie the two continuations are then equal.
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(rg[i].tokens.size(), 10u);
    ASSERT_EQ(rc[i].tokens.size(), 10u);
    Model forced(make_cpu_backend(2), c, src, false);
    forced.reserve(1, 32);
    std::vector<int32_t> t = prompts[i], sl, ps;
    t.insert(t.end(), rg[i].tokens.begin(), rg[i].tokens.end() - 1);
    std::vector<int64_t> rs;
    for (size_t j = 0; j < t.size(); ++j) {
      sl.push_back(0), ps.push_back(static_cast<int32_t>(j));
      if (j + 1 >= prompts[i].size()) rs.push_back(static_cast<int64_t>(j));
    }
    const std::vector<float> lg = forced.forward(t, sl, ps, rs);
    ASSERT_EQ(lg.size(), 10u * c.vocab_size);
    const double tol = 0.08 * acc.max_ref + 0.02;
    bool tied_before = false;
    for (size_t j = 0; j < 10; ++j) {
      const float* row = lg.data() + j * c.vocab_size;
      std::vector<float> sorted(row, row + c.vocab_size);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      const int best = argmax(row, c.vocab_size), pick = rg[i].tokens[j];
      const bool clear = sorted[0] - sorted[1] > 2 * tol;
      if (!clear) tied_before = true;  // either backend may take either branch from here
      if (!tied_before) EXPECT_EQ(pick, rc[i].tokens[j]) << "prompt " << i << " step " << j;
      if (clear)
        EXPECT_EQ(pick, best) << "prompt " << i << " step " << j << ": " << rg[i].text << " vs "
                              << rc[i].text;
      else
        EXPECT_GE(row[pick], sorted[0] - 2 * tol) << "prompt " << i << " step " << j;
    }
  }
}

// Greedy decode with the next step in flight (Model::greedy_start / greedy_finish, fed tokens
// on the device) against one step at a time (TESSEL_DECODE_PIPELINE=0) on the same weights:
// three prompts; stop tokens taken from the unpipelined continuations end the sequences at
// different steps (the pipelined run then drops its speculative step and reruns the rest),
// a third runs to max_tokens. The tokens, texts, finish reasons and the cache's token record
// must be identical (up to the stop token the dropped step fed); then a second generate()
// reuses the cached prefixes.
TEST_F(LlmGpuBackend, PipelinedGreedyEqualsStepByStep) {
  const ModelConfig c = small("llama");
  const MemorySource src = random_weights(c, 31);
  std::unique_ptr<Backend> plain_backend;
  {
    test::ScopedEnv off("TESSEL_DECODE_PIPELINE", "0");
    plain_backend = make_backend("gpu");
  }
  ASSERT_FALSE(plain_backend->can_pipeline_greedy());
  Model plain(std::move(plain_backend), c, src, false);
  Model piped(make_backend("gpu"), c, src, false);
  ASSERT_TRUE(piped.backend().can_pipeline_greedy());
  std::mt19937 rng(7);
  const std::vector<std::vector<int32_t>> prompts = {
      random_tokens(5, 136, rng), random_tokens(11, 136, rng), random_tokens(8, 136, rng)};
  auto detok = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  GenerateOptions o;
  o.max_tokens = 24;
  o.sampling.temperature = 0;
  const auto free_run = generate(plain, prompts, o, detok);
  // Stop at the 4th token of sequence 0 and the 9th of sequence 1 where those ids did not
  // occur earlier in either continuation or in sequence 2's.
  for (int64_t i : {0, 1}) ASSERT_GE(free_run[i].tokens.size(), 10u);
  o.stop_tokens = {free_run[0].tokens[3], free_run[1].tokens[8]};
  const auto want = generate(plain, prompts, o, detok);
  const auto got = generate(piped, prompts, o, detok);
  bool some_stop = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    EXPECT_EQ(got[i].text, want[i].text) << "sequence " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "sequence " << i;
    some_stop = some_stop || want[i].finish_reason == "stop_token";
    // The cache records what it holds: a sequence stopped by a token while the next step was in
    // flight also holds that stop token (fed to the dropped step), one entry past step by step.
    std::vector<int32_t> cached = piped.cached_tokens(static_cast<int64_t>(i));
    const std::vector<int32_t>& cached_plain = plain.cached_tokens(static_cast<int64_t>(i));
    if (want[i].finish_reason == "stop_token" && cached.size() == cached_plain.size() + 1) {
      EXPECT_TRUE(std::find(o.stop_tokens.begin(), o.stop_tokens.end(), cached.back()) !=
                  o.stop_tokens.end())
          << "sequence " << i << ": extra cached token " << cached.back();
      cached.pop_back();
    }
    EXPECT_EQ(cached, cached_plain) << "sequence " << i;
    for (int32_t t : cached) EXPECT_GE(t, 0);
  }
  EXPECT_TRUE(some_stop) << "the stop tokens ended no sequence: the test lost its point";
  EXPECT_EQ(piped.greedy_started(), 0);
  // Again with the cached prefixes reused and a longer budget.
  o.stop_tokens.clear();
  o.max_tokens = 12;
  o.reuse_prefix = true;
  const auto want2 = generate(plain, prompts, o, detok);
  const auto got2 = generate(piped, prompts, o, detok);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got2[i].tokens, want2[i].tokens);
}

// Prompt runs of >= 128 tokens that start their sequence take the tiled attention kernel
// (TMA + WGMMA, read from the step's k/v rows), shorter ones the decode kernel: a 150- and a
// 131-token prompt (tiled; GQA ratio 3 as in SmolLM2) and a 40-token one (decode kernel) in one
// step, against the CPU backend and against a GPU model forced onto the decode kernel.
TEST_F(LlmGpuBackend, TiledPrefillMatchesCpuAndDecodeKernel) {
  ModelConfig c = small("llama");
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.max_positions = 320;
  const MemorySource src = random_weights(c, 23);
  Model cpu(make_cpu_backend(2), c, src, false);
  Model tiled(make_backend("gpu"), c, src, false);
  std::unique_ptr<Model> decode;
  {
    ScopedEnv env("TESSEL_PREFILL_ATTENTION", "decode");
    decode = std::make_unique<Model>(make_backend("gpu"), c, src, false);
  }
  for (Model* m : {&cpu, &tiled, decode.get()}) m->reserve(3, 256);
  std::mt19937 rng(29);
  std::vector<int32_t> toks, slots, pos;
  std::vector<int64_t> rows;
  int32_t slot = 0;
  for (int len : {150, 40, 131}) {
    const std::vector<int32_t> p = random_tokens(len, static_cast<int>(c.vocab_size), rng);
    for (int i = 0; i < len; ++i)
      toks.push_back(p[i]), slots.push_back(slot), pos.push_back(i),
          rows.push_back(static_cast<int64_t>(rows.size()));
    ++slot;
  }
  const auto lc = cpu.forward(toks, slots, pos, rows);
  const auto lt = tiled.forward(toks, slots, pos, rows);
  const auto ld = decode->forward(toks, slots, pos, rows);
  Compare acc;
  compare_step(lc, lt, c.vocab_size, "tiled prefill vs cpu", acc);
  EXPECT_GE(acc.greedy_checked, 20) << "too few clear greedy decisions to check";
  // The two GPU kernels differ only in rounding (P in bf16 for the tensor cores vs f32).
  double worst = 0, ref = 0;
  for (size_t i = 0; i < lt.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(lt[i]) - ld[i]));
    ref = std::max(ref, std::abs(static_cast<double>(ld[i])));
  }
  EXPECT_LE(worst, 0.03 * ref + 0.01) << "max |tiled - decode kernel| over max |logit| " << ref;
  std::printf(
      "[ tiled prefill ] max |tiled - cpu| %.4f, |tiled - decode kernel| %.4f over max "
      "|logit| %.3f; %d greedy rows checked\n",
      acc.max_err, worst, ref, acc.greedy_checked);
}

// The device greedy pick (Backend::argmax_rows) against the host sampler's rule on the same
// bf16 values: many ties (values on a 0.25 grid), NaNs, all-NaN and all -inf rows, +inf, ragged
// widths (1 … 128256 + 3) and a pitched column view (unaligned rows: the scalar loads).
TEST_F(LlmGpuBackend, ArgmaxRowsMatchesHostGreedy) {
  std::unique_ptr<Backend> b = make_backend("gpu");
  std::mt19937 rng(20261122);
  std::uniform_int_distribution<int> grid(-16, 16);
  for (int64_t cols : {1, 7, 4097, 128259}) {
    for (int64_t rows : {1, 5, 17}) {
      HostTensor t;
      t.shape = {rows, cols};
      t.data.resize(static_cast<size_t>(rows * cols));
      for (float& x : t.data) x = 0.25f * static_cast<float>(grid(rng));
      for (int64_t r = 0; r < rows; ++r) {
        float* row = t.data.data() + r * cols;
        if (r % 5 == 1) row[rng() % cols] = NAN;
        if (r % 5 == 2) row[rng() % cols] = INFINITY;
        if (r % 5 == 3)
          for (int64_t c = 0; c < cols; ++c) row[c] = NAN;
        if (r % 5 == 4)
          for (int64_t c = 0; c < cols; ++c) row[c] = -INFINITY;
      }
      Buf dense = b->upload(t);
      for (int64_t col0 : {int64_t{0}, std::min<int64_t>(3, cols - 1)}) {
        const Buf view = col0 == 0 ? dense : b->cols_view(dense, col0, cols - col0);
        std::vector<int32_t> got(static_cast<size_t>(rows), -7);
        ASSERT_TRUE(b->argmax_rows(view, got.data()));
        for (int64_t r = 0; r < rows; ++r) {
          const float* row = t.data.data() + r * cols + col0;
          const int32_t want =
              greedy_argmax(std::span<const float>(row, static_cast<size_t>(cols - col0)));
          EXPECT_EQ(got[r], want) << "cols " << cols << " rows " << rows << " col0 " << col0
                                  << " row " << r;
        }
      }
      b->release(dense);
    }
  }
}

TEST_F(LlmGpuBackend, BadCallsAreErrors) {
  const ModelConfig c = small("llama");
  const MemorySource src = random_weights(c, 3);
  Model gpu(make_backend("gpu"), c, src, false);
  gpu.reserve(1, 16);
  Backend& be = gpu.backend();
  Buf table = be.alloc(10, 8), out = be.alloc(2, 8);
  const int32_t bad_ids[2] = {1, 10};
  test::expect_invalid([&] { be.embedding(bad_ids, table, out); }, "llm_gpu_embedding", "tokens");
  const int64_t bad_rows[1] = {5};
  test::expect_invalid([&] { be.gather_rows(out, bad_rows, 1, table); }, "llm_gpu_gather_rows",
                       "rows");
  Buf k = be.alloc(1, c.n_kv_heads * c.head_dim), v = be.alloc(1, c.n_kv_heads * c.head_dim);
  const int32_t slot[1] = {1}, p[1] = {0};
  test::expect_invalid(
      [&] {
        be.kv_store(0, k, v, RowLayout{slot, p, 1});
      },
      "llm_gpu_kv_cache", "slot/pos");
  for (Buf* x : {&table, &out, &k, &v}) be.release(*x);
}

std::string smollm2_path() {
  if (const char* p = std::getenv("TESSEL_SMOLLM2_GGUF")) return p;
#ifdef TESSEL_MODELS_DIR
  return std::string(TESSEL_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
#else
  return "";
#endif
}

// "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
const std::vector<int32_t> kSmolChatPrompt = {1,    4093, 198, 1780, 314, 260, 3575, 282,
                                              4649, 47,   2,   198,  1,   520, 9531, 198};

TEST_F(LlmGpuBackend, SmolLM2GreedyMatchesCpu) {
  const std::string path = smollm2_path();
  if (path.empty() || !std::filesystem::exists(path))
    GTEST_SKIP() << "SmolLM2 GGUF not found at '" << path << "' (set TESSEL_SMOLLM2_GGUF)";
  LoadedModel cpu = load_model(path, make_cpu_backend(0));
  LoadedModel gpu = load_model(path, make_backend("gpu"));
  const int64_t V = cpu.model->config().vocab_size;
  cpu.model->reserve(1, 64);
  gpu.model->reserve(1, 64);
  std::vector<int32_t> toks = kSmolChatPrompt, slots(toks.size(), 0), pos(toks.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  int64_t last = static_cast<int64_t>(toks.size()) - 1;
  int agree = 0, clear = 0;
  for (int step = 0; step < 32; ++step) {
    const auto lc = cpu.model->forward(toks, slots, pos, {last});
    const auto lg = gpu.model->forward(toks, slots, pos, {last});
    std::vector<int> idx(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(),
                      [&](int a, int b) { return lc[a] > lc[b]; });
    const int g = argmax(lg.data(), V);
    // Logits are O(20); bf16 activations move them by a few tenths at most.
    if (lc[idx[0]] - lc[idx[1]] > 1.0f) {
      ++clear;
      EXPECT_EQ(g, idx[0]) << "step " << step;
    }
    agree += g == idx[0];
    const int32_t next = idx[0];
    const int32_t p = pos.back() + 1;
    toks = {next}, slots = {0}, pos = {p};
    last = 0;
  }
  std::printf("[ SmolLM2 ] GPU greedy agrees with CPU on %d/32 steps (%d with a clear gap)\n",
              agree, clear);
  EXPECT_GE(agree, 28);
}

// Throughput of the engine on the GPU for SmolLM2-135M's shapes (random weights, so it runs
// without the model file): prefill of one 128-token prompt, then 64 greedy decode steps, with
// CUDA graphs off and on (the greedy tokens must agree).
TEST_F(LlmGpuBackend, SmolLM2ShapedThroughput) {
  ModelConfig c = small("llama");
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.n_layers = 30;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.ffn_size = 1536;
  c.max_positions = 2048;
  c.rope_theta = 100000.0;
  c.tie_embeddings = true;
  const MemorySource src = random_weights(c, 31);
  std::vector<int32_t> greedy[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    ScopedEnv env("TESSEL_CUDA_GRAPHS", graphs ? "1" : "0");
    Model gpu(make_backend("gpu"), c, src, false);
    gpu.reserve(1, 256);
    std::mt19937 rng(2);
    std::vector<int32_t> toks = random_tokens(128, 49152, rng), slots(128, 0), pos(128);
    for (int i = 0; i < 128; ++i) pos[i] = i;
    (void)gpu.forward(toks, slots, pos, {127});  // warm-up (allocator pool, kernels)
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = gpu.forward(toks, slots, pos, {127});
    const auto t1 = std::chrono::steady_clock::now();
    int32_t p = 128;
    for (int step = 0; step < 64; ++step) {
      const int32_t next = argmax(logits.data(), c.vocab_size);
      greedy[graphs].push_back(next);
      logits = gpu.forward({next}, {0}, {p++}, {0});
    }
    const auto t2 = std::chrono::steady_clock::now();
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    const double pre = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(t2 - t1).count();
    std::printf(
        "[ SmolLM2-shaped, graphs %s ] prefill 128 tokens: %.2f ms (%.0f tok/s); decode: %.3f "
        "ms/token (%.1f tok/s)\n",
        graphs ? "on" : "off", pre * 1e3, 128 / pre, dec / 64 * 1e3, 64 / dec);
  }
  EXPECT_EQ(greedy[0], greedy[1]);
}

// Without a GPU, asking for the GPU backend is a clear error (runs in the CPU suite).
TEST(LlmBackendSelect, GpuWithoutDeviceIsError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    (void)make_backend("gpu");
    ADD_FAILURE() << "make_backend(\"gpu\") without a GPU did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), TESSEL_ERROR_NO_DEVICE) << e.what();
    EXPECT_NE(std::string(e.what()).find("'backend'"), std::string::npos) << e.what();
  }
}

// "auto" (the CLI's default) takes the CPU backend without a GPU and the GPU backend with a
// Hopper GPU (Backend::name() says which); an unknown name is an error naming the choices.
TEST(LlmBackendSelect, AutoAndUnknownNames) {
  std::unique_ptr<Backend> b = make_backend("auto", 1);
  ASSERT_NE(b, nullptr);
  int major = 0;
  const bool hopper =
      cuda_device_count() > 0 &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
      major == 9;
  EXPECT_EQ(b->name().rfind(hopper ? "gpu" : "cpu", 0), 0u) << b->name();
  try {
    (void)make_backend("tpu");
    ADD_FAILURE() << "make_backend(\"tpu\") did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, cpu or gpu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::llm
