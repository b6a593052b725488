#include "llm/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "llm/unicode.hpp"
#include "tessel/tensor.hpp"

namespace tessel::llm {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& arg, const std::string& expected, const std::string& got,
                       tessel_status_t code = TESSEL_ERROR_INVALID_ARGUMENT) {
  throw Error(code,
              "tessel::Tokenizer: argument '" + arg + "': expected " + expected + ", got " + got);
}

std::string read_file(const std::string& path, const std::string& arg) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(arg, "a readable file", "'" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& arg, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(arg, "valid JSON", "a parse error in '" + path + "'");
  return j;
}

// GPT-2's reversible byte <-> printable character mapping (bytes_to_unicode).
struct ByteMap {
  static constexpr uint32_t kCodePoints = 512;  // every mapped character is below U+0200
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, kCodePoints> cp_to_byte{};  // -1: not a byte-level character
  ByteMap() {
    cp_to_byte.fill(-1);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = printable ? b : 256 + extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// A token string as raw bytes: byte-level characters mapped back; a string holding any other
// character is taken as raw text (Hugging Face's ByteLevel decoder does the same).
std::string byte_level_to_raw(std::string_view token) {
  const auto& map = byte_map().cp_to_byte;
  std::string raw;
  raw.reserve(token.size());
  for (size_t pos = 0, len = 0; pos < token.size(); pos += len) {
    const uint32_t cp = unicode::decode_utf8(token, pos, len);
    if (cp >= ByteMap::kCodePoints || map[cp] < 0) return std::string(token);
    raw += static_cast<char>(map[cp]);
  }
  return raw;
}

enum CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify(uint32_t cp) {
  if (unicode::is_letter(cp)) return kLetter;
  if (unicode::is_number(cp)) return kNumber;
  if (unicode::is_whitespace(cp)) return kSpace;
  return kOther;
}

// Case folding for (?i:'s|...): ASCII, plus U+017F (long s), which folds to 's' as in Oniguruma.
uint32_t fold_case(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  return cp == 0x17F ? 's' : cp;
}

// Hand-written matchers of the pre-tokenizer regexes over decoded code points. Each returns the
// length (in code points) of the leftmost-first match at i, never 0, with `n` as the text end.
struct Matcher {
  const uint32_t* cp;
  const CharClass* cls;
  size_t n;

  size_t run(size_t i, CharClass c) const {
    while (i < n && cls[i] == c) ++i;
    return i;
  }
  // 's|'t|'re|'ve|'m|'ll|'d (case-insensitive for the Llama-3 / Qwen2 patterns).
  size_t contraction(size_t i, bool fold) const {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    const auto low = [&](size_t k) { return fold ? fold_case(cp[k]) : cp[k]; };
    const uint32_t a = low(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    const uint32_t b = low(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }
  // \s+(?!\S)|\s+ at a whitespace character.
  size_t trailing_space(size_t i) const {
    const size_t j = run(i, kSpace);
    if (j == n || j - i == 1) return j - i;
    return j - i - 1;  // leave the last space to prefix the next word
  }

  size_t gpt2(size_t i) const {
    if (size_t k = contraction(i, false)) return k;
    const bool space_prefix = cp[i] == ' ' && i + 1 < n;
    for (CharClass c : {kLetter, kNumber, kOther}) {
      if (space_prefix && cls[i + 1] == c) return run(i + 1, c) - i;
      if (cls[i] == c) return run(i, c) - i;
    }
    return trailing_space(i);
  }

  size_t llama3(size_t i, size_t max_digits) const {
    if (size_t k = contraction(i, true)) return k;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (cls[i] == kLetter) return run(i, kLetter) - i;
    if (cls[i] != kNumber && cp[i] != '\r' && cp[i] != '\n' && i + 1 < n && cls[i + 1] == kLetter)
      return run(i + 1, kLetter) - i;
    // \p{N}{1,max_digits}
    if (cls[i] == kNumber) {
      size_t j = i;
      while (j < n && j - i < max_digits && cls[j] == kNumber) ++j;
      return j - i;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    size_t start = cls[i] == kOther                                      ? i
                   : (cp[i] == ' ' && i + 1 < n && cls[i + 1] == kOther) ? i + 1
                                                                         : n;
    if (start < n) {
      size_t j = run(start, kOther);
      while (j < n && (cp[j] == '\r' || cp[j] == '\n')) ++j;
      return j - i;
    }
    // \s*[\r\n]+ : through the last line break of this whitespace run.
    const size_t j = run(i, kSpace);
    for (size_t k = j; k > i; --k) {
      if (cp[k - 1] == '\r' || cp[k - 1] == '\n') return k - i;
    }
    return trailing_space(i);
  }
};

struct AddedToken {
  std::string content;  // raw text matched in the input
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

const char* const kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

PreTokenizer pre_from_name(const std::string& pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return PreTokenizer::kLlama3;
  if (pre == "qwen2") return PreTokenizer::kQwen2;
  if (pre == "gpt2" || pre == "gpt-2" || pre == "default") return PreTokenizer::kGpt2;
  if (pre == "smollm") return PreTokenizer::kSmolLM;
  fail("pre", "one of llama-bpe, llama3, qwen2, gpt2, gpt-2, default, smollm", "'" + pre + "'",
       TESSEL_ERROR_UNSUPPORTED);
}

// Python's str.strip over `is_strip` characters.
std::string strip(std::string_view s, bool left, bool right, bool (*is_strip)(uint32_t)) {
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t len = 0;
      if (!is_strip(unicode::decode_utf8(s, begin, len))) break;
      begin += len;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      if (!is_strip(unicode::decode_utf8(s, start, len)) || start + len != end) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}
bool is_newline(uint32_t cp) { return cp == '\n'; }

// The default system prompt a ChatML template inserts when the conversation has none
// (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."), or "".
std::string chatml_default_system(const std::string& tmpl) {
  const std::string head = "<|im_start|>system";
  for (size_t pos = tmpl.find(head); pos != std::string::npos; pos = tmpl.find(head, pos + 1)) {
    size_t body = pos + head.size();
    if (tmpl.compare(body, 2, "\\n") == 0) {
      body += 2;
    } else if (tmpl.compare(body, 1, "\n") == 0) {
      body += 1;
    } else {
      continue;
    }
    const size_t end = tmpl.find("<|im_end|>", body);
    if (end == std::string::npos) continue;
    const std::string text = tmpl.substr(body, end - body);
    if (text.empty() || text.find_first_of("'\"{}+") != std::string::npos) continue;
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return "";
}

// Open-addressing hash maps: the vocabulary and merge tables are hit ~1M times while loading a
// Llama-3 file and once per symbol pair while encoding; node-based std::unordered_map was the
// largest cost of both.
class StringIdMap {
 public:
  void reserve(size_t n) {
    if (n * 2 > slots_.size()) rehash(std::bit_ceil(std::max<size_t>(16, n * 2)));
    keys_.reserve(n);
  }
  // Keeps the first id given for a key.
  void emplace(std::string_view key, int32_t id) {
    if ((keys_.size() + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
    const uint64_t h = std::hash<std::string_view>{}(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = {h, id, static_cast<uint32_t>(keys_.size())};
        keys_.emplace_back(key);
        return;
      }
      if (s.hash == h && keys_[s.key] == key) return;
    }
  }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = std::hash<std::string_view>{}(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && keys_[s.key] == key) return s.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    int32_t id = -1;
    uint32_t key = 0;
  };
  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.id < 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].id >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::vector<std::string> keys_;
  size_t mask_ = 0;
};

struct Merge {
  int32_t rank, merged;
};

// (left id, right id) -> merge rank and merged id.
class MergeMap {
 public:
  void reserve(size_t n) {
    if (n * 2 > slots_.size()) rehash(std::bit_ceil(std::max<size_t>(16, n * 2)));
  }
  void emplace(int32_t left, int32_t right, Merge m) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
    const uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = {k, m};
        ++size_;
        return;
      }
      if (slots_[i].key == k) return;  // the first (lowest) rank wins
    }
  }
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> (64 - bits_); }
  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    bits_ = std::countr_zero(capacity);
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = slot(s.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int bits_ = 0;
};

// Parses a tokenizer.json into a DOM except model.vocab and model.merges, which go straight into
// flat vectors: a 10 MB file holds ~400k of them, and a DOM of them (std::map nodes) costs more
// than everything else the loader does.
class TokenizerJsonReader : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string bad_entry;  // first vocab/merges entry of an unexpected shape

  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return number(v); }
  bool number_unsigned(number_unsigned_t v) override { return number(static_cast<int64_t>(v)); }
  bool number_float(number_float_t v, const string_t&) override {
    if (mode_ != Mode::kNone) return malformed(std::to_string(v));
    return value(v);
  }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos) return malformed("'" + v + "'");
      merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    if (mode_ == Mode::kVocab) return malformed("'" + key_ + "': \"" + v + "\"");
    return value(std::move(v));
  }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override {
    if (mode_ != Mode::kNone) return malformed("an object");
    const bool vocab_here = stack_.size() == 2 && key_ == "vocab" && path_model();
    json* obj = open(json::object());
    if (vocab_here) {
      mode_ = Mode::kVocab;
      capture_depth_ = stack_.size();
    }
    return obj != nullptr;
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab && stack_.size() == capture_depth_) mode_ = Mode::kNone;
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kNone) return malformed("a nested array");
    const bool merges_here = stack_.size() == 2 && key_ == "merges" && path_model();
    open(json::array());
    if (merges_here) {
      mode_ = Mode::kMerges;
      capture_depth_ = stack_.size();
    }
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2)
        return malformed("a pair of " + std::to_string(pair_.size()) + " strings");
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges && stack_.size() == capture_depth_) mode_ = Mode::kNone;
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
  std::string error;

 private:
  enum class Mode { kNone, kVocab, kMerges, kMergePair };
  Mode mode_ = Mode::kNone;
  size_t capture_depth_ = 0;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // the key each open container sits under ("" in arrays)
  std::string key_;
  std::vector<std::string> pair_;

  bool path_model() const { return keys_.size() == 2 && keys_[1] == "model"; }
  bool malformed(const std::string& what) {
    if (bad_entry.empty()) bad_entry = what;
    return false;
  }
  bool number(int64_t v) {
    if (mode_ == Mode::kVocab) {
      vocab.emplace_back(std::move(key_), v);
      return true;
    }
    if (mode_ != Mode::kNone) return malformed(std::to_string(v));
    return value(v);
  }
  json* place(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json&& v) {
    place(std::move(v));
    return true;
  }
  json* open(json&& container) {
    const std::string under = !stack_.empty() && stack_.back()->is_object() ? key_ : "";
    json* c = place(std::move(container));
    stack_.push_back(c);
    keys_.push_back(under);
    return c;
  }
};

}  // namespace

