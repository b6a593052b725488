// Hugging Face model folders: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json. Files are memory-mapped; F32, F16 and BF16 tensors convert to
// float32 on load. Malformed headers, truncated files and bad offsets throw tessel::Error
// ("tessel::safetensors: ...").
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llm/file_util.hpp"
#include "llm/weights.hpp"

namespace tessel::llm {

struct SafetensorsEntry {
  std::string dtype;  // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  size_t file = 0;  // index into the shard list
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // Parses an in-memory image (tests); `bytes` must outlive the object.
  static SafetensorsFile from_memory(const uint8_t* bytes, size_t size, const std::string& label);
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t size);
  MappedFile file_;
  std::string label_;
  std::map<std::string, SafetensorsEntry> tensors_;
};

// All shards of a folder as one weight source.
class SafetensorsModel : public WeightSource {
 public:
  explicit SafetensorsModel(const std::string& dir);
  bool has(const std::string& name) const override { return index_.count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) const override;
  HostTensor load(const std::string& name) const override;
  std::vector<std::string> names() const override;
  const std::string& dir() const { return dir_; }

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsEntry*> index_;
};

}  // namespace tessel::llm
