// Element-wise unary and binary maps. Memory-bound: each thread moves UNROLL 16-byte vectors
// per operand, all loads issued before the first use. b may be broadcast as a row vector over
// the last axis or as a scalar.
#include "ops/rows.cuh"
#include "tessel/ops.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 256;
constexpr int kUnroll = 4;

template <UnaryOp OP>
__device__ __forceinline__ float apply(float x) {
  if constexpr (OP == UnaryOp::identity) return x;
  if constexpr (OP == UnaryOp::neg) return -x;
  if constexpr (OP == UnaryOp::abs) return fabsf(x);
  if constexpr (OP == UnaryOp::exp) return expf(x);
  if constexpr (OP == UnaryOp::relu) return fmaxf(x, 0.f);
  if constexpr (OP == UnaryOp::sigmoid) return 1.f / (1.f + expf(-x));
  if constexpr (OP == UnaryOp::silu) return x / (1.f + expf(-x));
  if constexpr (OP == UnaryOp::square) return x * x;
}

template <BinaryOp OP>
__device__ __forceinline__ float apply(float a, float b) {
  if constexpr (OP == BinaryOp::add) return a + b;
  if constexpr (OP == BinaryOp::sub) return a - b;
  if constexpr (OP == BinaryOp::mul) return a * b;
  if constexpr (OP == BinaryOp::div) return a / b;
  if constexpr (OP == BinaryOp::maximum) return fmaxf(a, b);
  if constexpr (OP == BinaryOp::minimum) return fminf(a, b);
}

enum class Bcast : int { same, row, scalar };

// Vector index handled by unroll step u of this thread.
__device__ __forceinline__ int64_t vec_index(int u) {
  return (static_cast<int64_t>(blockIdx.x) * kUnroll + u) * kBlock + threadIdx.x;
}

template <class T, int VEC, UnaryOp OP>
__global__ void __launch_bounds__(kBlock)
    unary_kernel(const T* x, T* y, int64_t n) {
  const int64_t nvec = n / VEC;
  Frag<T, VEC> f[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (vec_index(u) < nvec) f[u] = load_frag<VEC>(x + vec_index(u) * VEC);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (vec_index(u) >= nvec) continue;
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[u].v[j] = from_f32<T>(apply<OP>(to_f32(f[u].v[j])));
    store_frag_global<VEC>(y + vec_index(u) * VEC, f[u]);
  }
  // Tail of fewer than VEC elements.
  const int64_t tail = nvec * VEC + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) y[tail] = from_f32<T>(apply<OP>(to_f32(x[tail])));
}

template <class T, int VEC>
__device__ __forceinline__ Frag<T, VEC> load_b(const T* b, int64_t e, Bcast mode, int64_t bcols) {
  if (mode == Bcast::same) return load_frag<VEC>(b + e);
  if (mode == Bcast::row) return load_frag<VEC>(b + e % bcols);
  Frag<T, VEC> f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) f.v[j] = b[0];
  return f;
}

template <class T, int VEC, BinaryOp OP>
__global__ void __launch_bounds__(kBlock)
    binary_kernel(const T* a, const T* b, T* out, int64_t n, Bcast mode, int64_t bcols) {
  const int64_t nvec = n / VEC;
  Frag<T, VEC> fa[kUnroll], fb[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (vec_index(u) >= nvec) continue;
    fa[u] = load_frag<VEC>(a + vec_index(u) * VEC);
    fb[u] = load_b<T, VEC>(b, vec_index(u) * VEC, mode, bcols);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (vec_index(u) >= nvec) continue;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      fa[u].v[j] = from_f32<T>(apply<OP>(to_f32(fa[u].v[j]), to_f32(fb[u].v[j])));
    store_frag_global<VEC>(out + vec_index(u) * VEC, fa[u]);
  }
  const int64_t tail = nvec * VEC + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) {
    const int64_t bi = mode == Bcast::same ? tail : mode == Bcast::row ? tail % bcols : 0;
    out[tail] = from_f32<T>(apply<OP>(to_f32(a[tail]), to_f32(b[bi])));
  }
}

