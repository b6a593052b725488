// 2-D transpose, bit-exact.
// Fast path (16-byte aligned rows): the swizzled micro-tile kernel of transpose_tile.cuh.
// Anything else (misaligned rows, 1-byte types) goes through a 32×32 shared tile.
#include "ops/copy/transpose_tile.cuh"
#include "tessel/ops.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

template <class U>
__global__ void __launch_bounds__(256)
    transpose_smem_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t rows,
                          int64_t cols, int64_t src_pitch, int64_t dst_pitch, int64_t col_tiles,
                          int64_t tiles) {
  __shared__ U tile[32][33];  // +1 column: column reads hit 32 different banks (4-byte U)
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / col_tiles) * 32, c0 = (t % col_tiles) * 32;
#pragma unroll
    for (int k = ty; k < 32; k += 8)
      if (r0 + k < rows && c0 + tx < cols) tile[k][tx] = src[(r0 + k) * src_pitch + c0 + tx];
    __syncthreads();
#pragma unroll
    for (int k = ty; k < 32; k += 8)
      if (c0 + k < cols && r0 + tx < rows) dst[(c0 + k) * dst_pitch + r0 + tx] = tile[tx][k];
    __syncthreads();
  }
}

template <class U>
void launch(const Tensor& src, const detail::Rows& s, Tensor& dst, int64_t dst_pitch,
            cudaStream_t stream) {
  constexpr int V = 16 / sizeof(U);
  const U* sp = static_cast<const U*>(src.data);
  U* dp = static_cast<U*>(dst.data);
  const unsigned max_blocks = static_cast<unsigned>(detail::current_sm_count()) * 64;
  const bool vec_ok = sizeof(U) >= 2 && detail::aligned(sp, 16) && detail::aligned(dp, 16) &&
                      s.pitch % V == 0 && dst_pitch % V == 0;
  if constexpr (sizeof(U) >= 2) {
    if (vec_ok) {
      detail::launch_transpose_tiles<U>(sp, dp, s.rows, s.cols, s.pitch, dst_pitch, 0, 0, 1,
                                        stream);
      return;
    }
  }
  {
    const int64_t col_tiles = ceil_div(s.cols, 32);
    const int64_t tiles = ceil_div(s.rows, 32) * col_tiles;
    transpose_smem_kernel<U>
        <<<static_cast<unsigned>(std::min<int64_t>(tiles, max_blocks)), 256, 0, stream>>>(
            sp, dp, s.rows, s.cols, s.pitch, dst_pitch, col_tiles, tiles);
  }
}

}  // namespace

void transpose(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  detail::OpCheck chk("transpose");
  chk.valid_layout("src", src);
  chk.valid_layout("dst", dst);
  chk.rank_in("src", src, 2, 2);
  chk.rank_in("dst", dst, 2, 2);
  chk.same_dtype("dst", dst, "src", src);
  if (dst.shape[0] != src.shape[1] || dst.shape[1] != src.shape[0])
    chk.fail("dst",
             "shape (" + std::to_string(src.shape[1]) + ", " + std::to_string(src.shape[0]) +
                 ") (src transposed)",
             "shape " + detail::dims_string(dst));
  const detail::Rows s = chk.rows("src", src);
  const detail::Rows d = chk.rows("dst", dst);
  if (src.numel() == 0) return;
  chk.device_pointer("src", src);
  chk.device_pointer("dst", dst);
  switch (dtype_size(src.dtype)) {
    case 1: launch<uint8_t>(src, s, dst, d.pitch, stream); break;
    case 2: launch<uint16_t>(src, s, dst, d.pitch, stream); break;
    case 4: launch<uint32_t>(src, s, dst, d.pitch, stream); break;
    default: launch<uint64_t>(src, s, dst, d.pitch, stream); break;
  }
  detail::check_launch("transpose");
}

}  // namespace tessel
