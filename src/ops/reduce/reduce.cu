// Sums with fp32 accumulation, deterministic (fixed association for a given GPU).
//   reduce_sum      : whole tensor in one launch. Each block folds a grid-stride share of
//                     16-byte vectors into a partial; the last block to finish (completion
//                     ticket) adds the partials in block order and writes the result.
//   reduce_sum_rows : one row per thread group (register row slices), long rows streamed.
#include "ops/rows.cuh"
#include "runtime/workspace.hpp"
#include "tessel/ops.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 512;
constexpr int kUnroll = 4;
constexpr int kBlocksPerSm = 4;  // 4 × 512 threads fill an SM

template <class T, int VEC, class OutT>
__global__ void __launch_bounds__(kBlock)
    reduce_sum_kernel(const T* __restrict__ x, int64_t n, float* partials, unsigned* ticket,
                      OutT* out) {
  __shared__ float scratch[kBlock / 32];
  __shared__ bool last_block;
  const int64_t nvec = n / VEC;
  float acc = 0.f;
  for (int64_t v0 = static_cast<int64_t>(blockIdx.x) * kBlock * kUnroll + threadIdx.x; v0 < nvec;
       v0 += static_cast<int64_t>(gridDim.x) * kBlock * kUnroll) {
    Frag<T, VEC> f[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v0 + u * kBlock < nvec) f[u] = load_frag<VEC>(x + (v0 + u * kBlock) * VEC);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v0 + u * kBlock < nvec)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc += to_f32(f[u].v[j]);
  }
  if (blockIdx.x == 0 && nvec * VEC + threadIdx.x < n) acc += to_f32(x[nvec * VEC + threadIdx.x]);
  acc = group_reduce<kBlock, kBlock>(acc, SumOp{}, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = acc;
    __threadfence();
    last_block = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  float total = 0.f;
  for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += kBlock)
    total += __ldcg(partials + i);  // L2: written by other blocks
  total = group_reduce<kBlock, kBlock>(total, SumOp{}, scratch);
  if (threadIdx.x == 0) {
    *out = from_f32<OutT>(total);
    *ticket = 0;  // leave the workspace zeroed for the next call on this stream
  }
}

template <class T, class OutT, class Cfg>
__global__ void __launch_bounds__(Cfg::BLOCK)
    row_sum_kernel(const T* __restrict__ x, OutT* __restrict__ out, int64_t rows, int64_t cols,
                   int64_t pitch) {
  __shared__ float scratch[Cfg::BLOCK / 32];
  for (RowGroups<Cfg::THREADS, Cfg::BLOCK> g; g.valid_block(rows); g.next()) {
    RowSlice<T, Cfg::VEC, Cfg::ITEMS, Cfg::THREADS> s;
    if (g.active) s.load(x + g.row * pitch, cols, g.lane, 0.f);
    else s.map([](float) { return 0.f; });
    const float sum = group_reduce<Cfg::THREADS, Cfg::BLOCK>(s.fold(SumOp{}), SumOp{}, scratch);
    if (g.active && g.lane == 0) out[g.row] = from_f32<OutT>(sum);
  }
}

constexpr int kStreamBlock = 1024;

template <class T, class OutT, int VEC>
__global__ void __launch_bounds__(kStreamBlock)
    row_sum_stream_kernel(const T* __restrict__ x, OutT* __restrict__ out, int64_t rows,
                          int64_t cols, int64_t pitch) {
  __shared__ float scratch[kStreamBlock / 32];
  using Slice = RowSlice<T, VEC, 2, kStreamBlock>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float acc = 0.f;
    for (int64_t c0 = 0; c0 < cols; c0 += Slice::kCols) {
      Slice s;
      s.load(x + row * pitch + c0, cols - c0, threadIdx.x, 0.f);
      acc += s.fold(SumOp{});
    }
    acc = group_reduce<kStreamBlock, kStreamBlock>(acc, SumOp{}, scratch);
    if (threadIdx.x == 0) out[row] = from_f32<OutT>(acc);
  }
}

// out dtype: f32 or the input's
template <class T, class F>
void dispatch_out(DType out, F&& f) {
  if (out == DType::f32) f(float{});
  else f(T{});
}

}  // namespace