// Row-vector broadcast with wide rows: a thread keeps one vector of b in registers and
// applies it down kUnroll rows (no per-element index arithmetic, b read once per thread).
template <class T, int VEC, BinaryOp OP>
__global__ void __launch_bounds__(kBlock)
    binary_row_kernel(const T* a, const T* __restrict__ b, T* out, int64_t rows, int64_t cols) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * VEC;
  if (c >= cols) return;
  const Frag<T, VEC> fb = load_frag<VEC>(b + c);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kUnroll; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kUnroll) {
    Frag<T, VEC> fa[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (r0 + u < rows) fa[u] = load_frag<VEC>(a + (r0 + u) * cols + c);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r0 + u >= rows) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        fa[u].v[j] = from_f32<T>(apply<OP>(to_f32(fa[u].v[j]), to_f32(fb.v[j])));
      store_frag_global<VEC>(out + (r0 + u) * cols + c, fa[u]);
    }
  }
}

unsigned map_grid(int64_t n, int vec) {
  const int64_t nvec = n / vec;
  return static_cast<unsigned>(std::max<int64_t>(1, tile::ceil_div(nvec, int64_t{kBlock} * kUnroll)));
}

template <class F>
void dispatch_unary(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::identity: f(std::integral_constant<UnaryOp, UnaryOp::identity>{}); break;
    case UnaryOp::neg: f(std::integral_constant<UnaryOp, UnaryOp::neg>{}); break;
    case UnaryOp::abs: f(std::integral_constant<UnaryOp, UnaryOp::abs>{}); break;
    case UnaryOp::exp: f(std::integral_constant<UnaryOp, UnaryOp::exp>{}); break;
    case UnaryOp::relu: f(std::integral_constant<UnaryOp, UnaryOp::relu>{}); break;
    case UnaryOp::sigmoid: f(std::integral_constant<UnaryOp, UnaryOp::sigmoid>{}); break;
    case UnaryOp::silu: f(std::integral_constant<UnaryOp, UnaryOp::silu>{}); break;
    case UnaryOp::square: f(std::integral_constant<UnaryOp, UnaryOp::square>{}); break;
  }
}

template <class F>
void dispatch_binary(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add: f(std::integral_constant<BinaryOp, BinaryOp::add>{}); break;
    case BinaryOp::sub: f(std::integral_constant<BinaryOp, BinaryOp::sub>{}); break;
    case BinaryOp::mul: f(std::integral_constant<BinaryOp, BinaryOp::mul>{}); break;
    case BinaryOp::div: f(std::integral_constant<BinaryOp, BinaryOp::div>{}); break;
    case BinaryOp::maximum: f(std::integral_constant<BinaryOp, BinaryOp::maximum>{}); break;
    case BinaryOp::minimum: f(std::integral_constant<BinaryOp, BinaryOp::minimum>{}); break;
  }
}

bool valid_unary(UnaryOp op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) <= static_cast<int>(UnaryOp::square);
}
bool valid_binary(BinaryOp op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) <= static_cast<int>(BinaryOp::minimum);
}

}  // namespace

const char* unary_op_name(UnaryOp op) {
  static const char* names[] = {"identity", "neg", "abs", "exp", "relu", "sigmoid", "silu", "square"};
  return valid_unary(op) ? names[static_cast<int>(op)] : "unknown";
}

const char* binary_op_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
  return valid_binary(op) ? names[static_cast<int>(op)] : "unknown";
}

