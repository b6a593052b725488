// The engine's model-file readers (src/llm/gguf, safetensors, config) on generated files:
// every metadata type, every supported tensor type against hand-computed values, and malformed
// or truncated images at every offset -> tessel::Error, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "llm/config.hpp"
#include "llm/gguf.hpp"
#include "llm/safetensors.hpp"
#include "llm_test_files.hpp"

namespace tessel::llm {
namespace {

using test::GgufBuilder;
using test::put;

// Parses `image` and reports whether it was accepted; any exception but tessel::Error fails.
bool parses(const std::vector<uint8_t>& image, std::string* message = nullptr) {
  try {
    GgufFile::from_memory(image.data(), image.size(), "mem.gguf");
    return true;
  } catch (const Error& e) {
    if (message) *message = e.what();
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a tessel::Error: " << e.what();
    return false;
  }
}

// Q4_1 block: d, m (half), 16 bytes of nibbles (low: element j, high: element j + 16).
std::vector<uint8_t> q4_1_block(float d, float m, const uint8_t (&q)[32]) {
  std::vector<uint8_t> b;
  put(b, test::to_half(d));
  put(b, test::to_half(m));
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(q[j] | (q[j + 16] << 4)));
  return b;
}

struct Fixture {
  std::vector<float> f32, expect_q8, expect_q4_0, expect_q4_1, f16_vals;
  std::vector<uint8_t> image;
};

Fixture make_fixture() {
  Fixture fx;
  GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.kv_raw("t.u8", 0, {200});
  g.kv_raw("t.i8", 1, {0xFE});  // -2
  {
    std::vector<uint8_t> p;
    put<uint16_t>(p, 60000);
    g.kv_raw("t.u16", 2, p);
    p.clear();
    put<int16_t>(p, -300);
    g.kv_raw("t.i16", 3, p);
    p.clear();
    put<uint64_t>(p, uint64_t{1} << 40);
    g.kv_raw("t.u64", 10, p);
    p.clear();
    put<int64_t>(p, -(int64_t{1} << 40));
    g.kv_raw("t.i64", 11, p);
    p.clear();
    put<double>(p, 2.5e-7);
    g.kv_raw("t.f64", 12, p);
    p.clear();  // array of arrays of u16
    put<uint32_t>(p, 9);
    put<uint64_t>(p, 2);
    for (int a = 0; a < 2; ++a) {
      put<uint32_t>(p, 2);
      put<uint64_t>(p, 3);
      for (int k = 0; k < 3; ++k) put<uint16_t>(p, static_cast<uint16_t>(10 * a + k));
    }
    g.kv_raw("t.nested", 9, p);
  }
  g.kv_u32("llama.block_count", 1);
  g.kv_i32("t.i32", -7);
  g.kv_f32("t.f32", 0.125f);
  g.kv_bool("t.bool", true);
  g.kv_str("tokenizer.ggml.model", "gpt2");
  g.kv_str("tokenizer.ggml.pre", "smollm");
  g.kv_strs("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "ab"});
  g.kv_i32s("tokenizer.ggml.token_type", {3, 3, 1, 1, 1});
  g.kv_strs("tokenizer.ggml.merges", {"a b"});
  g.kv_u32("tokenizer.ggml.bos_token_id", 0);
  g.kv_u32("tokenizer.ggml.eos_token_id", 1);
  g.kv_bool("tokenizer.ggml.add_bos_token", true);
  g.kv_str("tokenizer.chat_template", "{{ messages }}");

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int i = 0; i < 2 * 8; ++i) fx.f32.push_back(u(rng));
  g.tensor("w.f32", {8, 2}, 0, test::f32_bytes(fx.f32));
  {  // F16 and BF16 of exactly representable values
    std::vector<uint8_t> h, bf;
    for (int i = 0; i < 6; ++i) {
      const float v = (i - 3) * 0.375f;
      fx.f16_vals.push_back(v);
      put(h, test::to_half(v));
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      put(bf, static_cast<uint16_t>(bits >> 16));
    }
    g.tensor("w.f16", {6}, 1, h);
    g.tensor("w.bf16", {3, 2}, 30, bf);
  }
  {  // Q8_0: 2 blocks
    std::vector<uint8_t> b;
    for (int blk = 0; blk < 2; ++blk) {
      const float d = blk ? 0.25f : 0.0625f;
      put(b, test::to_half(d));
      for (int j = 0; j < 32; ++j) {
        const int8_t q = static_cast<int8_t>(j * 7 - 100 + blk);
        put(b, q);
        fx.expect_q8.push_back(d * q);
      }
    }
    g.tensor("w.q8_0", {64}, 8, b);
  }
  {  // Q4_0: 1 block
    std::vector<uint8_t> b;
    const float d = 0.5f;
    put(b, test::to_half(d));
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>((j * 5) % 16);
    for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(q[j] | (q[j + 16] << 4)));
    for (int j = 0; j < 32; ++j) fx.expect_q4_0.push_back(d * (q[j] - 8));
    g.tensor("w.q4_0", {32}, 2, b);
  }
  {  // Q4_1: 2 rows of 1 block; last tensor, ends the file
    std::vector<uint8_t> b;
    for (int row = 0; row < 2; ++row) {
      const float d = row ? 0.125f : 0.75f, m = row ? -1.5f : 0.25f;
      uint8_t q[32];
      for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>((j * 3 + row) % 16);
      const auto blk = q4_1_block(d, m, q);
      b.insert(b.end(), blk.begin(), blk.end());
      for (int j = 0; j < 32; ++j) fx.expect_q4_1.push_back(d * q[j] + m);
    }
    g.tensor("w.q4_1", {32, 2}, 3, b);
  }
  fx.image = g.build();
  return fx;
}