void reduce_sum(const Tensor& x, Tensor& out, cudaStream_t stream) {
  detail::OpCheck chk("reduce_sum");
  chk.dtype_in("x", x, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("out", out, {DType::f32, DType::f16, DType::bf16});
  if (out.dtype != DType::f32 && out.dtype != x.dtype)
    chk.fail("out", std::string("dtype f32 or ") + dtype_name(x.dtype) + " (x's dtype)",
             dtype_name(out.dtype));
  if (out.numel() != 1) chk.fail("out", "one element", "shape " + detail::dims_string(out));
  chk.contiguous("x", x);
  const int64_t n = x.numel();
  if (n == 0) return;  // zero-size input: a no-op, like every op (out is not written)
  chk.device_pointer("x", x);
  chk.device_pointer("out", out);
  const int grid = detail::current_sm_count() * kBlocksPerSm;
  char* ws = static_cast<char*>(detail::stream_workspace(stream, 256 + grid * sizeof(float)));
  unsigned* ticket = reinterpret_cast<unsigned*>(ws);
  float* partials = reinterpret_cast<float*>(ws + 256);
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    dispatch_out<T>(out.dtype, [&](auto otag) {
      using OutT = decltype(otag);
      const T* xp = static_cast<const T*>(x.data);
      OutT* op = static_cast<OutT*>(out.data);
      if (detail::aligned(xp, 16))
        reduce_sum_kernel<T, kVec16<T>, OutT><<<grid, kBlock, 0, stream>>>(xp, n, partials, ticket, op);
      else
        reduce_sum_kernel<T, 1, OutT><<<grid, kBlock, 0, stream>>>(xp, n, partials, ticket, op);
    });
  });
  detail::check_launch("reduce_sum");
}

void reduce_sum_rows(const Tensor& x, Tensor& out, cudaStream_t stream) {
  detail::OpCheck chk("reduce_sum_rows");
  chk.dtype_in("x", x, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("out", out, {DType::f32, DType::f16, DType::bf16});
  if (out.dtype != DType::f32 && out.dtype != x.dtype)
    chk.fail("out", std::string("dtype f32 or ") + dtype_name(x.dtype) + " (x's dtype)",
             dtype_name(out.dtype));
  chk.rank_in("x", x, 1, kMaxDims);
  // out: x's shape without the last axis ((1,) accepted for 1-D x).
  bool shape_ok = out.ndim == x.ndim - 1;
  for (int d = 0; shape_ok && d < out.ndim; ++d) shape_ok = out.shape[d] == x.shape[d];
  if (x.ndim == 1 && out.ndim == 1 && out.shape[0] == 1) shape_ok = true;
  if (!shape_ok) {
    Tensor expect = x;
    expect.ndim = x.ndim - 1;
    chk.fail("out", "shape " + detail::dims_string(expect) + " (x without its last axis)",
             "shape " + detail::dims_string(out));
  }
  const detail::Rows xr = chk.rows("x", x);
  chk.contiguous("out", out);
  if (x.numel() == 0) return;  // zero-size input: a no-op (out is not written)
  chk.device_pointer("x", x);
  chk.device_pointer("out", out);
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    dispatch_out<T>(out.dtype, [&](auto otag) {
      using OutT = decltype(otag);
      const T* xp = static_cast<const T*>(x.data);
      OutT* op = static_cast<OutT*>(out.data);
      const bool vec_ok = detail::rows_vectorizable<T>(xr.cols, {{xp, xr.pitch}});
      const bool in_registers =
          detail::dispatch_row_config<kVec16<T>>(xr.cols, vec_ok, [&](auto cfg) {
            using Cfg = decltype(cfg);
            row_sum_kernel<T, OutT, Cfg><<<detail::row_grid<Cfg>(xr.rows), Cfg::BLOCK, 0, stream>>>(
                xp, op, xr.rows, xr.cols, xr.pitch);
          });
      if (!in_registers) {
        const unsigned grid = static_cast<unsigned>(
            std::min<int64_t>(xr.rows, int64_t{detail::current_sm_count()} * 64));
        if (vec_ok)
          row_sum_stream_kernel<T, OutT, kVec16<T>><<<grid, kStreamBlock, 0, stream>>>(
              xp, op, xr.rows, xr.cols, xr.pitch);
        else
          row_sum_stream_kernel<T, OutT, 1><<<grid, kStreamBlock, 0, stream>>>(
              xp, op, xr.rows, xr.cols, xr.pitch);
      }
    });
  });
  detail::check_launch("reduce_sum_rows");
}

}  // namespace tessel