struct Tokenizer::Impl {
  PreTokenizer pre = PreTokenizer::kGpt2;
  bool ignore_merges = false;
  bool nfc = false;
  bool add_prefix_space = false;
  bool add_bos = false;
  int32_t bos = -1, eos = -1;
  std::vector<int32_t> eos_list;
  std::string chat_template, bos_text;
  ChatFormat chat = ChatFormat::kPlain;

  std::vector<std::string> id_to_raw;  // decode bytes per id ("" for holes)
  std::vector<uint8_t> special;        // 1 for special added tokens
  StringIdMap vocab;                   // BPE model vocabulary, raw bytes -> id
  std::array<int32_t, 256> byte_token{};
  MergeMap merges;
  std::vector<AddedToken> added;
  std::array<std::vector<int32_t>, 256> added_by_first_byte;  // indices into `added`, longest first

  void set_token(int32_t id, std::string raw) {
    constexpr int32_t kMaxId = 1 << 24;  // far above any vocabulary; guards the table size
    if (id < 0 || id >= kMaxId) {
      fail("token id", "an id in 0.." + std::to_string(kMaxId - 1), std::to_string(id));
    }
    if (static_cast<size_t>(id) >= id_to_raw.size()) {
      id_to_raw.resize(id + 1);
      special.resize(id + 1, 0);
    }
    id_to_raw[id] = std::move(raw);
  }

