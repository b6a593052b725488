// Shared pieces of the model-file readers: read-only memory maps and the one error format
// ("tessel::<op>: '<what>' <where>: expected <x>, got <y>") every malformed file reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessel/tensor.hpp"

namespace tessel::llm {

[[noreturn]] void file_error(const std::string& op, const std::string& what,
                             const std::string& where, const std::string& expected,
                             const std::string& got);

// A whole file mapped read-only (MAP_PRIVATE); movable, unmapped on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// IEEE half / bfloat16 bit patterns to float.
float half_to_float(uint16_t h);
inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

}  // namespace tessel::llm