TEST(LlmGguf, MetadataOfEveryType) {
  const Fixture fx = make_fixture();
  const GgufFile g = GgufFile::from_memory(fx.image.data(), fx.image.size(), "mem.gguf");
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.architecture(), "llama");
  EXPECT_EQ(g.get_int("t.u8", 0), 200);
  EXPECT_EQ(g.get_int("t.i8", 0), -2);
  EXPECT_EQ(g.get_int("t.u16", 0), 60000);
  EXPECT_EQ(g.get_int("t.i16", 0), -300);
  EXPECT_EQ(g.get_int("t.u64", 0), int64_t{1} << 40);
  EXPECT_EQ(g.get_int("t.i64", 0), -(int64_t{1} << 40));
  EXPECT_EQ(g.get_int("t.i32", 0), -7);
  EXPECT_DOUBLE_EQ(g.get_double("t.f32", 0), 0.125);
  EXPECT_DOUBLE_EQ(g.get_double("t.f64", 0), 2.5e-7);
  EXPECT_TRUE(g.get_bool("t.bool", false));
  EXPECT_EQ(g.get_int("missing", 42), 42);
  const GgufValue* nested = g.find("t.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->items.size(), 2u);
  ASSERT_EQ(nested->items[1].items.size(), 3u);
  EXPECT_EQ(nested->items[1].items[2].as_int(), 12);
  // Asking for the wrong type names the key.
  try {
    (void)g.get_string("t.u8");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.u8"), std::string::npos) << e.what();
  }
}

TEST(LlmGguf, TokenizerData) {
  const Fixture fx = make_fixture();
  const GgufFile g = GgufFile::from_memory(fx.image.data(), fx.image.size(), "mem.gguf");
  const TokenizerData td = g.tokenizer_data();
  EXPECT_EQ(td.model, "gpt2");
  EXPECT_EQ(td.pre, "smollm");
  EXPECT_EQ(td.tokens, (std::vector<std::string>{"<s>", "</s>", "a", "b", "ab"}));
  EXPECT_EQ(td.token_types, (std::vector<int32_t>{3, 3, 1, 1, 1}));
  EXPECT_EQ(td.merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(td.bos_id, 0);
  EXPECT_EQ(td.eos_id, 1);
  EXPECT_EQ(td.eos_ids, (std::vector<int32_t>{1}));
  EXPECT_TRUE(td.add_bos);
  EXPECT_EQ(td.chat_template, "{{ messages }}");
}

TEST(LlmGguf, DequantizesEverySupportedType) {
  const Fixture fx = make_fixture();
  const GgufFile g = GgufFile::from_memory(fx.image.data(), fx.image.size(), "mem.gguf");
  HostTensor t = g.load("w.f32");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 8}));  // row-major: ggml ne reversed
  EXPECT_EQ(t.data, fx.f32);
  EXPECT_EQ(g.load("w.f16").data, fx.f16_vals);
  EXPECT_EQ(g.load("w.bf16").data, fx.f16_vals);
  EXPECT_EQ(g.load("w.bf16").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g.load("w.q8_0").data, fx.expect_q8);
  EXPECT_EQ(g.load("w.q4_0").data, fx.expect_q4_0);
  t = g.load("w.q4_1");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(t.data, fx.expect_q4_1);
  EXPECT_EQ(g.tensor("w.q4_1")->nbytes, 40u);
  EXPECT_THROW(g.load("nope"), Error);
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    b.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return b;
}