  void add_vocab(const std::string& byte_level, int32_t id) {
    std::string raw = byte_level_to_raw(byte_level);
    vocab.emplace(raw, id);
    set_token(id, std::move(raw));
  }

  void add_merge(std::string_view left, std::string_view right, int32_t rank) {
    std::string l = byte_level_to_raw(left);
    const std::string r = byte_level_to_raw(right);
    const int32_t left_id = vocab.find(l), right_id = vocab.find(r);
    if (left_id < 0 || right_id < 0) return;
    l += r;
    const int32_t merged = vocab.find(l);
    if (merged < 0) return;
    merges.emplace(left_id, right_id, Merge{rank, merged});
  }

  void add_added(AddedToken t) {
    // Matched as raw text, decoded like every token (HF's ByteLevel decoder maps it when it can).
    set_token(t.id, byte_level_to_raw(t.content));
    special[t.id] = t.special;
    if (!t.content.empty()) added.push_back(std::move(t));
  }

  // Lookup tables, end-of-generation ids and the chat format, once every token is in.
  void finish() {
    // Bytes without a token (SmolLM2 lacks some control characters) are dropped when encoding, as
    // Hugging Face's BPE does without an unk token; printable ASCII must be there.
    for (int b = 0; b < 256; ++b) {
      const char byte = static_cast<char>(b);
      byte_token[b] = vocab.find(std::string_view(&byte, 1));
      if (byte_token[b] < 0 && b >= '!' && b <= '~') {
        fail("vocab", "a byte-level vocabulary (a token for every printable ASCII byte)",
             "no token for '" + std::string(1, byte) + "'");
      }
    }
    for (auto& list : added_by_first_byte) list.clear();
    for (size_t i = 0; i < added.size(); ++i) {
      added_by_first_byte[static_cast<uint8_t>(added[i].content[0])].push_back(
          static_cast<int32_t>(i));
    }
    for (auto& list : added_by_first_byte) {
      std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
        return added[a].content.size() > added[b].content.size();
      });
    }
    const auto valid = [&](int32_t id) {
      return id >= 0 && static_cast<size_t>(id) < id_to_raw.size();
    };
    if (!valid(bos)) bos = -1;
    if (!valid(eos)) eos = -1;
    if (bos < 0) add_bos = false;
    if (bos >= 0 && bos_text.empty()) bos_text = id_to_raw[bos];
    std::vector<int32_t> ends;
    if (eos >= 0) ends.push_back(eos);
    for (int32_t id : eos_list) {
      if (valid(id) && std::find(ends.begin(), ends.end(), id) == ends.end()) ends.push_back(id);
    }
    // End-of-turn tokens of the supported chat formats also stop generation.
    for (const char* name :
         {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>"}) {
      for (const auto& t : added) {
        if (t.special && t.content == name &&
            std::find(ends.begin(), ends.end(), t.id) == ends.end()) {
          ends.push_back(t.id);
        }
      }
    }
    eos_list = std::move(ends);
    if (eos < 0 && !eos_list.empty()) eos = eos_list.front();

    const auto has_token = [&](const char* s) {
      return std::any_of(added.begin(), added.end(),
                         [&](const AddedToken& t) { return t.content == s; });
    };
    if (chat_template.find("<|start_header_id|>") != std::string::npos) {
      chat = ChatFormat::kLlama3;
    } else if (chat_template.find("<|im_start|>") != std::string::npos) {
      chat = ChatFormat::kChatML;
    } else if (chat_template.empty() && has_token("<|start_header_id|>")) {
      chat = ChatFormat::kLlama3;
    } else if (chat_template.empty() && has_token("<|im_start|>")) {
      chat = ChatFormat::kChatML;
    } else {
      chat = ChatFormat::kPlain;
    }
  }

  // ---- encode ------------------------------------------------------------------------------

  // Calls on_word(begin, end) (byte offsets into `text`) for each pre-token.
  template <class F>
  void split_words(std::string_view text, F&& on_word) const {
    thread_local std::vector<uint32_t> cps;
    thread_local std::vector<CharClass> cls;
    thread_local std::vector<uint32_t> offs;
    cps.clear();
    cls.clear();
    offs.clear();
    for (size_t pos = 0, len = 0; pos < text.size(); pos += len) {
      const uint32_t cp = unicode::decode_utf8(text, pos, len);
      cps.push_back(cp);
      cls.push_back(classify(cp));
      offs.push_back(static_cast<uint32_t>(pos));
    }
    offs.push_back(static_cast<uint32_t>(text.size()));
    const size_t n = cps.size();
    const auto emit = [&](size_t i, size_t j) { on_word(offs[i], offs[j]); };
    if (pre == PreTokenizer::kSmolLM) {
      // Digits(individual_digits) isolates every \p{N}; the GPT-2 regex splits the rest.
      size_t i = 0;
      while (i < n) {
        if (cls[i] == kNumber) {
          emit(i, i + 1);
          ++i;
          continue;
        }
        size_t seg_end = i;
        while (seg_end < n && cls[seg_end] != kNumber) ++seg_end;
        const Matcher m{cps.data(), cls.data(), seg_end};
        while (i < seg_end) {
          const size_t len = m.gpt2(i);
          emit(i, i + len);
          i += len;
        }
      }
      return;
    }
    const Matcher m{cps.data(), cls.data(), n};
    for (size_t i = 0; i < n;) {
      size_t len = 0;
      switch (pre) {
        case PreTokenizer::kGpt2: len = m.gpt2(i); break;
        case PreTokenizer::kLlama3: len = m.llama3(i, 3); break;
        case PreTokenizer::kQwen2: len = m.llama3(i, 1); break;
        case PreTokenizer::kSmolLM: break;
      }
      emit(i, i + len);
      i += len;
    }
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.size() == 1) {
      if (const int32_t id = byte_token[static_cast<uint8_t>(word[0])]; id >= 0) out.push_back(id);
      return;
    }
    if (ignore_merges) {
      if (const int32_t id = vocab.find(word); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    struct Sym {
      int32_t id, prev, next;
    };
    struct Cand {
      int32_t rank, pos, left, right, merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    thread_local std::vector<Sym> syms;
    thread_local std::vector<Cand> heap;  // min-heap on (rank, pos) via std::push_heap/pop_heap
    syms.clear();
    heap.clear();
    for (char c : word) {
      const int32_t id = byte_token[static_cast<uint8_t>(c)];
      if (id < 0) continue;  // a byte without a token
      const auto i = static_cast<int32_t>(syms.size());
      syms.push_back({id, i - 1, i + 1});
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    const auto n = static_cast<int32_t>(syms.size());
    const auto push = [&](int32_t pos) {
      const int32_t next = syms[pos].next;
      if (next < 0) return;
      const Merge* m = merges.find(syms[pos].id, syms[next].id);
      if (m == nullptr) return;
      heap.push_back({m->rank, pos, syms[pos].id, syms[next].id, m->merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<Cand>{});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>{});
      const Cand c = heap.back();
      heap.pop_back();
      Sym& left = syms[c.pos];
      if (left.id != c.left || left.next < 0 || syms[left.next].id != c.right) continue;  // stale
      const int32_t right = left.next;
      left.id = c.merged;
      left.next = syms[right].next;
      if (left.next >= 0) syms[left.next].prev = c.pos;
      syms[right].id = -1;
      if (left.prev >= 0) push(left.prev);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  }

  void encode_segment(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    if (nfc) {
      normalized = unicode::nfc(text);
      text = normalized;
    }
    std::string prefixed;
    if (add_prefix_space && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    split_words(text, [&](size_t b, size_t e) { bpe(text.substr(b, e - b), out); });
  }

  // Finds the leftmost-longest added token at or after `from`; returns its index or -1 and the
  // matched byte range (after lstrip/rstrip).
  int32_t find_added(std::string_view text, size_t from, size_t& begin, size_t& end) const {
    for (size_t pos = from; pos < text.size(); ++pos) {
      const auto& candidates = added_by_first_byte[static_cast<uint8_t>(text[pos])];
      for (int32_t idx : candidates) {
        const AddedToken& t = added[idx];
        if (text.compare(pos, t.content.size(), t.content) != 0) continue;
        size_t b = pos, e = pos + t.content.size();
        if (t.single_word && !single_word_ok(text, b, e)) continue;
        if (t.lstrip) b = skip_space_left(text, from, b);
        if (t.rstrip) e = skip_space_right(text, e);
        begin = b;
        end = e;
        return idx;
      }
    }
    return -1;
  }
  static size_t skip_space_left(std::string_view text, size_t floor, size_t b) {
    while (b > floor) {
      size_t start = b - 1;
      while (start > floor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      if (!unicode::is_whitespace(unicode::decode_utf8(text, start, len))) break;
      b = start;
    }
    return b;
  }
  static size_t skip_space_right(std::string_view text, size_t e) {
    while (e < text.size()) {
      size_t len = 0;
      if (!unicode::is_whitespace(unicode::decode_utf8(text, e, len))) break;
      e += len;
    }
    return e;
  }
  static bool is_word_char(uint32_t cp) {
    return unicode::is_letter(cp) || unicode::is_number(cp) || cp == '_';
  }
  static bool single_word_ok(std::string_view text, size_t b, size_t e) {
    if (b > 0) {
      size_t start = b - 1;
      while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      if (is_word_char(unicode::decode_utf8(text, start, len))) return false;
    }
    if (e < text.size()) {
      size_t len = 0;
      if (is_word_char(unicode::decode_utf8(text, e, len))) return false;
    }
    return true;
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && add_bos) out.push_back(bos);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t b = 0, e = 0;
      const int32_t idx = added.empty() ? -1 : find_added(text, pos, b, e);
      if (idx < 0) {
        encode_segment(text.substr(pos), out);
        break;
      }
      encode_segment(text.substr(pos, b - pos), out);
      out.push_back(added[idx].id);
      pos = e;
    }
    return out;
  }

  // ---- chat templates ----------------------------------------------------------------------

  std::string render_llama3(const std::vector<ChatMessage>& msgs, bool gen_prompt) const {
    std::string out;
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (i == 0) out += bos_text;
      out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" +
             strip(msgs[i].content, true, true, unicode::is_python_space) + "<|eot_id|>";
    }
    // The original Llama-3 template appends the assistant header unconditionally.
    const bool conditional = chat_template.find("add_generation_prompt") != std::string::npos;
    if (gen_prompt || (!conditional && !chat_template.empty())) {
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    }
    return out;
  }

  std::string render_chatml(const std::vector<ChatMessage>& msgs, bool gen_prompt) const {
    std::string out;
    const std::string default_system = chatml_default_system(chat_template);
    if (!msgs.empty() && msgs[0].role != "system" && !default_system.empty()) {
      out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    }
    // Qwen3: the assistant turn after the last user query carries its reasoning in <think>.
    const bool qwen3 = chat_template.find("</think>") != std::string::npos;
    size_t last_query = msgs.empty() ? 0 : msgs.size() - 1;
    if (qwen3) {
      for (size_t k = msgs.size(); k-- > 0;) {
        const std::string& c = msgs[k].content;
        const bool tool_response = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                                   c.compare(c.size() - 16, 16, "</tool_response>") == 0;
        if (msgs[k].role == "user" && !tool_response) {
          last_query = k;
          break;
        }
      }
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
      const ChatMessage& m = msgs[i];
      if (!qwen3 || m.role == "user" || m.role == "system") {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      } else if (m.role == "assistant") {
        std::string content = m.content, reasoning;
        const size_t close = content.rfind("</think>");
        if (close != std::string::npos) {
          std::string before = content.substr(0, content.find("</think>"));
          content = strip(content.substr(close + 8), true, false, is_newline);
          before = strip(before, false, true, is_newline);
          const size_t open = before.rfind("<think>");
          reasoning = strip(open == std::string::npos ? before : before.substr(open + 7), true,
                            false, is_newline);
        }
        const bool last = i + 1 == msgs.size();
        if (i > last_query && (last || !reasoning.empty())) {
          out += "<|im_start|>assistant\n<think>\n" + strip(reasoning, true, true, is_newline) +
                 "\n</think>\n\n" + strip(content, true, false, is_newline);
        } else {
          out += "<|im_start|>assistant\n" + content;
        }
        out += "<|im_end|>\n";
      } else if (m.role == "tool") {
        if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
        out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
        if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
      }
    }
    if (gen_prompt) out += "<|im_start|>assistant\n";
    return out;
  }

  std::string render_plain(const std::vector<ChatMessage>& msgs, bool gen_prompt) const {
    std::string out;
    for (const auto& m : msgs) out += m.role + ": " + m.content + "\n";
    if (gen_prompt) out += "assistant: ";
    return out;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

// The pre-tokenizer of a tokenizer.json: ByteLevel(use_regex) alone is GPT-2; Split(regex) +
// ByteLevel is Llama-3 or Qwen2 by the exact pattern; Digits(individual) + ByteLevel is SmolLM2.
void read_pre_tokenizer(const json& pre, Tokenizer::Impl& impl, const std::string& path) {
  const auto bad = [&](const std::string& got) {
    fail("pre_tokenizer",
         "ByteLevel, or a Sequence of a Llama-3/Qwen2 Split or Digits(individual_digits) and "
         "ByteLevel",
         got + " in '" + path + "'", TESSEL_ERROR_UNSUPPORTED);
  };
  if (!pre.is_object()) bad("none");
  std::vector<json> steps;
  if (pre.value("type", "") == "Sequence") {
    for (const auto& p : pre.value("pretokenizers", json::array())) steps.push_back(p);
  } else {
    steps.push_back(pre);
  }
  bool byte_level = false, regex_given = false;
  PreTokenizer kind = PreTokenizer::kGpt2;
  for (const auto& s : steps) {
    const std::string type = s.value("type", "");
    if (type == "ByteLevel") {
      byte_level = true;
      impl.add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) {
        if (regex_given && kind != PreTokenizer::kSmolLM) bad("two regex splits");
        if (!regex_given) kind = PreTokenizer::kGpt2;
        regex_given = true;
      }
    } else if (type == "Split") {
      const std::string pattern = s.contains("pattern") ? s["pattern"].value("Regex", "") : "";
      if (pattern == kLlama3Pattern) {
        kind = PreTokenizer::kLlama3;
      } else if (pattern == kQwen2Pattern) {
        kind = PreTokenizer::kQwen2;
      } else if (pattern == kGpt2Pattern) {
        kind = PreTokenizer::kGpt2;
      } else {
        bad("Split pattern '" + pattern + "'");
      }
      if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
        bad("a Split that is not Isolated");
      regex_given = true;
    } else if (type == "Digits" && s.value("individual_digits", false)) {
      kind = PreTokenizer::kSmolLM;
    } else {
      bad("'" + type + "'");
    }
  }
  if (!byte_level || !regex_given) bad("no ByteLevel step with a regex split");
  impl.pre = kind;
}

void read_normalizer(const json& norm, Tokenizer::Impl& impl, const std::string& path) {
  if (norm.is_null()) return;
  std::vector<json> steps;
  if (norm.value("type", "") == "Sequence") {
    for (const auto& n : norm.value("normalizers", json::array())) steps.push_back(n);
  } else {
    steps.push_back(norm);
  }
  for (const auto& n : steps) {
    const std::string type = n.value("type", "");
    if (type != "NFC") {
      fail("normalizer", "none or NFC", "'" + type + "' in '" + path + "'",
           TESSEL_ERROR_UNSUPPORTED);
    }
    impl.nfc = true;
  }
}

// A TemplateProcessing post-processor that starts with a special token adds BOS.
void read_post_processor(const json& post, Tokenizer::Impl& impl) {
  if (!post.is_object()) return;
  if (post.value("type", "") == "Sequence") {
    for (const auto& p : post.value("processors", json::array())) read_post_processor(p, impl);
    return;
  }
  if (post.value("type", "") != "TemplateProcessing") return;
  const json& single = post.value("single", json::array());
  if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) return;
  const std::string name = single[0]["SpecialToken"].value("id", "");
  const json& specials = post.value("special_tokens", json::object());
  if (specials.contains(name) && !specials[name].value("ids", json::array()).empty()) {
    impl.bos = specials[name]["ids"][0].get<int32_t>();
    impl.add_bos = true;
  }
}

void read_tokenizer_config(const std::string& dir, Tokenizer::Impl& impl) {
  const std::string path = dir + "tokenizer_config.json";
  std::ifstream probe(path);
  if (!probe) return;
  const json cfg =
      parse_json(read_file(path, "tokenizer_config.json"), "tokenizer_config.json", path);
  if (!cfg.is_object())
    fail("tokenizer_config.json", "a JSON object", "another value in '" + path + "'");
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) {
      impl.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: take "default"
      for (const auto& e : t) {
        if (e.value("name", "") == "default") impl.chat_template = e.value("template", "");
      }
    }
  }
  const auto id_of = [&](const std::string& content) {
    for (const auto& t : impl.added) {
      if (t.content == content) return t.id;
    }
    return impl.vocab.find(content);
  };
  if (cfg.contains("bos_token")) {
    const std::string bos = token_content(cfg["bos_token"]);
    if (!bos.empty()) {
      impl.bos = id_of(bos);
      impl.bos_text = bos;
    }
  }
  if (cfg.contains("eos_token")) {
    const std::string eos = token_content(cfg["eos_token"]);
    if (!eos.empty()) impl.eos = id_of(eos);
  }
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    impl.add_bos = cfg["add_bos_token"].get<bool>();
  }
}

