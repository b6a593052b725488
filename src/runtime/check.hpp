// Argument validation shared by every op. Checks run in this order, all before any launch:
// dtype, rank/shape, strides, alignment; then (for non-empty tensors) device-pointer checks.
#pragma once

#include <initializer_list>
#include <string>

#include "tessel/tensor.hpp"

namespace tessel::detail {

[[noreturn]] void throw_cuda(cudaError_t err, const char* what);

#define TESSEL_CUDA_CHECK(expr)                                   \
  do {                                                            \
    cudaError_t tessel_err_ = (expr);                             \
    if (tessel_err_ != cudaSuccess) ::tessel::detail::throw_cuda(tessel_err_, #expr); \
  } while (0)

// Rows view of a tensor whose last axis is contiguous and whose leading axes collapse
// into one uniform row pitch.
struct Rows {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t pitch = 0;  // elements between consecutive rows
};

class OpCheck {
 public:
  explicit OpCheck(const char* op) : op_(op) {}

  [[noreturn]] void fail(const char* arg, const std::string& expected,
                         const std::string& got) const;

  void dtype_in(const char* arg, const Tensor& t, std::initializer_list<DType> allowed) const;
  void same_dtype(const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref) const;
  void same_shape(const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref) const;
  void rank_in(const char* arg, const Tensor& t, int lo, int hi) const;
  void valid_layout(const char* arg, const Tensor& t) const;  // ndim, non-negative sizes
  void contiguous(const char* arg, const Tensor& t) const;
  Rows rows(const char* arg, const Tensor& t) const;  // last axis contiguous, uniform pitch
  // Data pointer aligned to the element size, on a CUDA device (not host memory) that is
  // the current device. Skipped for empty tensors.
  void device_pointer(const char* arg, const Tensor& t) const;

  const char* op() const { return op_; }

 private:
  const char* op_;
};

std::string dims_string(const Tensor& t);

// True if p is aligned to `bytes`.
inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int current_sm_count();

}  // namespace tessel::detail
