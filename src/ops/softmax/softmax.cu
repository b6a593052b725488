// Softmax along the last axis, forward and backward.
//   forward : y = exp(x - max) / sum(exp(x - max))            bytes: read x, write y
//   backward: dx = y * (dy - sum(y * dy))                     bytes: read y, dy, write dx
// Rows up to 4096 vectors are held in registers (one read, one write). Longer rows stream:
// an online max/sum pass, then a write pass (x is read twice).
#include "ops/rows.cuh"
#include "tessel/ops.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;
using detail::RowConfig;

constexpr float kLog2e = 1.4426950408889634f;

template <class T, class Cfg>
__global__ void __launch_bounds__(Cfg::BLOCK, Cfg::MIN_BLOCKS)
    softmax_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols,
                       int64_t x_pitch, int64_t y_pitch) {
  __shared__ float scratch[Cfg::BLOCK / 32];
  using Row = RowFrags<T, Cfg::VEC, Cfg::ITEMS, Cfg::THREADS>;
  for (RowGroups<Cfg::THREADS, Cfg::BLOCK> g; g.valid_block(rows); g.next()) {
    const int64_t n = g.active ? cols : 0;  // an inactive group folds nothing
    Row r;
    r.load(x + g.row * x_pitch, n, g.lane);
    const float max = group_reduce<Cfg::THREADS, Cfg::BLOCK>(
        r.fold(n, g.lane, MaxOp{}, [](float v) { return v; }), MaxOp{}, scratch);
    const float shift = max * kLog2e;
    auto e = [&](float v) { return exp2f(fmaf(v, kLog2e, -shift)); };
    const float sum =
        group_reduce<Cfg::THREADS, Cfg::BLOCK>(r.fold(n, g.lane, SumOp{}, e), SumOp{}, scratch);
    const float inv = 1.f / sum;
    // exp is recomputed rather than kept: registers stay in the storage dtype.
    store_row<T, Cfg::VEC, Cfg::ITEMS, Cfg::THREADS>(
        y + g.row * y_pitch, n, g.lane, [&](int i, int j) { return e(r.at(i, j)) * inv; });
  }
}

template <class T, class Cfg>
__global__ void __launch_bounds__(Cfg::BLOCK, Cfg::MIN_BLOCKS)
    softmax_bwd_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                       int64_t rows, int64_t cols, int64_t y_pitch, int64_t dy_pitch,
                       int64_t dx_pitch) {
  __shared__ float scratch[Cfg::BLOCK / 32];
  using Row = RowFrags<T, Cfg::VEC, Cfg::ITEMS, Cfg::THREADS>;
  for (RowGroups<Cfg::THREADS, Cfg::BLOCK> g; g.valid_block(rows); g.next()) {
    const int64_t n = g.active ? cols : 0;
    Row ys, gs;
    ys.load(y + g.row * y_pitch, n, g.lane);
    gs.load(dy + g.row * dy_pitch, n, g.lane);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < Cfg::ITEMS; ++i)
      if (Row::valid(i, g.lane, n))
#pragma unroll
        for (int j = 0; j < Cfg::VEC; ++j) dot = fmaf(ys.at(i, j), gs.at(i, j), dot);
    dot = group_reduce<Cfg::THREADS, Cfg::BLOCK>(dot, SumOp{}, scratch);
    store_row<T, Cfg::VEC, Cfg::ITEMS, Cfg::THREADS>(
        dx + g.row * dx_pitch, n, g.lane,
        [&](int i, int j) { return ys.at(i, j) * (gs.at(i, j) - dot); });
  }
}

// ---- long rows: one block per row, streamed in chunks ----------------------------------
constexpr int kStreamBlock = 1024;

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamBlock)
    softmax_fwd_stream_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                              int64_t cols, int64_t x_pitch, int64_t y_pitch) {
  __shared__ float scratch[kStreamBlock / 32];
  using Slice = RowSlice<T, VEC, 1, kStreamBlock>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_pitch;
    // Pass 1: online (max, sum of exp) per thread, then combined across the block.
    float m = -INFINITY, s = 0.f;
    for (int64_t c0 = 0; c0 < cols; c0 += Slice::kCols) {
      Slice sl;
      sl.load(xr + c0, cols - c0, threadIdx.x, -INFINITY);
      const float cm = fmaxf(m, sl.fold(MaxOp{}));
      if (cm != -INFINITY) {
        s *= exp2f((m - cm) * kLog2e);
        sl.map([&](float v) { return exp2f((v - cm) * kLog2e); });
        s += sl.fold(SumOp{});
        m = cm;
      }
    }
    const float bm = group_reduce<kStreamBlock, kStreamBlock>(m, MaxOp{}, scratch);
    const float part = m == -INFINITY ? 0.f : s * exp2f((m - bm) * kLog2e);
    const float inv = 1.f / group_reduce<kStreamBlock, kStreamBlock>(part, SumOp{}, scratch);
    // Pass 2: normalize.
    T* yr = y + row * y_pitch;
    for (int64_t c0 = 0; c0 < cols; c0 += Slice::kCols) {
      Slice sl;
      sl.load(xr + c0, cols - c0, threadIdx.x, -INFINITY);
      sl.map([&](float v) { return exp2f((v - bm) * kLog2e) * inv; });
      sl.store(yr + c0, cols - c0, threadIdx.x);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamBlock)
    softmax_bwd_stream_kernel(const T* __restrict__ y, const T* __restrict__ dy,
                              T* __restrict__ dx, int64_t rows, int64_t cols, int64_t y_pitch,
                              int64_t dy_pitch, int64_t dx_pitch) {
  __shared__ float scratch[kStreamBlock / 32];
  using Slice = RowSlice<T, VEC, 1, kStreamBlock>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * y_pitch;
    const T* gr = dy + row * dy_pitch;
    float dot = 0.f;
    for (int64_t c0 = 0; c0 < cols; c0 += Slice::kCols) {
      Slice a, b;
      a.load(yr + c0, cols - c0, threadIdx.x, 0.f);
      b.load(gr + c0, cols - c0, threadIdx.x, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) dot = fmaf(a.x[0][j], b.x[0][j], dot);
    }
    dot = group_reduce<kStreamBlock, kStreamBlock>(dot, SumOp{}, scratch);
    T* dr = dx + row * dx_pitch;
    for (int64_t c0 = 0; c0 < cols; c0 += Slice::kCols) {
      Slice a, b;
      a.load(yr + c0, cols - c0, threadIdx.x, 0.f);
      b.load(gr + c0, cols - c0, threadIdx.x, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) b.x[0][j] = a.x[0][j] * (b.x[0][j] - dot);
      b.store(dr + c0, cols - c0, threadIdx.x);
    }
  }
}

