// GGUF v2/v3 reader (the llama.cpp model format): metadata of every value type, tensor infos,
// alignment, and dequantization of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K to float32.
// The file is memory-mapped; every offset and count is checked against the file size, so a
// malformed or truncated file throws tessel::Error ("tessel::gguf: ...") instead of crashing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llm/file_util.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"

namespace tessel::llm {

enum class GgufValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType elem_type = GgufValueType::u8;  // arrays only
  uint64_t u = 0;                               // unsigned integers and bool
  int64_t i = 0;                                // signed integers
  double f = 0;                                 // floats
  std::string s;
  std::vector<GgufValue> items;  // arrays

  bool is_integer() const;
  bool is_number() const;
  int64_t as_int() const;    // any integer or bool
  double as_double() const;  // any number
};

// ggml tensor types this reader knows the layout of (values as in ggml.h).
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};
const char* ggml_type_name(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the contiguous dimension
  uint32_t type = 0;
  uint64_t offset = 0;  // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;
};

class GgufFile : public WeightSource {
 public:
  explicit GgufFile(const std::string& path);
  // Parses an in-memory image (tests); `bytes` must outlive the object.
  static GgufFile from_memory(const uint8_t* bytes, size_t size, const std::string& label);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufValue* find(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback = "") const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  const GgufTensorInfo* tensor(const std::string& name) const;
  std::string architecture() const { return get_string("general.architecture"); }

  // tokenizer.ggml.* as the tokenizer's plain data.
  TokenizerData tokenizer_data() const;

  bool has(const std::string& name) const override { return tensor(name) != nullptr; }
  std::vector<int64_t> shape(const std::string& name) const override;
  HostTensor load(const std::string& name) const override;
  std::vector<std::string> names() const override;

 private:
  GgufFile() = default;
  void parse(const uint8_t* bytes, size_t size);

  MappedFile file_;
  std::string label_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// Dequantizes `n` elements of ggml type `type` from `src` to `dst` (n a multiple of the
// type's block size). Throws for types without a dequantizer.
void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n);
// Block size (elements) and bytes per block of a ggml type; {0, 0} if unknown.
struct GgmlBlock {
  int64_t elems;
  int64_t bytes;
};
GgmlBlock ggml_block(uint32_t type);

}  // namespace tessel::llm
