// The C++ tokenizer against Hugging Face `tokenizers`: ids and decodes of a varied corpus
// (tests/data/tokenizer_fixtures.json, made by tools/gen_tokenizer_fixtures.py) for Llama-3, Qwen3,
// GPT-2 and the SmolLM2 pre-tokenizer; chat templates rendered by jinja2; load/encode speed;
// malformed input. The tokenizer files live in ../shared/data/tokenizers (not in the repository):
// without them the tests skip with a message.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "llm/gguf.hpp"
#include "llm/tokenizer.hpp"
#include "llm/unicode.hpp"

namespace tessel::llm {
namespace {

using json = nlohmann::json;

std::string data_dir() {
  if (const char* env = std::getenv("TESSEL_TOKENIZER_DATA"); env != nullptr && *env != '\0')
    return env;
  return std::string(TESSEL_SOURCE_DIR) + "/../shared/data/tokenizers";
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json& fixtures() {
  static const json j = [] {
    // TESSEL_TOKENIZER_FIXTURES: a larger fixture file made with gen_tokenizer_fixtures.py --random
    // N.
    const char* env = std::getenv("TESSEL_TOKENIZER_FIXTURES");
    const std::string path =
        env != nullptr && *env != '\0'
            ? std::string(env)
            : std::string(TESSEL_SOURCE_DIR) + "/tests/data/tokenizer_fixtures.json";
    json parsed = json::parse(slurp(path), nullptr, false);
    return parsed;
  }();
  return j;
}

// SmolLM2's tokenizer: the model file scripts/setup.sh fetches (tokenizer.ggml.* metadata read
// by the engine's GGUF reader), or that metadata as JSON (gen_tokenizer_fixtures.py
// --smollm2-dump) named by TESSEL_SMOLLM2_TOKENIZER.
std::string smollm2_path() {
  if (const char* env = std::getenv("TESSEL_SMOLLM2_TOKENIZER"); env != nullptr && *env != '\0')
    return env;
  return std::string(TESSEL_SOURCE_DIR) + "/.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string tokenizer_path(const std::string& name) {
  if (name == "tiny") return std::string(TESSEL_SOURCE_DIR) + "/tests/data/tokenizer_tiny.json";
  if (name == "llama3" || name == "qwen3") return data_dir() + "/" + name + "/tokenizer.json";
  if (name == "smollm2") return smollm2_path();
  return data_dir() + "/gpt2/encoder.json";
}

// Tokenizers are loaded once per process (the Llama-3 and Qwen files are ~10 MB).
const Tokenizer* load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  if (!exists(tokenizer_path(name))) return nullptr;
  std::unique_ptr<Tokenizer> tok;
  if (name == "gpt2") {
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gpt2_files(data_dir() + "/gpt2/encoder.json",
                                                                 data_dir() + "/gpt2/vocab.bpe"));
  } else if (name == "gpt2_smollm") {
    // The GPT-2 vocabulary through the GGUF path with SmolLM2's pre-tokenizer.
    const json enc = json::parse(slurp(data_dir() + "/gpt2/encoder.json"));
    TokenizerData d;
    d.model = "gpt2";
    d.pre = "smollm";
    d.tokens.resize(enc.size());
    d.token_types.assign(enc.size(), 1);
    for (const auto& [token, id] : enc.items()) d.tokens[id.get<int>()] = token;
    d.token_types[50256] = 3;
    std::istringstream lines(slurp(data_dir() + "/gpt2/vocab.bpe"));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.rfind("#version", 0) != 0) d.merges.push_back(line);
    }
    d.bos_id = d.eos_id = 50256;
    d.chat_template = fixtures()["templates"]["smollm2"].get<std::string>();
    tok = std::make_unique<Tokenizer>(Tokenizer::from_data(d));
  } else if (name == "smollm2" && smollm2_path().size() > 5 &&
             smollm2_path().compare(smollm2_path().size() - 5, 5, ".gguf") == 0) {
    tok = std::make_unique<Tokenizer>(
        Tokenizer::from_data(GgufFile(smollm2_path()).tokenizer_data()));
  } else if (name == "smollm2") {
    // The GGUF path exactly as the engine takes it: tokenizer.ggml.* keys into TokenizerData.
    const json meta = json::parse(slurp(smollm2_path()));
    TokenizerData d;
    d.model = meta.at("tokenizer.ggml.model").get<std::string>();
    d.pre = meta.at("tokenizer.ggml.pre").get<std::string>();
    d.tokens = meta.at("tokenizer.ggml.tokens").get<std::vector<std::string>>();
    d.token_types = meta.at("tokenizer.ggml.token_type").get<std::vector<int32_t>>();
    d.merges = meta.at("tokenizer.ggml.merges").get<std::vector<std::string>>();
    d.bos_id = meta.value("tokenizer.ggml.bos_token_id", -1);
    d.eos_id = meta.value("tokenizer.ggml.eos_token_id", -1);
    d.add_bos = meta.value("tokenizer.ggml.add_bos_token", false);
    d.chat_template = meta.value("tokenizer.chat_template", "");
    tok = std::make_unique<Tokenizer>(Tokenizer::from_data(d));
  } else {  // llama3, qwen3, tiny
    tok = std::make_unique<Tokenizer>(Tokenizer::from_hf_json(tokenizer_path(name)));
  }
  return cache.emplace(name, std::move(tok)).first->second.get();
}

