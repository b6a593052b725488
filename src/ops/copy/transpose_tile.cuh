// Vectorized tile transpose shared by transpose (2-D) and transpose_batched (3-D). A block of
// 256 threads owns a (RG·V x CG·V) source tile, V = 16 / element bytes, RG · CG = 256: thread
// (rg, cg) loads the VxV micro-tile at source rows rg·V.., cols cg·V.. as V 16-byte row vectors
// and transposes it in registers; the V column vectors go to a shared-memory tile laid out as
// destination rows of RG·16 bytes, 16-byte chunks XOR-swizzled so both the scattered writes
// and the row reads are conflict-free; the block then writes whole RG·16-byte destination row
// segments. Needs 16-byte aligned bases, pitches and batch strides.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cute/swizzle.hpp>

#include "ops/rows.cuh"
#include "runtime/check.hpp"  // current_sm_count

namespace tessel::detail {

constexpr int kTransposeThreads = 256;

template <class U, int RG>
struct MicroTile {
  static constexpr int V = 16 / sizeof(U);
  static constexpr int kRowGroups = RG;                      // V-row groups (chunks per dst row)
  static constexpr int kColGroups = kTransposeThreads / RG;  // V-column groups
  static constexpr int kRows = RG * V;                       // source rows per tile
  static constexpr int kCols = kColGroups * V;               // source cols per tile (= dst rows)
  static constexpr int kRowBytes = RG * 16;                  // a destination row in smem
  static constexpr int kLogV = V == 2 ? 1 : V == 4 ? 2 : 3;
  static constexpr int kLogRG = RG == 8 ? 3 : RG == 16 ? 4 : 5;
  static_assert(RG == 8 || RG == 16 || RG == 32, "8, 16 or 32 row groups");
  // Byte offset of 16-byte chunk `chunk` of smem dst row `row`: the chunk's low 3 bits are
  // XOR-ed with bits (row / V) % 8, which differ across the 8 lanes of a quarter warp that
  // write one chunk column (consecutive cg).
  using Swizzle = cute::Swizzle<3, 4, kLogRG + kLogV>;
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return Swizzle{}(row * kRowBytes + chunk * 16);
  }
};

// 16-bit elements: the 8x8 micro-tile stays packed, two elements per 32-bit word (w[k][m]
// holds source row k, columns 2m and 2m + 1), and is transposed with byte permutes: column
// 2m + h of rows 2i and 2i + 1 is one PRMT of w[2i][m] and w[2i + 1][m]. As Frag<uint16_t, 8>
// values each element took its own register: 80 registers and a 16-byte spill at 3 CTAs per SM.
struct Packed16x8 {
  uint32_t w[8][4];
  __device__ __forceinline__ void load(const uint16_t* src, int64_t pitch, int64_t r0, int64_t c0) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint4 q = *reinterpret_cast<const uint4*>(src + (r0 + k) * pitch + c0);
      w[k][0] = q.x, w[k][1] = q.y, w[k][2] = q.z, w[k][3] = q.w;
    }
  }
  // Column j of the micro-tile (rows 0..7) as one 16-byte vector.
  __device__ __forceinline__ uint4 column(int j) const {
    const int m = j / 2;
    const uint32_t sel = j % 2 == 0 ? 0x5410u : 0x7632u;
    return make_uint4(__byte_perm(w[0][m], w[1][m], sel), __byte_perm(w[2][m], w[3][m], sel),
                      __byte_perm(w[4][m], w[5][m], sel), __byte_perm(w[6][m], w[7][m], sel));
  }
};

// 16-bit tiles: 64 registers (Packed16x8; 8 bytes of spill, offsets reloaded once per tile), 4
// CTAs per SM. H200, three rounds against the Frag version (80 registers, 3 CTAs per SM):
// 2-D 16384x8192 bf16 0.914-0.927 -> 0.946-0.948 of copy, batched (32, 4096, 1024) 0.881-0.907
// -> 0.958-0.960; 5 CTAs per SM (48 registers, 28 bytes of spill reloaded in the store loop)
// 0.873-0.877 / 0.882-0.885 (docs/loss_optim.md, session 33). 4- and 8-byte types: 3 CTAs.
template <class U>
constexpr int transpose_min_blocks() {
  return sizeof(U) == 2 ? 4 : 3;
}