// One random block each of Q4_K and Q6_K; the expected values come from gguf-py 0.19.0's numpy
// dequantizers (an implementation independent of ours).
TEST(LlmGguf, KQuantsMatchGgufPy) {
  struct Case {
    uint32_t type;
    const char* hex;
    std::vector<std::pair<int, double>> samples;
    double sum, sumsq;
  };
  const Case cases[] = {
      {12,
       "4c22d629a8e5b8abeeab14cef599cc052535d5cec0ad06783f60ec83760457a17c472a49ed10c2fa0a67ce0d8f"
       "02264785762462c423399232b39168ce358d21b527970bb48a4200a5627b0c90b818268101caff5536e4307fa9"
       "01a76df710c04edc083cbdb5404808b9586fbf8a6343304464f943287f2d2133cee5d95535cc78861fd80e7fa0"
       "1dd0a174645397c6a0",
       {{0, 0.362426758},
        {1, 0.362426758},
        {17, 1.34631348},
        {31, 1.34631348},
        {32, -1.05041504},
        {63, -0.140319824},
        {64, 2.53173828},
        {100, 5.70776367},
        {127, 0.419372559},
        {128, -2.41732788},
        {150, -2.87237549},
        {191, 0.934753418},
        {192, -0.547119141},
        {200, -0.00598144531},
        {254, 3.27209473},
        {255, 2.36199951}},
       500.885803,
       2749.50947},
      {14,
       "adc1367e7e3976aa6b833bad348bb5a93fc4900f8a8987f50f8c3b8efc8c4ce733da7d4597758c5cbdd130e147"
       "d9d82f7c5b70102d58b85f48d7dead24924b1fbe1ebedebe4b4f57ff8b313a8509618b87183ce5346b49e2c233"
       "48df4abd744e5c8bbd04b85d34c7f36d1eb5cdc25ec5599f4e006d2fb109fa75dc800fadcc557469c96f94eb69"
       "eebb60083412b52987ef702f53e2eb824bc02064cee95b3927060103514ace681e82642726b083f0478aaed1b2"
       "bc0e5d9443c9d372a980672b4c4cbc8fd1a54c0501ca0177bc4483d0451f",
       {{0, -10.2511749},
        {1, -8.09303284},
        {17, -15.1069946},
        {31, 12.409317},
        {32, 6.27565002},
        {63, 0.802204132},
        {64, -8.67516327},
        {100, 4.8558197},
        {127, -1.1003685},
        {128, 0.0993881226},
        {150, 2.68347931},
        {191, 4.22399521},
        {192, 10.1375885},
        {200, 8.20661926},
        {254, 1.36303711},
        {255, 9.20050049}},
       138.227581,
       25667.3724},
  };
  for (const Case& c : cases) {
    const std::vector<uint8_t> block = from_hex(c.hex);
    ASSERT_EQ(static_cast<int64_t>(block.size()), ggml_block(c.type).bytes);
    GgufBuilder g;
    g.tensor("w", {256}, c.type, block);
    const auto img = g.build();
    const GgufFile f = GgufFile::from_memory(img.data(), img.size(), "mem.gguf");
    const HostTensor t = f.load("w");
    for (const auto& [i, want] : c.samples)
      EXPECT_NEAR(t.data[i], want, 1e-6 * std::max(1.0, std::abs(want)))
          << ggml_type_name(c.type) << " element " << i;
    double sum = 0, sumsq = 0;
    for (float v : t.data) sum += v, sumsq += static_cast<double>(v) * v;
    EXPECT_NEAR(sum, c.sum, 1e-4) << ggml_type_name(c.type);
    EXPECT_NEAR(sumsq, c.sumsq, 1e-2) << ggml_type_name(c.type);
  }
}

TEST(LlmGguf, EveryTruncationIsAnError) {
  const Fixture fx = make_fixture();
  ASSERT_TRUE(parses(fx.image));
  for (size_t len = 0; len < fx.image.size(); ++len) {
    // An exact-size copy, so an over-read would leave the allocation.
    std::vector<uint8_t> prefix(fx.image.begin(), fx.image.begin() + len);
    std::string msg;
    EXPECT_FALSE(parses(prefix, &msg)) << "prefix of " << len << " bytes was accepted";
    EXPECT_NE(msg.find("tessel::gguf:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got"), std::string::npos) << msg;
  }
}