std::unique_ptr<Tokenizer::Impl> load_hf_json(const std::string& path) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  TokenizerJsonReader reader;
  {
    const std::string text = read_file(path, "tokenizer_json_path");
    json::sax_parse(text, &reader);
  }
  if (!reader.bad_entry.empty()) {
    fail("model", "vocab entries \"token\": id and merges \"a b\" or [a, b]",
         reader.bad_entry + " in '" + path + "'");
  }
  if (!reader.error.empty())
    fail("tokenizer_json_path", "valid JSON", "a parse error in '" + path + "'");
  const json& j = reader.root;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    fail("tokenizer_json_path", "a tokenizer.json object with a \"model\" section",
         "none in '" + path + "'");
  }
  const json& model = j["model"];
  const std::string type = model.value("type", "BPE");
  if (type != "BPE")
    fail("model.type", "BPE", "'" + type + "' in '" + path + "'", TESSEL_ERROR_UNSUPPORTED);
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array()) {
    fail("model", "BPE \"vocab\" (object) and \"merges\" (array)",
         "neither or a wrong type in '" + path + "'");
  }
  if (model.value("byte_fallback", false)) {
    fail("model.byte_fallback", "false (byte-level BPE)", "true in '" + path + "'",
         TESSEL_ERROR_UNSUPPORTED);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      fail(std::string("model.") + key, "empty", "'" + model[key].get<std::string>() + "'",
           TESSEL_ERROR_UNSUPPORTED);
    }
  }
  impl->ignore_merges = model.value("ignore_merges", false);
  impl->vocab.reserve(reader.vocab.size() * 2);
  for (auto& [token, id] : reader.vocab) {
    if (id < 0 || id > INT32_MAX) fail("model.vocab", "ids in 0..2^31-1", std::to_string(id));
    impl->add_vocab(token, static_cast<int32_t>(id));
  }
  impl->merges.reserve(reader.merges.size() * 2);
  for (size_t rank = 0; rank < reader.merges.size(); ++rank) {
    impl->add_merge(reader.merges[rank].first, reader.merges[rank].second,
                    static_cast<int32_t>(rank));
  }
  for (const auto& t : j.value("added_tokens", json::array())) {
    AddedToken a;
    a.content = t.value("content", "");
    a.id = t.value("id", -1);
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    impl->add_added(std::move(a));
  }
  read_normalizer(j.value("normalizer", json()), *impl, path);
  read_pre_tokenizer(j.value("pre_tokenizer", json()), *impl, path);
  read_post_processor(j.value("post_processor", json()), *impl);
  const size_t slash = path.find_last_of('/');
  read_tokenizer_config(slash == std::string::npos ? "" : path.substr(0, slash + 1), *impl);
  impl->finish();
  return impl;
}

