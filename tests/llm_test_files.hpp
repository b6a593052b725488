// Writers of small GGUF and safetensors images for the engine's CPU tests (tests/test_llm_*.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace tessel::test {

inline void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}
template <class T>
void put(std::vector<uint8_t>& b, T v) {
  put_bytes(b, &v, sizeof v);
}
inline void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  put_bytes(b, s.data(), s.size());
}

// Builds a GGUF v3 image: metadata entries are written verbatim (value type + payload), tensor
// data is padded to the alignment, and the last tensor ends exactly at the end of the file.
class GgufBuilder {
 public:
  void kv_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& payload) {
    put_str(kv_, key);
    put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), payload.begin(), payload.end());
    ++n_kv_;
  }
  void kv_u32(const std::string& key, uint32_t v) { kv_raw(key, 4, bytes_of(v)); }
  void kv_i32(const std::string& key, int32_t v) { kv_raw(key, 5, bytes_of(v)); }
  void kv_f32(const std::string& key, float v) { kv_raw(key, 6, bytes_of(v)); }
  void kv_bool(const std::string& key, bool v) { kv_raw(key, 7, {static_cast<uint8_t>(v)}); }
  void kv_str(const std::string& key, const std::string& v) {
    std::vector<uint8_t> p;
    put_str(p, v);
    kv_raw(key, 8, p);
  }
  void kv_strs(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> p;
    put<uint32_t>(p, 8);
    put<uint64_t>(p, v.size());
    for (const auto& s : v) put_str(p, s);
    kv_raw(key, 9, p);
  }
  void kv_i32s(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<uint8_t> p;
    put<uint32_t>(p, 5);
    put<uint64_t>(p, v.size());
    for (int32_t x : v) put(p, x);
    kv_raw(key, 9, p);
  }
  // ne in ggml order (ne[0] contiguous); data already encoded in `type`.
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
              std::vector<uint8_t> data) {
    tensors_.push_back({name, std::move(ne), type, std::move(data)});
  }
  std::vector<uint8_t> build(uint32_t alignment = 32) const {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 0x46554747u);
    put<uint32_t>(b, 3);
    put<uint64_t>(b, tensors_.size());
    put<uint64_t>(b, n_kv_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (const auto& t : tensors_) {
      offs.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      put_str(b, t.name);
      put<uint32_t>(b, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) put(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, offs[i]);
    }
    while (b.size() % alignment) b.push_back(0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      b.insert(b.end(), tensors_[i].data.begin(), tensors_[i].data.end());
      if (i + 1 < tensors_.size())
        while (b.size() % alignment) b.push_back(0);
    }
    return b;
  }

 private:
  template <class T>
  static std::vector<uint8_t> bytes_of(T v) {
    std::vector<uint8_t> p;
    put(p, v);
    return p;
  }
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// float -> IEEE half (round to nearest even), normal range only (test data stays there).
inline uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}

// A safetensors image: tensors as (name, dtype, shape, raw bytes).
struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};
inline std::vector<uint8_t> build_safetensors(const std::vector<StTensor>& ts) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t off = 0;
  for (const auto& t : ts) {
    header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i)
      header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(off) + "," +
              std::to_string(off + t.data.size()) + "]}";
    off += t.data.size();
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::vector<uint8_t> b;
  put<uint64_t>(b, header.size());
  put_bytes(b, header.data(), header.size());
  for (const auto& t : ts) b.insert(b.end(), t.data.begin(), t.data.end());
  return b;
}

}  // namespace tessel::test
