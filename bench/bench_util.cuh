// Device helpers for bench suites: an owning buffer, hash-based random fills and an
// element-wise comparison kernel. Header-only (templates), CUDA translation units only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "harness.hpp"

namespace tessel::bench {

// cudaMalloc'd bytes, freed on destruction.
class DeviceMem {
 public:
  DeviceMem() = default;
  explicit DeviceMem(size_t bytes) : bytes_(bytes) {
    if (bytes) TESSEL_BENCH_CUDA(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceMem() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceMem(DeviceMem&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- conversions ---------------------------------------------------------------------

template <class T>
__host__ __device__ inline float to_f32(T v) {
  return static_cast<float>(v);
}
template <>
__host__ __device__ inline float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__host__ __device__ inline float to_f32<__half>(__half v) {
  return __half2float(v);
}

template <class T>
__host__ __device__ inline T from_f32(float v) {
  return static_cast<T>(v);
}
template <>
__host__ __device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__host__ __device__ inline __half from_f32<__half>(float v) {
  return __float2half(v);
}

// ---- hash-based random fill ------------------------------------------------------------

__host__ __device__ inline uint32_t hash_u32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform in [0, 1) from (seed, index).
__host__ __device__ inline float hash_unit(uint32_t seed, uint64_t i) {
  return static_cast<float>(hash_u32(i * 0x9E3779B97F4A7C15ULL + seed) >> 8) * (1.0f / 16777216.0f);
}

template <class T>
__global__ void fill_uniform_kernel(T* p, size_t n, uint32_t seed, float lo, float hi) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = from_f32<T>(lo + (hi - lo) * hash_unit(seed, i));
}

template <class T>
__global__ void fill_bits_kernel(T* p, size_t n, uint32_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = static_cast<T>(hash_u32(i * 0x9E3779B97F4A7C15ULL + seed));
}

inline unsigned fill_grid(size_t n) {
  const size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 8192 ? (blocks ? blocks : 1) : 8192);
}

// p[i] = lo + (hi - lo) * u(seed, i), rounded to T.
template <class T>
void fill_uniform(T* p, size_t n, uint32_t seed, float lo, float hi, cudaStream_t stream) {
  if (!n) return;
  fill_uniform_kernel<T><<<fill_grid(n), 256, 0, stream>>>(p, n, seed, lo, hi);
  TESSEL_BENCH_CUDA(cudaGetLastError());
}

// Random bits in every byte of [p, p + bytes); bytes must be a multiple of 4.
inline void fill_bits(void* p, size_t bytes, uint32_t seed, cudaStream_t stream) {
  const size_t n = bytes / 4;
  if (!n) return;
  fill_bits_kernel<uint32_t><<<fill_grid(n), 256, 0, stream>>>(static_cast<uint32_t*>(p), n, seed);
  TESSEL_BENCH_CUDA(cudaGetLastError());
}

// ---- comparison --------------------------------------------------------------------------

struct CompareStats {
  unsigned long long bad;        // elements outside atol + rtol * |ref| (NaN mismatch counts)
  unsigned int max_err_bits;     // max |ours - ref| as float bits (non-negative floats order)
  unsigned long long first_bad;  // smallest bad index, ~0 if none
};

template <class T>
__global__ void compare_kernel(const T* ours, const T* ref, size_t n, float atol, float rtol,
                               CompareStats* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0, first = ~0ULL;
  float max_err = 0.f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float a = to_f32(ours[i]);
    const float b = to_f32(ref[i]);
    const bool an = isnan(a), bn = isnan(b);
    const float err = fabsf(a - b);
    const bool ok = (an && bn) || (!an && !bn && (a == b || err <= atol + rtol * fabsf(b)));
    if (!ok) {
      ++bad;
      if (i < first) first = i;
    }
    if (!an && !bn && err > max_err) max_err = err;
  }
  if (bad) {
    atomicAdd(&out->bad, bad);
    atomicMin(&out->first_bad, first);
  }
  atomicMax(&out->max_err_bits, __float_as_uint(max_err));
}

struct CompareResult {
  bool ok = true;
  unsigned long long bad = 0;
  float max_err = 0.f;
  unsigned long long first_bad = ~0ULL;
  std::string note;  // appended to detail()
  std::string detail() const {
    char buf[48];
    std::snprintf(buf, sizeof buf, "max_abs_err=%.3g", static_cast<double>(max_err));
    std::string s = buf;
    if (bad) s += " mismatches=" + std::to_string(bad) + " first=" + std::to_string(first_bad);
    return s + note;
  }
};

// Compares n elements of ours against ref on the device (synchronizes `stream`).
template <class T>
CompareResult compare_device(const T* ours, const T* ref, size_t n, float atol, float rtol,
                             cudaStream_t stream) {
  DeviceMem stats(sizeof(CompareStats));
  CompareStats h{0, 0, ~0ULL};
  TESSEL_BENCH_CUDA(cudaMemcpyAsync(stats.get(), &h, sizeof h, cudaMemcpyHostToDevice, stream));
  compare_kernel<T>
      <<<fill_grid(n), 256, 0, stream>>>(ours, ref, n, atol, rtol, stats.as<CompareStats>());
  TESSEL_BENCH_CUDA(cudaGetLastError());
  TESSEL_BENCH_CUDA(cudaMemcpyAsync(&h, stats.get(), sizeof h, cudaMemcpyDeviceToHost, stream));
  TESSEL_BENCH_CUDA(cudaStreamSynchronize(stream));
  CompareResult r;
  r.bad = h.bad;
  std::memcpy(&r.max_err, &h.max_err_bits, sizeof r.max_err);
  r.first_bad = h.first_bad;
  r.ok = h.bad == 0;
  return r;
}

}  // namespace tessel::bench
