#include <cuda_runtime_api.h>

#include <mutex>
#include <sstream>
#include <vector>

#include "runtime/check.hpp"
#include "tessel/ops.hpp"
#include "tessel/tensor.hpp"

namespace tessel {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f8_e4m3: return 1;
    case DType::f8_e5m2: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f8_e4m3: return "f8_e4m3";
    case DType::f8_e5m2: return "f8_e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "unknown";
}

Tensor Tensor::contiguous(void* data, DType dtype, int ndim, const int64_t* shape, Device device) {
  if (ndim < 0 || ndim > kMaxDims)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::Tensor: ndim: expected 0.." + std::to_string(kMaxDims) + ", got " +
                    std::to_string(ndim));
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  t.device = device;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d] > 0 ? shape[d] : 1;
  }
  return t;
}

Tensor Tensor::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                          Device device) {
  std::vector<int64_t> dims(shape);
  return contiguous(data, dtype, static_cast<int>(dims.size()), dims.data(), device);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // nothing to lay out
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string Tensor::shape_string() const { return detail::dims_string(*this); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaMalloc(&data_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    data_ = nullptr;
    bytes_ = 0;
    throw Error(err == cudaErrorMemoryAllocation ? TESSEL_ERROR_OUT_OF_MEMORY : TESSEL_ERROR_CUDA,
                "tessel::DeviceBuffer: cudaMalloc(" + std::to_string(bytes) +
                    " bytes) failed: " + cudaGetErrorString(err));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Tensor DeviceBuffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t = Tensor::contiguous(data_, dtype, shape);
  if (t.nbytes() > bytes_)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::DeviceBuffer::view: shape " + t.shape_string() + " of " +
                    dtype_name(dtype) + " needs " + std::to_string(t.nbytes()) +
                    " bytes, buffer holds " + std::to_string(bytes_));
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) t.device.index = dev;
  return t;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

const char* version() { return TESSEL_VERSION_STRING; }

namespace detail {

void throw_cuda(cudaError_t err, const char* what) {
  cudaGetLastError();
  tessel_status_t code = TESSEL_ERROR_CUDA;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) code = TESSEL_ERROR_NO_DEVICE;
  if (err == cudaErrorMemoryAllocation) code = TESSEL_ERROR_OUT_OF_MEMORY;
  throw Error(code, std::string("tessel: CUDA call ") + what + " failed: " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

std::string dims_string(const Tensor& t) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < t.ndim; ++d) os << (d ? ", " : "") << t.shape[d];
  if (t.ndim == 1) os << ',';
  os << ')';
  return os.str();
}

static std::string strides_string(const Tensor& t) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < t.ndim; ++d) os << (d ? ", " : "") << t.strides[d];
  os << ')';
  return os.str();
}

void OpCheck::fail(const char* arg, const std::string& expected, const std::string& got) const {
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT, std::string("tessel::") + op_ + ": argument '" +
                                                 arg + "': expected " + expected + ", got " + got);
}

void OpCheck::valid_layout(const char* arg, const Tensor& t) const {
  if (t.ndim < 0 || t.ndim > kMaxDims)
    fail(arg, "ndim in 0.." + std::to_string(kMaxDims), std::to_string(t.ndim));
  if (static_cast<int>(t.dtype) < 0 || static_cast<int>(t.dtype) > static_cast<int>(DType::u8))
    fail(arg, "a known dtype", "dtype code " + std::to_string(static_cast<int>(t.dtype)));
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0) fail(arg, "non-negative sizes", "shape " + dims_string(t));
}

void OpCheck::dtype_in(const char* arg, const Tensor& t, std::initializer_list<DType> allowed) const {
  valid_layout(arg, t);
  for (DType d : allowed)
    if (d == t.dtype) return;
  std::string list;
  for (DType d : allowed) list += (list.empty() ? "" : "/") + std::string(dtype_name(d));
  fail(arg, "dtype " + list, dtype_name(t.dtype));
}

void OpCheck::same_dtype(const char* arg, const Tensor& t, const char* ref_arg,
                         const Tensor& ref) const {
  if (t.dtype != ref.dtype)
    fail(arg, std::string("dtype ") + dtype_name(ref.dtype) + " (same as '" + ref_arg + "')",
         dtype_name(t.dtype));
}

