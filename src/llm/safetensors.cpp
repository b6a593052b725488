#include "llm/safetensors.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace tessel::llm {

namespace {

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

[[noreturn]] void st_error(const std::string& label, const std::string& where,
                           const std::string& expected, const std::string& got) {
  file_error("safetensors", label, where, expected, got);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path), label_(path) {
  parse(file_.data(), file_.size());
}

SafetensorsFile SafetensorsFile::from_memory(const uint8_t* bytes, size_t size,
                                             const std::string& label) {
  SafetensorsFile f;
  f.label_ = label;
  f.parse(bytes, size);
  return f;
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
  if (size < 8) st_error(label_, "(header length)", "at least 8 bytes", std::to_string(size));
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > size - 8)
    st_error(label_, "(header length)", "at most " + std::to_string(size - 8) + " (file size - 8)",
             std::to_string(header_len) + " (file truncated?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    st_error(label_, "(header)", "valid JSON", e.what());
  }
  if (!header.is_object()) st_error(label_, "(header)", "a JSON object", header.type_name());
  const uint8_t* data = bytes + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = "(tensor '" + it.key() + "')";
    const nlohmann::json& v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      st_error(label_, where, "{dtype, shape, data_offsets:[begin,end]}", v.dump().substr(0, 120));
    SafetensorsEntry e;
    e.dtype = v["dtype"].get<std::string>();
    const size_t eb = dtype_bytes(e.dtype);
    if (eb == 0) st_error(label_, where, "a safetensors dtype", e.dtype);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        st_error(label_, where, "non-negative dimensions", v["shape"].dump());
      numel *= d.get<uint64_t>();
      if (numel > (uint64_t{1} << 40)) st_error(label_, where, "< 2^40 elements", "more");
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      st_error(label_, where, "unsigned data_offsets", off.dump());
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      st_error(label_, where, "0 <= begin <= end <= " + std::to_string(data_size) + " (data size)",
               "[" + std::to_string(b) + ", " + std::to_string(en) + "] (file truncated?)");
    if (en - b != numel * eb)
      st_error(label_, where, std::to_string(numel * eb) + " bytes for its shape and dtype",
               std::to_string(en - b));
    e.data = data + b;
    e.nbytes = en - b;
    tensors_[it.key()] = std::move(e);
  }
}

SafetensorsModel::SafetensorsModel(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  std::vector<std::string> files;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      file_error("safetensors", index.string(), "", "valid JSON", e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      file_error("safetensors", index.string(), "", "a 'weight_map' object", "none");
    std::set<std::string> seen;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        file_error("safetensors", index.string(), "(weight_map['" + name + "'])", "a file name",
                   file.dump());
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else if (fs::exists(root / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    file_error("safetensors", dir, "", "model.safetensors or model.safetensors.index.json",
               "neither");
  }
  for (const std::string& f : files) {
    shards_.push_back(std::make_unique<SafetensorsFile>((root / f).string()));
    for (const auto& [name, e] : shards_.back()->tensors()) {
      if (index_.count(name))
        file_error("safetensors", (root / f).string(), "", "each tensor in one shard",
                   "'" + name + "' again");
      index_[name] = &e;
    }
  }
}

const SafetensorsEntry& SafetensorsModel::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    file_error("safetensors", dir_, "", "a tensor named '" + name + "'", "none");
  return *it->second;
}

std::vector<int64_t> SafetensorsModel::shape(const std::string& name) const {
  return entry(name).shape;
}

HostTensor SafetensorsModel::load(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  HostTensor t;
  t.shape = e.shape;
  const size_t n = static_cast<size_t>(t.numel());
  t.data.resize(n);
  if (e.dtype == "F32") {
    std::memcpy(t.data.data(), e.data, n * 4);
  } else if (e.dtype == "F16" || e.dtype == "BF16") {
    const bool bf = e.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, e.data + 2 * i, 2);
      t.data[i] = bf ? bf16_to_float(h) : half_to_float(h);
    }
  } else {
    throw Error(TESSEL_ERROR_UNSUPPORTED, "tessel::safetensors: '" + name +
                                              "' expected dtype F32, F16 or BF16, got " + e.dtype);
  }
  return t;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : index_) out.push_back(name);
  return out;
}

}  // namespace tessel::llm