unsigned stream_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{detail::current_sm_count()} * 64));
}

}  // namespace

void softmax(const Tensor& x, Tensor& y, cudaStream_t stream) {
  detail::OpCheck chk("softmax");
  chk.dtype_in("x", x, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("y", y, {DType::f32, DType::f16, DType::bf16});
  chk.same_dtype("y", y, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  chk.same_shape("y", y, "x", x);
  const detail::Rows xr = chk.rows("x", x);
  const detail::Rows yr = chk.rows("y", y);
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("y", y);

  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data);
    T* yp = static_cast<T*>(y.data);
    const bool vec_ok = detail::rows_vectorizable<T>(xr.cols, {{xp, xr.pitch}, {yp, yr.pitch}});
    const bool in_registers = detail::dispatch_row_frags<kVec16<T>>(xr.cols, vec_ok, [&](auto cfg) {
      using Cfg = decltype(cfg);
      softmax_fwd_kernel<T, Cfg><<<detail::row_grid<Cfg>(xr.rows), Cfg::BLOCK, 0, stream>>>(
          xp, yp, xr.rows, xr.cols, xr.pitch, yr.pitch);
    });
    if (!in_registers) {
      if (vec_ok)
        softmax_fwd_stream_kernel<T, kVec16<T>><<<stream_grid(xr.rows), kStreamBlock, 0, stream>>>(
            xp, yp, xr.rows, xr.cols, xr.pitch, yr.pitch);
      else
        softmax_fwd_stream_kernel<T, 1><<<stream_grid(xr.rows), kStreamBlock, 0, stream>>>(
            xp, yp, xr.rows, xr.cols, xr.pitch, yr.pitch);
    }
  });
  detail::check_launch("softmax");
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, cudaStream_t stream) {
  detail::OpCheck chk("softmax_backward");
  chk.dtype_in("y", y, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("dy", dy, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("dx", dx, {DType::f32, DType::f16, DType::bf16});
  chk.same_dtype("dy", dy, "y", y);
  chk.same_dtype("dx", dx, "y", y);
  chk.rank_in("y", y, 1, kMaxDims);
  chk.same_shape("dy", dy, "y", y);
  chk.same_shape("dx", dx, "y", y);
  const detail::Rows yr = chk.rows("y", y);
  const detail::Rows gr = chk.rows("dy", dy);
  const detail::Rows dr = chk.rows("dx", dx);
  if (y.numel() == 0) return;
  chk.device_pointer("y", y);
  chk.device_pointer("dy", dy);
  chk.device_pointer("dx", dx);

  detail::dispatch_float_dtype(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* yp = static_cast<const T*>(y.data);
    const T* gp = static_cast<const T*>(dy.data);
    T* dp = static_cast<T*>(dx.data);
    const bool vec_ok = detail::rows_vectorizable<T>(
        yr.cols, {{yp, yr.pitch}, {gp, gr.pitch}, {dp, dr.pitch}});
    const bool in_registers = detail::dispatch_row_config<kVec16<T>>(yr.cols, vec_ok, [&](auto cfg) {
      using Cfg = decltype(cfg);
      softmax_bwd_kernel<T, Cfg><<<detail::row_grid<Cfg>(yr.rows), Cfg::BLOCK, 0, stream>>>(
          yp, gp, dp, yr.rows, yr.cols, yr.pitch, gr.pitch, dr.pitch);
    });
    if (!in_registers) {
      if (vec_ok)
        softmax_bwd_stream_kernel<T, kVec16<T>><<<stream_grid(yr.rows), kStreamBlock, 0, stream>>>(
            yp, gp, dp, yr.rows, yr.cols, yr.pitch, gr.pitch, dr.pitch);
      else
        softmax_bwd_stream_kernel<T, 1><<<stream_grid(yr.rows), kStreamBlock, 0, stream>>>(
            yp, gp, dp, yr.rows, yr.cols, yr.pitch, gr.pitch, dr.pitch);
    }
  });
  detail::check_launch("softmax_backward");
}

}  // namespace tessel