#define REQUIRE_TOKENIZER(var, name)                                                           \
  if (fixtures().is_discarded()) GTEST_FAIL() << "tests/data/tokenizer_fixtures.json missing"; \
  const Tokenizer* var = load(name);                                                           \
  if (var == nullptr) GTEST_SKIP() << "tokenizer data absent: " << tokenizer_path(name)

// GGUF-style metadata built from a tokenizer.json, as llama.cpp's converter writes it.
TokenizerData data_from_hf_json(const std::string& path, const std::string& pre) {
  const json j = json::parse(slurp(path));
  TokenizerData d;
  d.model = "gpt2";
  d.pre = pre;
  size_t n = 0;
  for (const auto& [token, id] : j["model"]["vocab"].items())
    n = std::max<size_t>(n, id.get<size_t>() + 1);
  for (const auto& t : j["added_tokens"]) n = std::max<size_t>(n, t["id"].get<size_t>() + 1);
  d.tokens.assign(n, "");
  d.token_types.assign(n, 1);
  for (const auto& [token, id] : j["model"]["vocab"].items()) d.tokens[id.get<size_t>()] = token;
  for (const auto& t : j["added_tokens"]) {
    d.tokens[t["id"].get<size_t>()] = t["content"].get<std::string>();
    d.token_types[t["id"].get<size_t>()] = t["special"].get<bool>() ? 3 : 4;
  }
  for (const auto& m : j["model"]["merges"]) {
    d.merges.push_back(m.is_string() ? m.get<std::string>()
                                     : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  return d;
}

std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out.size() > 200 ? out.substr(0, 200) + "..." : out;
}

// Encodes every fixture text and counts exact matches with Hugging Face's ids.
void expect_fixture_encodes(const Tokenizer& tok, const std::string& name) {
  const json& texts = fixtures()["texts"];
  const json& expected = fixtures()["encodings"][name];
  ASSERT_EQ(texts.size(), expected.size());
  size_t passed = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto want = expected[i].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    if (got == want) {
      ++passed;
    } else {
      ADD_FAILURE() << name << " text #" << i << " '" << show(text) << "': " << got.size()
                    << " ids, Hugging Face " << want.size();
    }
  }
  std::printf("[tokenizer] %s: %zu/%zu fixture encodes identical to Hugging Face\n", name.c_str(),
              passed, texts.size());
}

class TokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerFixture, EncodeMatchesHuggingFace) {
  REQUIRE_TOKENIZER(tok, GetParam());
  expect_fixture_encodes(*tok, GetParam());
}

