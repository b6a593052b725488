// tessel tensor view, owning device buffer and error type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "tessel/status.h"

namespace tessel {

enum class DType : int32_t {
  f32 = TESSEL_F32,
  f16 = TESSEL_F16,
  bf16 = TESSEL_BF16,
  f8_e4m3 = TESSEL_F8_E4M3,
  f8_e5m2 = TESSEL_F8_E5M2,
  i32 = TESSEL_I32,
  i64 = TESSEL_I64,
  u8 = TESSEL_U8,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

enum class DeviceKind : int32_t { cpu = TESSEL_CPU, cuda = TESSEL_CUDA };

struct Device {
  DeviceKind kind = DeviceKind::cuda;
  int index = 0;
};

constexpr int kMaxDims = TESSEL_MAX_DIMS;

// A non-owning view: pointer, dtype, shape and strides (in elements), device.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  Device device{};

  // A dense row-major view of `data`.
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                           Device device = {});
  static Tensor contiguous(void* data, DType dtype, int ndim, const int64_t* shape,
                           Device device = {});

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  bool is_contiguous() const;
  std::string shape_string() const;  // "(16384, 4096)"
};

// Every failing tessel call throws this; the C ABI turns it into a status code.
class Error : public std::runtime_error {
 public:
  Error(tessel_status_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  tessel_status_t code() const { return code_; }

 private:
  tessel_status_t code_;
};

// Owning device allocation (cudaMalloc / cudaFree), movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // A dense view over the buffer; throws if the shape needs more bytes than it holds.
  Tensor view(DType dtype, std::initializer_list<int64_t> shape) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Number of CUDA devices, 0 when there is no driver or no GPU (never throws).
int cuda_device_count();

}  // namespace tessel
