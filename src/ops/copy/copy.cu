// copy: bit-exact, any dtype. Dense → dense moves 16-byte vectors (UNROLL per thread);
// anything strided goes through a generic N-D gather/scatter on the element's bits.
#include "ops/rows.cuh"
#include "tessel/ops.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 256;
constexpr int kUnroll = 4;

// Dense copy of n units of type U (uint4 when both pointers are 16-byte aligned).
template <class U>
__global__ void __launch_bounds__(kBlock) dense_copy_kernel(const U* __restrict__ src,
                                                            U* __restrict__ dst, int64_t n) {
  U v[kUnroll];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kUnroll * kBlock + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + u * kBlock < n) v[u] = src[base + u * kBlock];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + u * kBlock < n) dst[base + u * kBlock] = v[u];
}

__global__ void tail_bytes_kernel(const uint8_t* src, uint8_t* dst, int64_t n) {
  if (threadIdx.x < n) dst[threadIdx.x] = src[threadIdx.x];
}

struct Layout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t src_strides[kMaxDims];
  int64_t dst_strides[kMaxDims];
};

template <class U>
__global__ void __launch_bounds__(kBlock) strided_copy_kernel(const U* __restrict__ src,
                                                              U* __restrict__ dst, int64_t n,
                                                              Layout l) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    int64_t rem = i, so = 0, d_o = 0;
    for (int d = l.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % l.shape[d];
      rem /= l.shape[d];
      so += idx * l.src_strides[d];
      d_o += idx * l.dst_strides[d];
    }
    dst[d_o] = src[so];
  }
}

template <class U>
void launch_dense(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  const int64_t blocks = std::max<int64_t>(1, ceil_div(n, int64_t{kBlock} * kUnroll));
  dense_copy_kernel<U><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
      static_cast<const U*>(src), static_cast<U*>(dst), n);
}

}  // namespace

void copy(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  detail::OpCheck chk("copy");
  chk.valid_layout("src", src);
  chk.valid_layout("dst", dst);
  chk.same_dtype("dst", dst, "src", src);
  chk.same_shape("dst", dst, "src", src);
  const int64_t n = src.numel();
  if (n == 0) return;
  chk.device_pointer("src", src);
  chk.device_pointer("dst", dst);
  const size_t es = dtype_size(src.dtype);

  if (src.is_contiguous() && dst.is_contiguous()) {
    const int64_t bytes = n * static_cast<int64_t>(es);
    if (detail::aligned(src.data, 16) && detail::aligned(dst.data, 16)) {
      const int64_t vecs = bytes / 16;
      if (vecs) launch_dense<uint4>(src.data, dst.data, vecs, stream);
      if (bytes % 16)
        tail_bytes_kernel<<<1, 32, 0, stream>>>(static_cast<const uint8_t*>(src.data) + vecs * 16,
                                                 static_cast<uint8_t*>(dst.data) + vecs * 16,
                                                 bytes % 16);
    } else {
      switch (es) {
        case 1: launch_dense<uint8_t>(src.data, dst.data, n, stream); break;
        case 2: launch_dense<uint16_t>(src.data, dst.data, n, stream); break;
        case 4: launch_dense<uint32_t>(src.data, dst.data, n, stream); break;
        default: launch_dense<uint64_t>(src.data, dst.data, n, stream); break;
      }
    }
  } else {
    Layout l{};
    l.ndim = src.ndim;
    for (int d = 0; d < src.ndim; ++d) {
      l.shape[d] = src.shape[d];
      l.src_strides[d] = src.strides[d];
      l.dst_strides[d] = dst.strides[d];
    }
    const unsigned blocks = static_cast<unsigned>(
        std::min<int64_t>(ceil_div(n, kBlock), int64_t{detail::current_sm_count()} * 32));
    switch (es) {
      case 1:
        strided_copy_kernel<<<blocks, kBlock, 0, stream>>>(
            static_cast<const uint8_t*>(src.data), static_cast<uint8_t*>(dst.data), n, l);
        break;
      case 2:
        strided_copy_kernel<<<blocks, kBlock, 0, stream>>>(
            static_cast<const uint16_t*>(src.data), static_cast<uint16_t*>(dst.data), n, l);
        break;
      case 4:
        strided_copy_kernel<<<blocks, kBlock, 0, stream>>>(
            static_cast<const uint32_t*>(src.data), static_cast<uint32_t*>(dst.data), n, l);
        break;
      default:
        strided_copy_kernel<<<blocks, kBlock, 0, stream>>>(
            static_cast<const uint64_t*>(src.data), static_cast<uint64_t*>(dst.data), n, l);
        break;
    }
  }
  detail::check_launch("copy");
}

}  // namespace tessel