void OpCheck::same_shape(const char* arg, const Tensor& t, const char* ref_arg,
                         const Tensor& ref) const {
  bool same = t.ndim == ref.ndim;
  for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == ref.shape[d];
  if (!same)
    fail(arg, "shape " + dims_string(ref) + " (same as '" + ref_arg + "')",
         "shape " + dims_string(t));
}

void OpCheck::rank_in(const char* arg, const Tensor& t, int lo, int hi) const {
  if (t.ndim < lo || t.ndim > hi)
    fail(arg, lo == hi ? std::to_string(lo) + "-D tensor"
                       : std::to_string(lo) + "-D to " + std::to_string(hi) + "-D tensor",
         std::to_string(t.ndim) + "-D tensor of shape " + dims_string(t));
}

void OpCheck::contiguous(const char* arg, const Tensor& t) const {
  if (!t.is_contiguous())
    fail(arg, "contiguous (row-major) strides",
         "strides " + strides_string(t) + " for shape " + dims_string(t));
}

Rows OpCheck::rows(const char* arg, const Tensor& t) const {
  Rows r;
  if (t.ndim == 0) {
    r.rows = 1;
    r.cols = 1;
    r.pitch = 1;
    return r;
  }
  r.cols = t.shape[t.ndim - 1];
  r.rows = 1;
  for (int d = 0; d < t.ndim - 1; ++d) r.rows *= t.shape[d];
  if (r.rows * r.cols == 0) {  // empty: any strides describe it
    r.pitch = r.cols;
    return r;
  }
  if (r.cols > 1 && t.strides[t.ndim - 1] != 1)
    fail(arg, "unit stride on the last axis", "strides " + strides_string(t));
  // Leading axes must collapse to one pitch: stride[d] == stride[d+1] * shape[d+1].
  int64_t pitch = r.cols;
  bool have_pitch = false;
  for (int d = t.ndim - 2; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (!have_pitch) {
      pitch = t.strides[d];
      have_pitch = true;
      int64_t inner = 1;
      for (int e = d + 1; e < t.ndim - 1; ++e) inner *= t.shape[e];
      if (inner != 1) {
        // Axes between d and the last must be size 1 for a single pitch.
        fail(arg, "leading axes that collapse to one row pitch", "strides " + strides_string(t));
      }
      if (pitch < r.cols)
        fail(arg, "row pitch >= " + std::to_string(r.cols), "strides " + strides_string(t));
    } else {
      int64_t expect = pitch;
      for (int e = d + 1; e < t.ndim - 1; ++e) expect *= t.shape[e];
      if (t.strides[d] != expect)
        fail(arg, "leading axes that collapse to one row pitch", "strides " + strides_string(t));
    }
  }
  r.pitch = have_pitch ? pitch : r.cols;
  return r;
}

void OpCheck::device_pointer(const char* arg, const Tensor& t) const {
  if (t.numel() == 0) return;
  if (t.device.kind != DeviceKind::cuda)
    fail(arg, "a CUDA tensor", "a tensor marked as CPU memory");
  if (t.data == nullptr) fail(arg, "a device pointer", "a null pointer");
  if (!aligned(t.data, dtype_size(t.dtype)))
    fail(arg, "a pointer aligned to " + std::to_string(dtype_size(t.dtype)) + " bytes for " +
                  dtype_name(t.dtype),
         "a misaligned pointer");
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, t.data);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
      throw Error(TESSEL_ERROR_NO_DEVICE,
                  std::string("tessel::") + op_ + ": no CUDA GPU found (" +
                      cudaGetErrorString(err) + ")");
    fail(arg, "a CUDA device pointer", std::string("an unknown pointer (") +
                                           cudaGetErrorString(err) + ")");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    fail(arg, "a CUDA device pointer",
         attr.type == cudaMemoryTypeHost ? "a pinned host pointer" : "a host pointer");
  int current = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&current));
  if (attr.type == cudaMemoryTypeDevice && attr.device != current)
    fail(arg, "memory on the current device " + std::to_string(current),
         "memory on device " + std::to_string(attr.device));
}

int current_sm_count() {
  static std::mutex mu;
  static std::vector<int> counts;
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(counts.size()) <= dev) counts.resize(dev + 1, 0);
  if (counts[dev] == 0)
    TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev));
  return counts[dev];
}

}  // namespace detail
}  // namespace tessel
