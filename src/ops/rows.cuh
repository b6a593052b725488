// Row-kernel configuration shared by the row-wise ops (softmax, row sums, later the norms).
// A row of `cols` elements is held in registers by a group of THREADS threads, each holding
// ITEMS vectors of VEC elements. Rows longer than the largest register config go to the
// ops' streaming (multi-pass) kernels.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "runtime/check.hpp"
#include "tile/tile.cuh"

namespace tessel::detail {

template <int VEC_, int ITEMS_, int THREADS_>
struct RowConfig {
  static constexpr int VEC = VEC_;
  static constexpr int ITEMS = ITEMS_;
  static constexpr int THREADS = THREADS_;
  static constexpr int BLOCK = THREADS_ > 256 ? THREADS_ : 256;
  // Blocks per SM that keep a thread at <= 64 registers (1024 threads resident per SM).
  static constexpr int MIN_BLOCKS = 1024 / BLOCK;
};

// Elements each thread holds per row slice: 16 keeps a backward pass (two slices) under
// ~64 registers, so a 1024-thread group neither spills nor starves occupancy.
constexpr int kRowElemsPerThread = 16;

// Calls f(RowConfig<…>{}) with the smallest config covering `cols`; returns false when the
// row is too long for registers (> 1024 × 16 elements). vec_ok: every row is 16-byte aligned
// and cols % VEC == 0.
template <int VEC, class F>
bool dispatch_row_config(int64_t cols, bool vec_ok, F&& f) {
  if (!vec_ok) {
    if (cols <= 128) {
      f(RowConfig<1, 4, 32>{});
      return true;
    }
    return false;
  }
  constexpr int kItems = kRowElemsPerThread / VEC > 0 ? kRowElemsPerThread / VEC : 1;
  const int64_t vecs = (cols + VEC - 1) / VEC;
  if (vecs <= 32) f(RowConfig<VEC, 1, 32>{});
  else if (vecs <= 64 && kItems >= 2) f(RowConfig<VEC, 2, 32>{});
  else if (vecs <= 32 * kItems) f(RowConfig<VEC, kItems, 32>{});
  else if (vecs <= 64 * kItems) f(RowConfig<VEC, kItems, 64>{});
  else if (vecs <= 128 * kItems) f(RowConfig<VEC, kItems, 128>{});
  else if (vecs <= 256 * kItems) f(RowConfig<VEC, kItems, 256>{});
  else if (vecs <= 512 * kItems) f(RowConfig<VEC, kItems, 512>{});
  else if (vecs <= 1024 * kItems) f(RowConfig<VEC, kItems, 1024>{});
  else return false;
  return true;
}

// Like dispatch_row_config, for kernels holding rows as RowFrags (storage dtype): each thread
// keeps 4 vectors (64 bytes) per tensor in flight, whatever the dtype. Rows up to
// 1024 × 4 × VEC elements (32768 for 16-bit types, 16384 for f32).
template <int VEC, class F>
bool dispatch_row_frags(int64_t cols, bool vec_ok, F&& f) {
  if (!vec_ok) {
    if (cols <= 128) {
      f(RowConfig<1, 4, 32>{});
      return true;
    }
    return false;
  }
  const int64_t vecs = (cols + VEC - 1) / VEC;
  if (vecs <= 32) f(RowConfig<VEC, 1, 32>{});
  else if (vecs <= 64) f(RowConfig<VEC, 2, 32>{});
  else if (vecs <= 128) f(RowConfig<VEC, 4, 32>{});
  else if (vecs <= 256) f(RowConfig<VEC, 4, 64>{});
  else if (vecs <= 512) f(RowConfig<VEC, 4, 128>{});
  else if (vecs <= 1024) f(RowConfig<VEC, 4, 256>{});
  else if (vecs <= 2048) f(RowConfig<VEC, 4, 512>{});
  else if (vecs <= 4096) f(RowConfig<VEC, 4, 1024>{});
  else return false;
  return true;
}

// Grid for a register-row kernel: one group per row, groups packed BLOCK/THREADS per block.
template <class Cfg>
inline unsigned row_grid(int64_t rows) {
  constexpr int kGroups = Cfg::BLOCK / Cfg::THREADS;
  int64_t blocks = (rows + kGroups - 1) / kGroups;
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 30));
}

// Are all these row-major buffers 16-byte aligned with a pitch that keeps every row aligned?
template <class T>
inline bool rows_vectorizable(int64_t cols, std::initializer_list<std::pair<const void*, int64_t>> bufs) {
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec != 0) return false;
  for (auto [p, pitch] : bufs)
    if (!aligned(p, 16) || pitch % kVec != 0) return false;
  return true;
}

// dtype -> storage type
template <class F>
void dispatch_float_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
    default: throw Error(TESSEL_ERROR_INTERNAL, "tessel: dtype dispatch reached a non-float dtype");
  }
}

inline void check_launch(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(TESSEL_ERROR_CUDA, std::string("tessel::") + op + ": kernel launch failed: " +
                                       cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace tessel::detail