std::unique_ptr<Tokenizer::Impl> load_gpt2_files(const std::string& encoder_json,
                                                 const std::string& vocab_bpe) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  const json enc =
      parse_json(read_file(encoder_json, "encoder_json"), "encoder_json", encoder_json);
  if (!enc.is_object() || enc.empty()) {
    fail("encoder_json", "a JSON object of token -> id", "another value in '" + encoder_json + "'");
  }
  impl->vocab.reserve(enc.size() * 2);
  for (const auto& [token, id] : enc.items()) {
    if (!id.is_number_integer()) fail("encoder_json", "integer ids", "'" + token + "'");
    if (token == "<|endoftext|>") continue;  // added below as a special token
    impl->add_vocab(token, id.get<int32_t>());
  }
  std::istringstream lines(read_file(vocab_bpe, "vocab_bpe"));
  std::string line;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) fail("vocab_bpe", "\"a b\" merge lines", "'" + line + "'");
    impl->add_merge(std::string_view(line).substr(0, sp), std::string_view(line).substr(sp + 1),
                    rank++);
  }
  if (enc.contains("<|endoftext|>")) {
    const int32_t id = enc["<|endoftext|>"].get<int32_t>();
    impl->add_added({"<|endoftext|>", id, true, false, false, false});
    impl->bos = impl->eos = id;
  }
  impl->pre = PreTokenizer::kGpt2;
  impl->finish();
  return impl;
}

}  // namespace

