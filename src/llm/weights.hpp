// What the model loader needs from a weight file, whatever its format: tensor names, shapes
// (row-major, outermost first; a matrix is (out_features, in_features)) and float32 data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::llm {

struct HostTensor {
  std::vector<int64_t> shape;  // row-major, outermost first
  std::vector<float> data;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual std::vector<int64_t> shape(const std::string& name) const = 0;
  // Dequantized / converted to float32; throws tessel::Error naming the tensor if absent.
  virtual HostTensor load(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;
};

}  // namespace tessel::llm