template <class U, int RG>
__global__ void __launch_bounds__(kTransposeThreads, transpose_min_blocks<U>())
    transpose_tile_kernel(const U* __restrict__ src_all, U* __restrict__ dst_all, int64_t rows,
                          int64_t cols, int64_t src_pitch, int64_t dst_pitch, int64_t row_tiles,
                          int64_t col_tiles, int64_t src_batch_stride, int64_t dst_batch_stride,
                          int64_t batches, int col_major) {
  using namespace tessel::tile;
  using MT = MicroTile<U, RG>;
  constexpr int V = MT::V;
  __shared__ alignas(128) uint8_t smem[MT::kCols * MT::kRowBytes];
  const int rg = threadIdx.x / MT::kColGroups, cg = threadIdx.x % MT::kColGroups;
  const int64_t tiles = row_tiles * col_tiles;
  // tiles: per batch; the grid strides over batches x tiles.
  for (int64_t bt = blockIdx.x; bt < batches * tiles; bt += gridDim.x) {
    const int64_t batch = batches == 1 ? 0 : bt / tiles, t = bt - batch * tiles;
    const U* src = src_all + batch * src_batch_stride;
    U* dst = dst_all + batch * dst_batch_stride;
    // col_major: consecutive blocks walk down the source rows (so together they write whole
    // destination rows) instead of across the columns.
    const int64_t ti = col_major ? t % row_tiles : t / col_tiles;
    const int64_t tj = col_major ? t / row_tiles : t % col_tiles;
    const int64_t tr = ti * MT::kRows, tc = tj * MT::kCols;
    const int64_t r0 = tr + rg * V, c0 = tc + cg * V;
    // 1-2. The V×V micro-tile at (r0, c0), transposed into the swizzled destination tile:
    // source column j goes to smem row cg·V + j, chunk rg.
    if (r0 + V <= rows && c0 + V <= cols) {
      if constexpr (sizeof(U) == 2) {
        Packed16x8 in;
        in.load(src, src_pitch, r0, c0);
#pragma unroll
        for (int j = 0; j < V; ++j)
          *reinterpret_cast<uint4*>(smem + MT::offset(cg * V + j, rg)) = in.column(j);
      } else {
        Frag<U, V> in[V];
#pragma unroll
        for (int k = 0; k < V; ++k) in[k] = load_frag<V>(src + (r0 + k) * src_pitch + c0);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          Frag<U, V> out;
#pragma unroll
          for (int k = 0; k < V; ++k) out.v[k] = in[k].v[j];
          store_frag<V>(reinterpret_cast<U*>(smem + MT::offset(cg * V + j, rg)), out);
        }
      }
    } else {
      // Edge tiles (zeros outside the matrix): element by element into shared memory, one
      // source row per step. Unrolled, the V·V predicated loads were all kept in flight and set
      // the kernel's register count (80 and a spill for 16-bit types).
#pragma unroll 1
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j)
          reinterpret_cast<U*>(smem + MT::offset(cg * V + j, rg))[k] =
              r0 + k < rows && c0 + j < cols ? src[(r0 + k) * src_pitch + c0 + j] : U{};
    }
    __syncthreads();
    // 3. Whole destination row segments: RG chunks per row, V rows per thread.
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int q = i * kTransposeThreads + threadIdx.x;
      const int row = q / RG, chunk = q % RG;
      const int64_t dr = tc + row, dc = tr + chunk * V;
      if (dr >= cols || dc >= rows) continue;
      const Frag<U, V> f = load_frag<V>(reinterpret_cast<const U*>(smem + MT::offset(row, chunk)));
      store_frag_pred<V>(dst + dr * dst_pitch + dc, f, rows - dc);
    }
    __syncthreads();
  }
}

// dst[b] (cols, rows) = src[b] (rows, cols)ᵀ for b < batches, by the tile kernel above (16-byte
// aligned bases, pitches and batch strides; 2-, 4- or 8-byte U). The default tile is 16 row
// groups (256-byte destination segments) in column-major tile order: on the H200 the 2-D
// transpose went from 0.86 to 0.93 (bf16) and 0.87 to 0.95 (f32) of copy against 8 row groups
// in row-major order (docs/loss_optim.md, session 26). TESSEL_TRANSPOSE_TILE=RG[c] picks
// another for A/B runs: RG row groups of 8, 16 or 32, "c" for the column-major order.
// Launch errors are left for the caller's check_launch.
template <class U>
void launch_transpose_tiles(const U* src, U* dst, int64_t rows, int64_t cols, int64_t src_pitch,
                            int64_t dst_pitch, int64_t src_batch_stride, int64_t dst_batch_stride,
                            int64_t batches, cudaStream_t stream) {
  static const int mode = [] {
    const char* e = std::getenv("TESSEL_TRANSPOSE_TILE");
    if (e == nullptr || e[0] == '\0') return 16 * 2 + 1;  // the default: 16c
    int rg = std::atoi(e);
    if (rg != 16 && rg != 32) rg = 8;
    return rg * 2 + (e[std::strlen(e) - 1] == 'c' ? 1 : 0);
  }();
  const int rg = mode / 2, col_major = mode % 2;
  auto go = [&](auto kernel, int64_t tile_rows, int64_t tile_cols) {
    const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows;
    const int64_t col_tiles = (cols + tile_cols - 1) / tile_cols;
    const int64_t blocks =
        std::min<int64_t>(row_tiles * col_tiles * batches, int64_t{current_sm_count()} * 64);
    kernel<<<static_cast<unsigned>(blocks), kTransposeThreads, 0, stream>>>(
        src, dst, rows, cols, src_pitch, dst_pitch, row_tiles, col_tiles, src_batch_stride,
        dst_batch_stride, batches, col_major);
  };
  switch (rg) {
    case 16:
      go(transpose_tile_kernel<U, 16>, MicroTile<U, 16>::kRows, MicroTile<U, 16>::kCols);
      break;
    case 32:
      go(transpose_tile_kernel<U, 32>, MicroTile<U, 32>::kRows, MicroTile<U, 32>::kCols);
      break;
    default: go(transpose_tile_kernel<U, 8>, MicroTile<U, 8>::kRows, MicroTile<U, 8>::kCols); break;
  }
}

}  // namespace tessel::detail