TEST_P(TokenizerFixture, DecodeMatchesHuggingFace) {
  REQUIRE_TOKENIZER(tok, GetParam());
  size_t passed = 0, total = 0;
  for (const auto& c : fixtures()["decodes"][GetParam()]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const std::string want = c["text"].get<std::string>();
    const std::string got = tok->decode(ids, c["skip_special"].get<bool>());
    ++total;
    if (got == want) {
      ++passed;
    } else {
      ADD_FAILURE() << "decode of " << c["ids"].dump() << ": '" << show(got)
                    << "' vs Hugging Face '" << show(want) << "'";
    }
  }
  std::printf("[tokenizer] %s: %zu/%zu fixture decodes identical to Hugging Face\n",
              GetParam().c_str(), passed, total);
}

TEST_P(TokenizerFixture, RoundTripAndStreamingDecode) {
  REQUIRE_TOKENIZER(tok, GetParam());
  const json& texts = fixtures()["texts"];
  const json& roundtrips = fixtures()["roundtrips"][GetParam()];
  ASSERT_EQ(texts.size(), roundtrips.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    // Hugging Face's decode of its encoding: the text itself unless normalized (NFC), stripped
    // around lstrip/rstrip tokens or missing bytes without a token.
    const std::string want = roundtrips[i].is_null() ? text : roundtrips[i].get<std::string>();
    const auto ids = tok->encode(text);
    EXPECT_EQ(tok->decode(ids), want) << show(text);
    std::string streamed;  // decode_token's raw bytes concatenate to the same text
    for (int32_t id : ids) streamed += tok->decode_token(id);
    EXPECT_EQ(unicode::utf8_lossy(streamed), want) << show(text);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerFixture,
                         ::testing::Values("llama3", "qwen3", "gpt2", "gpt2_smollm", "smollm2",
                                           "tiny"),
                         [](const auto& info) { return info.param; });

// The GGUF path (tokenizer.ggml.* metadata) must encode exactly as the tokenizer.json path.
TEST(Tokenizer, FromDataMatchesHfJson) {
  for (const auto& [name, pre] : std::vector<std::pair<std::string, std::string>>{
           {"llama3", "llama-bpe"}, {"qwen3", "qwen2"}}) {
    SCOPED_TRACE(name);
    if (!exists(tokenizer_path(name)))
      GTEST_SKIP() << "tokenizer data absent: " << tokenizer_path(name);
    const Tokenizer tok = Tokenizer::from_data(data_from_hf_json(tokenizer_path(name), pre));
    const Tokenizer* ref = load(name);
    EXPECT_EQ(tok.vocab_size(), ref->vocab_size());
    EXPECT_EQ(tok.pre_tokenizer(), ref->pre_tokenizer());
    expect_fixture_encodes(tok, name);
  }
}

TEST(Tokenizer, SpecialIdsAndFamilies) {
  REQUIRE_TOKENIZER(llama, "llama3");
  EXPECT_EQ(llama->vocab_size(), 128256u);
  EXPECT_EQ(llama->pre_tokenizer(), PreTokenizer::kLlama3);
  EXPECT_EQ(llama->chat_format(), ChatFormat::kLlama3);
  EXPECT_EQ(llama->bos_id(), 128000);
  EXPECT_EQ(llama->eos_id(), 128001);  // tokenizer_config.json's eos_token
  const auto& ends = llama->eos_ids();
  EXPECT_NE(std::find(ends.begin(), ends.end(), 128009), ends.end()) << "<|eot_id|> ends a turn";
  EXPECT_TRUE(llama->is_special(128009));
  EXPECT_EQ(llama->token_id("<|eot_id|>"), 128009);
  // Hugging Face's Llama-3 post-processor adds no BOS (this tokenizer.json): neither do we.
  EXPECT_EQ(llama->encode("hi", true), llama->encode("hi", false));

  REQUIRE_TOKENIZER(qwen, "qwen3");
  EXPECT_EQ(qwen->pre_tokenizer(), PreTokenizer::kQwen2);
  EXPECT_EQ(qwen->chat_format(), ChatFormat::kChatML);
  EXPECT_EQ(qwen->bos_id(), -1);
  EXPECT_EQ(qwen->eos_id(), qwen->token_id("<|im_end|>"));
  EXPECT_FALSE(qwen->is_special(qwen->token_id("<think>")))
      << "<think> is a non-special added token";
  EXPECT_EQ(qwen->decode(qwen->encode("<think>a</think><|im_end|>"), true), "<think>a</think>");

  REQUIRE_TOKENIZER(gpt2, "gpt2");
  EXPECT_EQ(gpt2->vocab_size(), 50257u);
  EXPECT_EQ(gpt2->eos_id(), 50256);
  EXPECT_EQ(gpt2->chat_format(), ChatFormat::kPlain);
  EXPECT_EQ(gpt2->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST(Tokenizer, TemplateProcessingAddsBos) {
  REQUIRE_TOKENIZER(tiny, "tiny");
  EXPECT_EQ(tiny->bos_id(), 0);
  EXPECT_EQ(tiny->encode("ab", true).front(), 0);
  EXPECT_EQ(tiny->encode("ab", false).size() + 1, tiny->encode("ab", true).size());
  EXPECT_EQ(tiny->decode(tiny->encode("ab <mask>"), true), "ab");
  EXPECT_EQ(tiny->decode(tiny->encode("hi <tool>"), true), "hi <tool>")
      << "non-special tokens stay";
}

TEST(Tokenizer, AddBosFromGgufMetadata) {
  if (!exists(tokenizer_path("llama3"))) GTEST_SKIP() << "tokenizer data absent";
  TokenizerData d = data_from_hf_json(tokenizer_path("llama3"), "llama-bpe");
  d.bos_id = 128000;
  d.eos_id = 128009;
  d.add_bos = true;
  const Tokenizer tok = Tokenizer::from_data(d);
  const auto with = tok.encode("Hello", true);
  const auto without = tok.encode("Hello", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], 128000);
  EXPECT_EQ(tok.eos_ids().front(), 128009);
}

TEST(Tokenizer, StreamingDecodeOfSplitCharacter) {
  REQUIRE_TOKENIZER(gpt2, "gpt2");
  // An emoji that GPT-2 splits into byte tokens: each piece alone is a partial UTF-8 sequence.
  const auto ids = gpt2->encode("🙂");
  ASSERT_GT(ids.size(), 1u);
  std::string bytes;
  for (int32_t id : ids) bytes += gpt2->decode_token(id);
  EXPECT_EQ(bytes, "🙂");
  EXPECT_EQ(gpt2->decode({ids[0]}), "\xEF\xBF\xBD") << "a partial sequence decodes to U+FFFD";
}

// ---- chat templates ----------------------------------------------------------------------

void expect_chat_fixtures(const Tokenizer& tok, const std::string& name) {
  size_t passed = 0, total = 0;
  for (const auto& c : fixtures()["chat"][name]) {
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"])
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    const std::string want = c["text"].get<std::string>();
    const std::string got = tok.apply_chat_template(msgs, c["add_generation_prompt"].get<bool>());
    ++total;
    if (got == want) {
      ++passed;
    } else {
      ADD_FAILURE() << name << " conversation " << c["messages"].dump()
                    << " gen=" << c["add_generation_prompt"] << "\n got: '" << show(got)
                    << "'\nwant: '" << show(want) << "'";
    }
  }
  EXPECT_GT(total, 0u);
  std::printf("[tokenizer] %s: %zu/%zu chat renders identical to jinja2\n", name.c_str(), passed,
              total);
}

TEST(TokenizerChat, Llama3MatchesJinja) {
  REQUIRE_TOKENIZER(tok, "llama3");
  expect_chat_fixtures(*tok, "llama3");
}

TEST(TokenizerChat, Qwen3ChatMLMatchesJinja) {
  REQUIRE_TOKENIZER(tok, "qwen3");
  expect_chat_fixtures(*tok, "qwen3");
}

TEST(TokenizerChat, SmolLM2ChatMLMatchesJinja) {
  REQUIRE_TOKENIZER(tok, "gpt2_smollm");
  EXPECT_EQ(tok->chat_format(), ChatFormat::kChatML);
  expect_chat_fixtures(*tok, "smollm2");
}

TEST(TokenizerChat, SmolLM2FromGgufTemplate) {
  REQUIRE_TOKENIZER(tok, "smollm2");
  EXPECT_EQ(tok->eos_id(), 2);
  expect_chat_fixtures(*tok, "smollm2");
}

TEST(TokenizerChat, PlainFallback) {
  REQUIRE_TOKENIZER(tok, "gpt2");
  EXPECT_EQ(tok->apply_chat_template({{"user", "hi"}, {"assistant", "yo"}}, true),
            "user: hi\nassistant: yo\nassistant: ");
}

// ---- pre-tokenizer and Unicode details -----------------------------------------------------

TEST(Tokenizer, PreTokenizerSplits) {
  REQUIRE_TOKENIZER(llama, "llama3");
  using V = std::vector<std::string>;
  EXPECT_EQ(llama->pre_tokenize("Hello  world12345 it's\n\n  x"),
            (V{"Hello", " ", " world", "123", "45", " it", "'s", "\n\n", " ", " x"}));
  REQUIRE_TOKENIZER(gpt2, "gpt2");
  EXPECT_EQ(gpt2->pre_tokenize("Hello  world12345 it's\n\n  x"),
            (V{"Hello", " ", " world", "12345", " it", "'s", "\n\n ", " x"}));
  REQUIRE_TOKENIZER(smol, "gpt2_smollm");
  EXPECT_EQ(smol->pre_tokenize("a 12 b"), (V{"a", " ", "1", "2", " b"}));
}

TEST(TokenizerUnicode, NfcAndLossyUtf8) {
  EXPECT_EQ(unicode::nfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(unicode::nfc("A\u030a"), "\u00c5");
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");         // Angstrom sign
  EXPECT_EQ(unicode::nfc("o\u0323\u0302"), "\u1ed9");  // reordered marks compose
  EXPECT_EQ(unicode::nfc("o\u0302\u0323"), "\u1ed9");
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul jamo
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::utf8_lossy("a\xF0\x9F\x99"),
            "a\xEF\xBF\xBD");  // truncated 4-byte sequence: one U+FFFD
  EXPECT_EQ(unicode::utf8_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(unicode::is_letter(U'\u00e9'));
  EXPECT_TRUE(unicode::is_number(U'\u0663'));
  EXPECT_TRUE(unicode::is_whitespace(0x3000));
  EXPECT_FALSE(unicode::is_whitespace(0x200B));
}

TEST(Tokenizer, InvalidUtf8InputRoundTrips) {
  REQUIRE_TOKENIZER(tok, "llama3");
  const std::string bad = "ok \xFF\xFE bytes \xE2\x82";
  std::string bytes;
  for (int32_t id : tok->encode(bad)) bytes += tok->decode_token(id);
  EXPECT_EQ(bytes, bad);
}

// ---- speed -------------------------------------------------------------------------------

TEST(TokenizerSpeed, LoadAndEncode) {
  if (!exists(tokenizer_path("llama3")))
    GTEST_SKIP() << "tokenizer data absent: " << tokenizer_path("llama3");
  using clock = std::chrono::steady_clock;
  // Thread CPU time too: wall time on a shared 2-core machine mostly measures the neighbours.
  const auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  };
  const auto t0 = clock::now();
  const double c0 = cpu_ms();
  const Tokenizer tok = Tokenizer::from_hf_json(tokenizer_path("llama3"));
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  const double load_cpu_ms = cpu_ms() - c0;
  std::string corpus;
  while (corpus.size() < (1u << 20)) {
    for (const auto& t : fixtures()["texts"]) corpus += t.get<std::string>() + "\n";
  }
  const auto t1 = clock::now();
  const double c1 = cpu_ms();
  const auto ids = tok.encode(corpus);
  const double secs = std::chrono::duration<double>(clock::now() - t1).count();
  const double cpu_secs = (cpu_ms() - c1) / 1e3;
  const double mb_per_s = corpus.size() / 1e6 / secs;
  std::printf(
      "[tokenizer] llama3 load %.0f ms (%.0f ms CPU); encode %.2f MB (%zu ids) at %.2f MB/s "
      "(%.2f MB/s CPU)\n",
      load_ms, load_cpu_ms, corpus.size() / 1e6, ids.size(), mb_per_s,
      corpus.size() / 1e6 / cpu_secs);
  EXPECT_EQ(tok.decode(ids), corpus);
  // Loose bounds (a busy CI machine); the figures above are what to read.
  EXPECT_LT(load_ms, 5000.0);
  EXPECT_GT(mb_per_s, 0.5);
}

// ---- malformed input ---------------------------------------------------------------------

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    path_ = ::testing::TempDir() + "tessel_tok_" + std::to_string(counter_++) + ".json";
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(TokenizerErrors, MalformedInput) {
  using test::expect_error;
  using test::expect_invalid;
  expect_invalid([] { Tokenizer::from_hf_json("/nonexistent/tokenizer.json"); }, "Tokenizer",
                 "tokenizer_json_path", "/nonexistent/tokenizer.json");
  const TempFile bad_json("{\"model\": {\"type\": \"BPE\", ");
  expect_invalid([&] { Tokenizer::from_hf_json(bad_json.path()); }, "Tokenizer",
                 "tokenizer_json_path", "valid JSON");
  const TempFile no_model("{\"version\": \"1.0\"}");
  expect_invalid([&] { Tokenizer::from_hf_json(no_model.path()); }, "Tokenizer",
                 "tokenizer_json_path", "\"model\"");
  const TempFile wordpiece("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
  expect_error([&] { Tokenizer::from_hf_json(wordpiece.path()); }, TESSEL_ERROR_UNSUPPORTED,
               "Tokenizer", "model.type", "WordPiece");
  const TempFile no_merges("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}");
  expect_invalid([&] { Tokenizer::from_hf_json(no_merges.path()); }, "Tokenizer", "model");
  // A BPE model that is not byte-level (no single-byte tokens).
  const TempFile not_byte_level(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
      " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}}");
  expect_invalid([&] { Tokenizer::from_hf_json(not_byte_level.path()); }, "Tokenizer", "vocab");
  const TempFile whitespace_pre(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
      " \"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
  expect_error([&] { Tokenizer::from_hf_json(whitespace_pre.path()); }, TESSEL_ERROR_UNSUPPORTED,
               "Tokenizer", "pre_tokenizer", "Whitespace");
  const TempFile nfkc(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": "
      "{\"type\": \"NFKC\"}}");
  expect_error([&] { Tokenizer::from_hf_json(nfkc.path()); }, TESSEL_ERROR_UNSUPPORTED, "Tokenizer",
               "normalizer", "NFKC");
  expect_invalid(
      [] { Tokenizer::from_gpt2_files("/nonexistent/encoder.json", "/nonexistent/vocab.bpe"); },
      "Tokenizer", "encoder_json");

  TokenizerData d;
  d.model = "llama";  // SentencePiece: not byte-level BPE
  d.pre = "llama-bpe";
  expect_error([&] { Tokenizer::from_data(d); }, TESSEL_ERROR_UNSUPPORTED, "Tokenizer", "model",
               "llama");
  d.model = "gpt2";
  d.pre = "falcon";
  expect_error([&] { Tokenizer::from_data(d); }, TESSEL_ERROR_UNSUPPORTED, "Tokenizer", "pre",
               "falcon");
  d.pre = "gpt2";
  d.tokens = {"a", "b"};
  d.token_types = {1};
  expect_invalid([&] { Tokenizer::from_data(d); }, "Tokenizer", "token_types");
}

}  // namespace
}  // namespace tessel::llm