void unary(UnaryOp op, const Tensor& x, Tensor& y, cudaStream_t stream) {
  detail::OpCheck chk("unary");
  if (!valid_unary(op))
    chk.fail("op", "a tessel::UnaryOp (0..7)", "code " + std::to_string(static_cast<int>(op)));
  chk.dtype_in("x", x, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("y", y, {DType::f32, DType::f16, DType::bf16});
  chk.same_dtype("y", y, "x", x);
  chk.same_shape("y", y, "x", x);
  chk.contiguous("x", x);
  chk.contiguous("y", y);
  const int64_t n = x.numel();
  if (n == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("y", y);
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const bool vec_ok = detail::aligned(x.data, 16) && detail::aligned(y.data, 16);
    dispatch_unary(op, [&](auto opc) {
      constexpr UnaryOp OP = decltype(opc)::value;
      if (vec_ok)
        unary_kernel<T, V, OP><<<map_grid(n, V), kBlock, 0, stream>>>(
            static_cast<const T*>(x.data), static_cast<T*>(y.data), n);
      else
        unary_kernel<T, 1, OP><<<map_grid(n, 1), kBlock, 0, stream>>>(
            static_cast<const T*>(x.data), static_cast<T*>(y.data), n);
    });
  });
  detail::check_launch("unary");
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream) {
  detail::OpCheck chk("binary");
  if (!valid_binary(op))
    chk.fail("op", "a tessel::BinaryOp (0..5)", "code " + std::to_string(static_cast<int>(op)));
  chk.dtype_in("a", a, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("b", b, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("out", out, {DType::f32, DType::f16, DType::bf16});
  chk.same_dtype("b", b, "a", a);
  chk.same_dtype("out", out, "a", a);
  chk.same_shape("out", out, "a", a);
  // Broadcast mode of b.
  Bcast mode = Bcast::same;
  bool same = b.ndim == a.ndim;
  for (int d = 0; same && d < a.ndim; ++d) same = b.shape[d] == a.shape[d];
  const int64_t cols = a.ndim ? a.shape[a.ndim - 1] : 1;
  if (!same) {
    bool row = b.ndim >= 1 && b.ndim <= std::max(a.ndim, 1) && b.shape[b.ndim - 1] == cols;
    for (int d = 0; row && d < b.ndim - 1; ++d) row = b.shape[d] == 1;
    if (b.numel() == 1) mode = Bcast::scalar;
    else if (row) mode = Bcast::row;
    else
      chk.fail("b", "shape " + detail::dims_string(a) + ", a row vector (" +
                        std::to_string(cols) + ",) or a single element",
               "shape " + detail::dims_string(b));
  }
  chk.contiguous("a", a);
  chk.contiguous("b", b);
  chk.contiguous("out", out);
  const int64_t n = a.numel();
  if (n == 0) return;
  chk.device_pointer("a", a);
  chk.device_pointer("b", b);
  chk.device_pointer("out", out);
  detail::dispatch_float_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const bool vec_ok = detail::aligned(a.data, 16) && detail::aligned(out.data, 16) &&
                        (mode == Bcast::scalar || detail::aligned(b.data, 16)) &&
                        (mode != Bcast::row || cols % V == 0);
    dispatch_binary(op, [&](auto opc) {
      constexpr BinaryOp OP = decltype(opc)::value;
      const T* ap = static_cast<const T*>(a.data);
      const T* bp = static_cast<const T*>(b.data);
      T* op_ = static_cast<T*>(out.data);
      if (vec_ok && mode == Bcast::row && cols >= int64_t{kBlock} * V / 4) {
        const int64_t rows = n / cols;
        const dim3 grid(static_cast<unsigned>(tile::ceil_div(cols / V, kBlock)),
                        static_cast<unsigned>(std::min<int64_t>(tile::ceil_div(rows, kUnroll), 65535)));
        binary_row_kernel<T, V, OP><<<grid, kBlock, 0, stream>>>(ap, bp, op_, rows, cols);
      } else if (vec_ok)
        binary_kernel<T, V, OP><<<map_grid(n, V), kBlock, 0, stream>>>(ap, bp, op_, n, mode, cols);
      else
        binary_kernel<T, 1, OP><<<map_grid(n, 1), kBlock, 0, stream>>>(ap, bp, op_, n, mode, cols);
    });
  });
  detail::check_launch("binary");
}

}  // namespace tessel