TEST(LlmGguf, CorruptBytesNeverCrash) {
  const Fixture fx = make_fixture();
  const GgufFile ok = GgufFile::from_memory(fx.image.data(), fx.image.size(), "mem.gguf");
  const size_t data_start = static_cast<size_t>(ok.tensors()[0].data - fx.image.data());
  int rejected = 0;
  for (size_t at = 0; at < data_start; ++at)
    for (uint8_t v : {uint8_t{0xFF}, uint8_t{0x7F}, uint8_t{0x00}}) {
      std::vector<uint8_t> bad = fx.image;
      if (bad[at] == v) continue;
      bad[at] = v;
      if (!parses(bad)) ++rejected;
    }
  EXPECT_GT(rejected, 100);  // most header bytes matter
}

TEST(LlmGguf, NamedErrors) {
  Fixture fx = make_fixture();
  std::string msg;
  auto bad = fx.image;
  bad[0] = 'X';
  EXPECT_FALSE(parses(bad, &msg));
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  bad = fx.image;
  bad[4] = 2;  // v2 has v3's layout
  EXPECT_TRUE(parses(bad));
  bad[4] = 1;  // version 1
  EXPECT_FALSE(parses(bad, &msg));
  EXPECT_NE(msg.find("version"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 or 3"), std::string::npos) << msg;
  bad = fx.image;
  bad[8] = 0xFF;  // tensor count far beyond the file
  bad[12] = 0xFF;
  EXPECT_FALSE(parses(bad, &msg));
  EXPECT_NE(msg.find("tensor count"), std::string::npos) << msg;

  // A type without a dequantizer loads as UNSUPPORTED, naming the type.
  GgufBuilder g;
  g.tensor("w.q5_0", {32}, 6, std::vector<uint8_t>(22, 0));
  const auto img = g.build();
  const GgufFile f = GgufFile::from_memory(img.data(), img.size(), "mem.gguf");
  try {
    f.load("w.q5_0");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), TESSEL_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("Q5_0"), std::string::npos) << e.what();
  }
  // Row length not a multiple of the block.
  GgufBuilder g2;
  g2.tensor("w", {16}, 8, std::vector<uint8_t>(34, 0));
  EXPECT_FALSE(parses(g2.build(), &msg));
  EXPECT_NE(msg.find("multiple of 32"), std::string::npos) << msg;
}

// ---- safetensors ------------------------------------------------------------------------

