// Tensor views over fake, never-dereferenced device addresses, for CPU tests of argument
// validation (every check that does not need a device runs before any pointer is touched).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "tessel/tensor.hpp"

namespace tessel::fake_args {

// Distinct, 256-byte aligned, never dereferenced.
inline void* fake(int i) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(0x100000 + 0x1000 * i));
}

// Dense view of fake(i).
inline Tensor T(DType dtype, std::initializer_list<int64_t> shape, int i = 0) {
  return Tensor::contiguous(fake(i), dtype, shape);
}

// A view of fake(i) with explicit strides.
inline Tensor S(DType dtype, std::initializer_list<int64_t> shape,
                std::initializer_list<int64_t> strides, int i = 0) {
  Tensor t = Tensor::contiguous(fake(i), dtype, shape);
  int d = 0;
  for (int64_t s : strides) t.strides[d++] = s;
  return t;
}

// The same view, marked as CPU memory.
inline Tensor on_cpu(Tensor t) {
  t.device = Device{DeviceKind::cpu, 0};
  return t;
}

}  // namespace tessel::fake_args
