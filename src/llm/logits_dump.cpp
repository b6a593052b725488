#include "llm/logits_dump.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

#include "tessel/tensor.hpp"

namespace tessel::llm {

namespace {
[[noreturn]] void fail(const std::string& what, const std::string& expected,
                       const std::string& got) {
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              "tessel::run: '" + what + "' expected " + expected + ", got " + got);
}
}  // namespace

std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab_size) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    const size_t first = item.find_first_not_of(" \t");
    const size_t last = item.find_last_not_of(" \t");
    item = first == std::string::npos ? "" : item.substr(first, last - first + 1);
    if (item.empty() && end == text.size() && !ids.empty()) break;  // trailing comma
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || errno == ERANGE)
      fail("prompt-ids", "comma-separated integers", "'" + item + "' in '" + text + "'");
    if (v < 0 || v >= vocab_size)
      fail("prompt-ids", "ids in [0, " + std::to_string(vocab_size) + ")", std::to_string(v));
    ids.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return ids;
}

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   std::span<const float> data) {
  int64_t n = 1;
  std::string dims;
  for (int64_t d : shape) {
    n *= d;
    dims += std::to_string(d) + ", ";
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // "(3,)" keeps its comma, "(2, 3)" not
  if (n != static_cast<int64_t>(data.size()))
    fail("logits", std::to_string(n) + " values for the shape", std::to_string(data.size()));
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64
  // and ended by '\n' (NPY 1.0).
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("dump-logits", "a writable file", "'" + path + "': " + std::strerror(errno));
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  static_assert(std::numeric_limits<float>::is_iec559);
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) fail("dump-logits", "a writable file", "a write error on '" + path + "'");
}

LogitsRecorder::LogitsRecorder(size_t sequences, int64_t vocab_size)
    : vocab_(vocab_size), rows_(sequences) {}

void LogitsRecorder::record(size_t sequence, std::span<const float> logits) {
  if (sequence >= rows_.size() || static_cast<int64_t>(logits.size()) != vocab_)
    fail(
        "logits",
        "sequence < " + std::to_string(rows_.size()) + " and " + std::to_string(vocab_) + " values",
        "sequence " + std::to_string(sequence) + " and " + std::to_string(logits.size()));
  rows_[sequence].insert(rows_[sequence].end(), logits.begin(), logits.end());
}

int64_t LogitsRecorder::steps(size_t sequence) const {
  return static_cast<int64_t>(rows_.at(sequence).size()) / vocab_;
}

void LogitsRecorder::write_npy(const std::string& path) const {
  int64_t max_steps = 0;
  for (size_t i = 0; i < rows_.size(); ++i) max_steps = std::max(max_steps, steps(i));
  const size_t per_seq = static_cast<size_t>(max_steps * vocab_);
  std::vector<float> all(rows_.size() * per_seq, std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < rows_.size(); ++i)
    std::copy(rows_[i].begin(), rows_[i].end(), all.begin() + static_cast<ptrdiff_t>(i * per_seq));
  write_npy_f32(path, {static_cast<int64_t>(rows_.size()), max_steps, vocab_}, all);
}

}  // namespace tessel::llm