std::vector<uint8_t> st_image() {
  std::vector<test::StTensor> ts;
  ts.push_back({"a", "F32", {2, 3}, test::f32_bytes({1, 2, 3, 4, 5, 6})});
  std::vector<uint8_t> h, bf;
  for (float v : {0.5f, -1.25f, 3.0f}) {
    put(h, test::to_half(v));
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    put(bf, static_cast<uint16_t>(bits >> 16));
  }
  ts.push_back({"b", "F16", {3}, h});
  ts.push_back({"c", "BF16", {1, 3}, bf});
  return test::build_safetensors(ts);
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("tessel_llm_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream(path / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
};

TEST(LlmSafetensors, ReadsF32F16Bf16) {
  TempDir d;
  d.write("model.safetensors", st_image());
  const SafetensorsModel m(d.path.string());
  EXPECT_EQ(m.names().size(), 3u);
  EXPECT_EQ(m.shape("a"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(m.load("a").data, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(m.load("b").data, (std::vector<float>{0.5f, -1.25f, 3.0f}));
  EXPECT_EQ(m.load("c").data, (std::vector<float>{0.5f, -1.25f, 3.0f}));
}

TEST(LlmSafetensors, ShardedFolder) {
  TempDir d;
  d.write("s1.safetensors", test::build_safetensors({{"x", "F32", {2}, test::f32_bytes({1, 2})}}));
  d.write("s2.safetensors", test::build_safetensors({{"y", "F32", {1}, test::f32_bytes({3})}}));
  d.write(
      "model.safetensors.index.json",
      std::string(R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})"));
  const SafetensorsModel m(d.path.string());
  EXPECT_EQ(m.load("x").data, (std::vector<float>{1, 2}));
  EXPECT_EQ(m.load("y").data, (std::vector<float>{3}));
  TempDir empty;
  EXPECT_THROW(SafetensorsModel(empty.path.string()), Error);
}

TEST(LlmSafetensors, EveryTruncationIsAnError) {
  const auto img = st_image();
  ASSERT_NO_THROW(SafetensorsFile::from_memory(img.data(), img.size(), "mem"));
  for (size_t len = 0; len < img.size(); ++len) {
    std::vector<uint8_t> prefix(img.begin(), img.begin() + len);
    try {
      SafetensorsFile::from_memory(prefix.data(), prefix.size(), "mem");
      ADD_FAILURE() << "prefix of " << len << " bytes accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("tessel::safetensors:"), std::string::npos) << msg;
      EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a tessel::Error: " << e.what();
    }
  }
}

TEST(LlmSafetensors, CorruptHeaderBytesNeverCrash) {
  const auto img = st_image();
  uint64_t header_len;
  std::memcpy(&header_len, img.data(), 8);
  for (size_t at = 0; at < 8 + header_len; ++at) {
    std::vector<uint8_t> bad = img;
    bad[at] ^= 0x5A;
    try {
      SafetensorsFile::from_memory(bad.data(), bad.size(), "mem");
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "byte " << at << ": not a tessel::Error: " << e.what();
    }
  }
  // Offsets that disagree with shape × dtype.
  auto wrong = test::build_safetensors({{"x", "F32", {3}, test::f32_bytes({1, 2})}});
  EXPECT_THROW(SafetensorsFile::from_memory(wrong.data(), wrong.size(), "mem"), Error);
}

// ---- config ------------------------------------------------------------------------------

TEST(LlmConfig, Llama3FromHfJson) {
  const auto j = nlohmann::json::parse(R"({
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": true})");
  const ModelConfig c = config_from_hf(j);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.rope_style, RopeStyle::neox);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(LlmConfig, Qwen2MistralGpt2) {
  const ModelConfig q = config_from_hf(nlohmann::json::parse(R"({
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": true})"));
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_EQ(q.head_dim, 64);
  const ModelConfig m = config_from_hf(nlohmann::json::parse(R"({
    "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "head_dim": 128})"));
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_FALSE(m.tie_embeddings);
  const ModelConfig g = config_from_hf(nlohmann::json::parse(R"({
    "model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_positions": 1024, "n_inner": null, "layer_norm_epsilon": 1e-5})"));
  EXPECT_EQ(g.ffn_size, 3072);
  EXPECT_EQ(g.norm, NormKind::layer);
  EXPECT_EQ(g.ffn, FfnKind::gelu);
  EXPECT_TRUE(g.learned_positions && g.tie_embeddings && g.all_biases);
  EXPECT_EQ(g.rope_style, RopeStyle::none);
}

TEST(LlmConfig, ErrorsNameTheField) {
  auto expect = [](const char* json, const std::string& field) {
    try {
      config_from_hf(nlohmann::json::parse(json));
      ADD_FAILURE() << "accepted: " << json;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("tessel::config:"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'" + field + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
      EXPECT_NE(msg.find("got"), std::string::npos) << msg;
    }
  };
  expect(R"({"model_type": "bert"})", "model_type");
  expect(R"({"model_type": "llama", "vocab_size": 10})", "hidden_size");
  expect(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 12, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 3, "intermediate_size": 8})",
         "num_key_value_heads");
  expect(R"({"model_type": "llama", "vocab_size": "many"})", "vocab_size");
}

TEST(LlmConfig, FromGgufMetadata) {
  GgufBuilder g;
  g.kv_str("general.architecture", "qwen2");
  g.kv_u32("qwen2.block_count", 2);
  g.kv_u32("qwen2.context_length", 4096);
  g.kv_u32("qwen2.embedding_length", 64);
  g.kv_u32("qwen2.feed_forward_length", 128);
  g.kv_u32("qwen2.attention.head_count", 4);
  g.kv_u32("qwen2.attention.head_count_kv", 2);
  g.kv_f32("qwen2.rope.freq_base", 1e6f);
  g.kv_f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  g.kv_strs("tokenizer.ggml.tokens", {"a", "b", "c"});
  g.tensor("blk.0.attn_q.bias", {64}, 0, test::f32_bytes(std::vector<float>(64, 0.f)));
  const auto img = g.build();
  const GgufFile f = GgufFile::from_memory(img.data(), img.size(), "mem.gguf");
  const ModelConfig c = config_from_gguf(f);
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.vocab_size, 3);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_style, RopeStyle::neox);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_NEAR(c.rope_theta, 1e6, 1);
}

}  // namespace
}  // namespace tessel::llm