// A JSON value of the wrong type deep inside a file (nlohmann throws) is still a tessel::Error.
Tokenizer Tokenizer::from_hf_json(const std::string& tokenizer_json_path) {
  try {
    return Tokenizer(load_hf_json(tokenizer_json_path));
  } catch (const json::exception& e) {
    fail("tokenizer_json_path", "a well-formed tokenizer.json / tokenizer_config.json",
         std::string(e.what()) + " in '" + tokenizer_json_path + "'");
  }
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& encoder_json,
                                     const std::string& vocab_bpe) {
  try {
    return Tokenizer(load_gpt2_files(encoder_json, vocab_bpe));
  } catch (const json::exception& e) {
    fail("encoder_json", "a JSON object of token -> integer id",
         std::string(e.what()) + " in '" + encoder_json + "'");
  }
}

Tokenizer Tokenizer::from_data(const TokenizerData& d) {
  if (d.model != "gpt2") {
    fail("model", "\"gpt2\" (byte-level BPE)", "'" + d.model + "'", TESSEL_ERROR_UNSUPPORTED);
  }
  if (!d.token_types.empty() && d.token_types.size() != d.tokens.size()) {
    fail("token_types", std::to_string(d.tokens.size()) + " entries (one per token)",
         std::to_string(d.token_types.size()));
  }
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->pre = pre_from_name(d.pre);
  // llama.cpp's llama-bpe vocabularies come from Llama-3's tokenizer.json (ignore_merges).
  impl->ignore_merges = impl->pre == PreTokenizer::kLlama3;
  impl->nfc = impl->pre == PreTokenizer::kQwen2;
  impl->vocab.reserve(d.tokens.size() * 2);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const int32_t type = d.token_types.empty() ? 1 : d.token_types[i];
    if (type == 3 || type == 4) {  // control / user-defined: matched in the text as added tokens
      impl->add_added({byte_level_to_raw(d.tokens[i]), static_cast<int32_t>(i), type == 3, false,
                       false, false});
    } else {
      impl->add_vocab(d.tokens[i], static_cast<int32_t>(i));
    }
  }
  impl->merges.reserve(d.merges.size() * 2);
  for (size_t rank = 0; rank < d.merges.size(); ++rank) {
    const std::string& s = d.merges[rank];
    const size_t sp = s.find(' ');
    if (sp == std::string::npos) fail("merges", "\"a b\" pairs", "'" + s + "'");
    impl->add_merge(std::string_view(s).substr(0, sp), std::string_view(s).substr(sp + 1),
                    static_cast<int32_t>(rank));
  }
  impl->bos = d.bos_id;
  impl->eos = d.eos_id;
  impl->eos_list = d.eos_ids;
  impl->add_bos = d.add_bos;
  impl->chat_template = d.chat_template;
  impl->finish();
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_raw.size())
      continue;  // as HF: unknown ids vanish
    if (skip_special && impl_->special[id]) continue;
    bytes += impl_->id_to_raw[id];
  }
  return unicode::utf8_lossy(bytes);
}

std::string Tokenizer::decode_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_raw.size()) return "";
  return impl_->id_to_raw[id];
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  switch (impl_->chat) {
    case ChatFormat::kLlama3: return impl_->render_llama3(messages, add_generation_prompt);
    case ChatFormat::kChatML: return impl_->render_chatml(messages, add_generation_prompt);
    case ChatFormat::kPlain: break;
  }
  return impl_->render_plain(messages, add_generation_prompt);
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
const std::vector<int32_t>& Tokenizer::eos_ids() const { return impl_->eos_list; }
size_t Tokenizer::vocab_size() const { return impl_->id_to_raw.size(); }
PreTokenizer Tokenizer::pre_tokenizer() const { return impl_->pre; }
ChatFormat Tokenizer::chat_format() const { return impl_->chat; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
int32_t Tokenizer::token_id(std::string_view raw_token) const {
  for (const auto& t : impl_->added) {
    if (t.content == raw_token) return t.id;
  }
  return impl_->vocab.find(raw_token);
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> words;
  impl_->split_words(text, [&](size_t b, size_t e) { words.emplace_back(text.substr(b, e - b)); });
  return words;
}

}  // namespace tessel::llm
