// Vectorized tile transpose shared by transpose (2-D) and transpose_batched (3-D): a block
// owns a (8V x 32V) source tile, V = 16 / element bytes. Each thread loads a VxV micro-tile as
// V 16-byte row vectors and transposes it in registers; the V column vectors go to a
// shared-memory tile laid out as destination rows of 128 bytes, 16-byte chunks XOR-swizzled so
// both the scattered writes and the row reads are conflict-free; the block then writes whole
// 128-byte destination row segments. Needs 16-byte aligned bases, pitches and batch strides.
#pragma once

#include <cute/swizzle.hpp>

#include "ops/rows.cuh"

namespace tessel::detail {

constexpr int kTransposeWarps = 8;

template <class U>
struct MicroTile {
  static constexpr int V = 16 / sizeof(U);
  static constexpr int kRows =
      kTransposeWarps * V;              // source rows per tile (= 8 chunks of a dst row)
  static constexpr int kCols = 32 * V;  // source cols per tile (= dst rows in smem)
  static constexpr int kLogV = V == 2 ? 1 : V == 4 ? 2 : 3;
  // Byte offset of 16-byte chunk `chunk` of smem dst row `row`: row r's chunks are XOR-ed
  // with bits (r / V) % 8, which differ across the 8 lanes that write one chunk column.
  using Swizzle = cute::Swizzle<3, 4, 3 + kLogV>;
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return Swizzle{}(row * 128 + chunk * 16);
  }
};

template <class U>
__global__ void __launch_bounds__(kTransposeWarps * 32, 3)
    transpose_tile_kernel(const U* __restrict__ src_all, U* __restrict__ dst_all, int64_t rows,
                          int64_t cols, int64_t src_pitch, int64_t dst_pitch, int64_t col_tiles,
                          int64_t tiles, int64_t src_batch_stride = 0, int64_t dst_batch_stride = 0,
                          int64_t batches = 1) {
  using namespace tessel::tile;
  using MT = MicroTile<U>;
  constexpr int V = MT::V;
  __shared__ alignas(128) uint8_t smem[MT::kCols * 128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // tiles: per batch; the grid strides over batches x tiles.
  for (int64_t bt = blockIdx.x; bt < batches * tiles; bt += gridDim.x) {
    const int64_t batch = batches == 1 ? 0 : bt / tiles, t = bt - batch * tiles;
    const U* src = src_all + batch * src_batch_stride;
    U* dst = dst_all + batch * dst_batch_stride;
    const int64_t tr = (t / col_tiles) * MT::kRows, tc = (t % col_tiles) * MT::kCols;
    const int64_t r0 = tr + warp * V, c0 = tc + lane * V;
    // 1. V×V micro-tile into registers (zeros outside the matrix).
    Frag<U, V> in[V];
    if (r0 + V <= rows && c0 + V <= cols) {
#pragma unroll
      for (int k = 0; k < V; ++k) in[k] = load_frag<V>(src + (r0 + k) * src_pitch + c0);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j)
          in[k].v[j] = (r0 + k < rows && c0 + j < cols) ? src[(r0 + k) * src_pitch + c0 + j] : U{};
    }
    // 2. Transposed columns into the swizzled destination tile: row lane*V + j, chunk warp.
#pragma unroll
    for (int j = 0; j < V; ++j) {
      Frag<U, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = in[k].v[j];
      store_frag<V>(reinterpret_cast<U*>(smem + MT::offset(lane * V + j, warp)), out);
    }
    __syncthreads();
    // 3. Whole destination rows: 8 chunks (128 bytes) per row, V rows per thread.
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int q = i * kTransposeWarps * 32 + threadIdx.x;
      const int row = q / 8, chunk = q % 8;
      const int64_t dr = tc + row, dc = tr + chunk * V;
      if (dr >= cols || dc >= rows) continue;
      const Frag<U, V> f = load_frag<V>(reinterpret_cast<const U*>(smem + MT::offset(row, chunk)));
      store_frag_pred<V>(dst + dr * dst_pitch + dc, f, rows - dc);
    }
    __syncthreads();
  }
}

}  // namespace tessel::detail
