// Gated linear units (SwiGLU / GEGLU) and GELU, forward and backward. Memory-bound maps over
// rows views: a thread owns one 16-byte vector column slot and walks kRowUnroll rows per step
// (all loads of a step issued before the math), grid (column blocks, row blocks).
//   glu fwd : read gate, up            write out            bytes 3·R·H·s
//   glu bwd : read gate, up, dout      write dgate, dup     bytes 5·R·H·s
//   gelu    : read x write y (2·n·s);  bwd: read x, dy write dx (3·n·s)
// The fused (..., 2H) layout is the two-tensor one with gate = x, up = x + H, pitch 2H.
#include <algorithm>
#include <string>
#include <type_traits>

#include "ops/rows.cuh"
#include "runtime/launch.cuh"
#include "tessel/activation.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

enum class Act : int { silu, gelu_erf, gelu_tanh };
enum class Mode : int { glu_fwd, glu_bwd, act_fwd, act_bwd };

constexpr int kBlock = 256;
constexpr int kRowUnroll = 2;

// tanh for the tanh-GELU: tanh.approx.f32 (one MUFU.TANH, max relative error ~2^-11) when the
// result is rounded to bf16 anyway (unit roundoff 2^-8); tanhf (~20 instructions) for f32 and
// f16 (2^-11 is f16's own unit roundoff). With
// tanhf the GELU backward issues ~40 instructions per 6 bytes moved and ran at 0.57 of copy
// bandwidth (H100, 16384 x 4096 bf16) while geglu_bwd, ~45 per 10 bytes, ran at 0.97.
template <bool FAST>
__device__ __forceinline__ float gelu_tanh_of(float u) {
  if constexpr (FAST) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
    return t;
  } else {
    return tanhf(u);
  }
}

// f = act(x), d = act'(x) (d only when NEED_D). FAST: the result is stored as bf16.
template <Act A, bool NEED_D, bool FAST = false>
__device__ __forceinline__ void act_eval(float x, float& f, float& d) {
  // SiLU's sigmoid as __expf + __fdividef (MUFU.EX2 + MUFU.RCP) instead of an IEEE division:
  // silu_and_mul forward 0.88 -> 1.02 of copy bandwidth (H100). Error: a few ulp of f32.
  if constexpr (A == Act::silu) {
    const float s = __fdividef(1.f, 1.f + __expf(-x));  // x -> -inf: 1/inf = 0
    f = x * s;
    if constexpr (NEED_D) d = s * (1.f + x * (1.f - s));
  } else if constexpr (A == Act::gelu_erf) {
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    f = x * cdf;
    if constexpr (NEED_D) d = cdf + x * 0.3989422804014327f * __expf(-0.5f * x * x);
  } else {
    // tanh, not the sigmoid form s = 1/(1 + exp(-2u)): that form (with an IEEE division)
    // measured slower on H100 (gelu_fwd 0.495 of copy bandwidth vs 0.896, geglu_fwd 0.676 vs
    // 0.926; docs/llm_ops.md).
    constexpr float kA = 0.7978845608028654f, kC = 0.044715f;
    const float x2 = x * x;
    const float t = gelu_tanh_of<FAST>(kA * x * fmaf(kC, x2, 1.f));
    const float half_x = 0.5f * x;
    f = fmaf(half_x, t, half_x);
    if constexpr (NEED_D)
      d = fmaf(0.5f, t, 0.5f) + half_x * fmaf(-t, t, 1.f) * kA * fmaf(3.f * kC, x2, 1.f);
  }
}

struct Ptrs {
  const void* a;  // gate / x
  const void* b;  // up
  const void* g;  // dout / dy
  void* o0;       // out / dgate / dx
  void* o1;       // dup
  int64_t pa, pb, pg, p0, p1;  // row pitches (elements)
};

template <class T, int VEC, Act A, Mode M>
__global__ void __launch_bounds__(kBlock) act_kernel(Ptrs p, int64_t rows, int64_t cols) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * VEC;
  if (c >= cols) return;
  constexpr bool kHasB = M == Mode::glu_fwd || M == Mode::glu_bwd;
  constexpr bool kHasG = M == Mode::glu_bwd || M == Mode::act_bwd;
  const T* A_ = static_cast<const T*>(p.a);
  const T* B_ = static_cast<const T*>(p.b);
  const T* G_ = static_cast<const T*>(p.g);
  T* O0 = static_cast<T*>(p.o0);
  T* O1 = static_cast<T*>(p.o1);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowUnroll; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kRowUnroll) {
    Frag<T, VEC> fa[kRowUnroll], fb[kRowUnroll], fg[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t r = r0 + u;
      if (r >= rows) continue;
      fa[u] = load_frag<VEC>(A_ + r * p.pa + c);
      if constexpr (kHasB) fb[u] = load_frag<VEC>(B_ + r * p.pb + c);
      if constexpr (kHasG) fg[u] = load_frag<VEC>(G_ + r * p.pg + c);
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t r = r0 + u;
      if (r >= rows) continue;
      Frag<T, VEC> y0, y1;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        float f, d = 0.f;
        act_eval<A, kHasG, std::is_same_v<T, __nv_bfloat16>>(to_f32(fa[u].v[j]), f, d);
        if constexpr (M == Mode::glu_fwd) {
          y0.v[j] = from_f32<T>(f * to_f32(fb[u].v[j]));
        } else if constexpr (M == Mode::glu_bwd) {
          const float g = to_f32(fg[u].v[j]);
          y0.v[j] = from_f32<T>(g * to_f32(fb[u].v[j]) * d);
          y1.v[j] = from_f32<T>(g * f);
        } else if constexpr (M == Mode::act_fwd) {
          y0.v[j] = from_f32<T>(f);
        } else {
          y0.v[j] = from_f32<T>(to_f32(fg[u].v[j]) * d);
        }
      }
      store_frag_global<VEC>(O0 + r * p.p0 + c, y0);
      if constexpr (M == Mode::glu_bwd) store_frag_global<VEC>(O1 + r * p.p1 + c, y1);
    }
  }
}

// GELU forward / backward over contiguous tensors as one flat range: a block covers
// kFlatUnroll x kBlock consecutive 16-byte vectors of every tensor, each thread kFlatUnroll
// of them (all loads first), like the elementwise ops (2R+1W at 1.01 of copy bandwidth).
constexpr int kFlatUnroll = 4;

template <class T, int VEC, Act A, Mode M>
__global__ void __launch_bounds__(kBlock) act_flat_kernel(Ptrs p, int64_t nvec) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  static_assert(M == Mode::act_fwd || M == Mode::act_bwd, "single-tensor activations only");
  constexpr bool kHasG = M == Mode::act_bwd;
  const T* A_ = static_cast<const T*>(p.a);
  const T* G_ = static_cast<const T*>(p.g);
  T* O0 = static_cast<T*>(p.o0);
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kFlatUnroll * kBlock + threadIdx.x;
  Frag<T, VEC> fa[kFlatUnroll], fg[kFlatUnroll];
#pragma unroll
  for (int u = 0; u < kFlatUnroll; ++u) {
    const int64_t v = v0 + u * kBlock;
    if (v >= nvec) continue;
    fa[u] = load_frag<VEC>(A_ + v * VEC);
    if constexpr (kHasG) fg[u] = load_frag<VEC>(G_ + v * VEC);
  }
#pragma unroll
  for (int u = 0; u < kFlatUnroll; ++u) {
    const int64_t v = v0 + u * kBlock;
    if (v >= nvec) continue;
    Frag<T, VEC> y;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float f, d = 0.f;
      act_eval<A, kHasG, std::is_same_v<T, __nv_bfloat16>>(to_f32(fa[u].v[j]), f, d);
      if constexpr (kHasG) y.v[j] = from_f32<T>(to_f32(fg[u].v[j]) * d);
      else y.v[j] = from_f32<T>(f);
    }
    store_frag_global<VEC>(O0 + v * VEC, y);
  }
}

Act act_of(GeluApprox a) { return a == GeluApprox::tanh ? Act::gelu_tanh : Act::gelu_erf; }

template <class F>
void dispatch_act(Act a, F&& f) {
  switch (a) {
    case Act::silu: f(std::integral_constant<Act, Act::silu>{}); break;
    case Act::gelu_erf: f(std::integral_constant<Act, Act::gelu_erf>{}); break;
    case Act::gelu_tanh: f(std::integral_constant<Act, Act::gelu_tanh>{}); break;
  }
}

template <Mode M>
void launch(const char* op, Act act, DType dtype, const Ptrs& p, int64_t rows, int64_t cols,
            cudaStream_t stream) {
  detail::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto ok = [&](const void* ptr, int64_t pitch) {
      return ptr == nullptr || (detail::aligned(ptr, 16) && pitch % V == 0);
    };
    const bool vec_ok = cols % V == 0 && ok(p.a, p.pa) && ok(p.b, p.pb) && ok(p.g, p.pg) &&
                        ok(p.o0, p.p0) && ok(p.o1, p.p1);
    dispatch_act(act, [&](auto ac) {
      constexpr Act A = decltype(ac)::value;
      if constexpr (M == Mode::act_fwd || M == Mode::act_bwd) {
        const bool flat =
            vec_ok && p.pa == cols && p.p0 == cols && (p.g == nullptr || p.pg == cols);
        if (flat) {
          const int64_t nvec = rows * cols / V;
          const int64_t blocks = tile::ceil_div(nvec, int64_t{kFlatUnroll} * kBlock);
          TESSEL_CUDA_CHECK(detail::launch_dependent(act_flat_kernel<T, V, A, M>, dim3(static_cast<unsigned>(blocks)), dim3(kBlock), 0, stream, p, nvec));
          return;
        }
      }
      const int vec = vec_ok ? V : 1;
      const int64_t col_blocks = tile::ceil_div(tile::ceil_div(cols, vec), kBlock);
      const int64_t row_blocks = std::min<int64_t>(tile::ceil_div(rows, kRowUnroll), 65535);
      const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
      TESSEL_CUDA_CHECK(vec_ok ? detail::launch_dependent(act_kernel<T, V, A, M>, grid, dim3(kBlock), 0, stream, p, rows, cols)
                             : detail::launch_dependent(act_kernel<T, 1, A, M>, grid, dim3(kBlock), 0, stream, p, rows, cols));
    });
  });
  detail::check_launch(op);
}

constexpr std::initializer_list<DType> kFloat = {DType::f32, DType::f16, DType::bf16};

void check_approx(const detail::OpCheck& chk, GeluApprox a) {
  if (a != GeluApprox::none && a != GeluApprox::tanh)
    chk.fail("approx", "tessel::GeluApprox none (0) or tanh (1)",
             "code " + std::to_string(static_cast<int>(a)));
}

// Output shape of the fused layout: x's shape with the last axis halved.
void check_half_shape(const detail::OpCheck& chk, const char* arg, const Tensor& t,
                      const Tensor& x) {
  bool ok = t.ndim == x.ndim && x.ndim >= 1;
  for (int d = 0; ok && d < x.ndim - 1; ++d) ok = t.shape[d] == x.shape[d];
  if (ok) ok = t.shape[x.ndim - 1] * 2 == x.shape[x.ndim - 1];
  if (!ok) {
    Tensor e = x;
    if (e.ndim >= 1) e.shape[e.ndim - 1] /= 2;
    chk.fail(arg, "shape " + detail::dims_string(e) + " (x's shape, last axis halved)",
             "shape " + detail::dims_string(t));
  }
}

void fused_forward(const char* op, Act act, const Tensor& x, Tensor& out, cudaStream_t stream) {
  detail::OpCheck chk(op);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("out", out, kFloat);
  chk.same_dtype("out", out, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  if (x.shape[x.ndim - 1] % 2 != 0)
    chk.fail("x", "an even last axis (gate | up halves)", "shape " + detail::dims_string(x));
  check_half_shape(chk, "out", out, x);
  const detail::Rows xr = chk.rows("x", x), orr = chk.rows("out", out);
  if (out.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("out", out);
  const int64_t h = orr.cols;
  const size_t es = dtype_size(x.dtype);
  Ptrs p{x.data, static_cast<const char*>(x.data) + h * es, nullptr, out.data, nullptr,
         xr.pitch, xr.pitch, 0, orr.pitch, 0};
  launch<Mode::glu_fwd>(op, act, x.dtype, p, orr.rows, h, stream);
}

void fused_backward(const char* op, Act act, const Tensor& x, const Tensor& dout, Tensor& dx,
                    cudaStream_t stream) {
  detail::OpCheck chk(op);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("dout", dout, kFloat);
  chk.dtype_in("dx", dx, kFloat);
  chk.same_dtype("dout", dout, "x", x);
  chk.same_dtype("dx", dx, "x", x);
  chk.rank_in("x", x, 1, kMaxDims);
  if (x.shape[x.ndim - 1] % 2 != 0)
    chk.fail("x", "an even last axis (gate | up halves)", "shape " + detail::dims_string(x));
  check_half_shape(chk, "dout", dout, x);
  chk.same_shape("dx", dx, "x", x);
  const detail::Rows xr = chk.rows("x", x), gr = chk.rows("dout", dout), dr = chk.rows("dx", dx);
  if (dout.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("dout", dout);
  chk.device_pointer("dx", dx);
  const int64_t h = gr.cols;
  const size_t es = dtype_size(x.dtype);
  Ptrs p{x.data, static_cast<const char*>(x.data) + h * es, dout.data, dx.data,
         static_cast<char*>(dx.data) + h * es, xr.pitch, xr.pitch, gr.pitch, dr.pitch, dr.pitch};
  launch<Mode::glu_bwd>(op, act, x.dtype, p, gr.rows, h, stream);
}

void split_forward(const char* op, Act act, const Tensor& gate, const Tensor& up, Tensor& out,
                   cudaStream_t stream) {
  detail::OpCheck chk(op);
  chk.dtype_in("gate", gate, kFloat);
  chk.dtype_in("up", up, kFloat);
  chk.dtype_in("out", out, kFloat);
  chk.same_dtype("up", up, "gate", gate);
  chk.same_dtype("out", out, "gate", gate);
  chk.rank_in("gate", gate, 1, kMaxDims);
  chk.same_shape("up", up, "gate", gate);
  chk.same_shape("out", out, "gate", gate);
  const detail::Rows ar = chk.rows("gate", gate), br = chk.rows("up", up), orr = chk.rows("out", out);
  if (gate.numel() == 0) return;
  chk.device_pointer("gate", gate);
  chk.device_pointer("up", up);
  chk.device_pointer("out", out);
  Ptrs p{gate.data, up.data, nullptr, out.data, nullptr, ar.pitch, br.pitch, 0, orr.pitch, 0};
  launch<Mode::glu_fwd>(op, act, gate.dtype, p, ar.rows, ar.cols, stream);
}

void split_backward(const char* op, Act act, const Tensor& gate, const Tensor& up,
                    const Tensor& dout, Tensor& dgate, Tensor& dup, cudaStream_t stream) {
  detail::OpCheck chk(op);
  chk.dtype_in("gate", gate, kFloat);
  chk.dtype_in("up", up, kFloat);
  chk.dtype_in("dout", dout, kFloat);
  chk.dtype_in("dgate", dgate, kFloat);
  chk.dtype_in("dup", dup, kFloat);
  chk.same_dtype("up", up, "gate", gate);
  chk.same_dtype("dout", dout, "gate", gate);
  chk.same_dtype("dgate", dgate, "gate", gate);
  chk.same_dtype("dup", dup, "gate", gate);
  chk.rank_in("gate", gate, 1, kMaxDims);
  chk.same_shape("up", up, "gate", gate);
  chk.same_shape("dout", dout, "gate", gate);
  chk.same_shape("dgate", dgate, "gate", gate);
  chk.same_shape("dup", dup, "gate", gate);
  const detail::Rows ar = chk.rows("gate", gate), br = chk.rows("up", up),
                     gr = chk.rows("dout", dout), d0 = chk.rows("dgate", dgate),
                     d1 = chk.rows("dup", dup);
  if (gate.numel() == 0) return;
  chk.device_pointer("gate", gate);
  chk.device_pointer("up", up);
  chk.device_pointer("dout", dout);
  chk.device_pointer("dgate", dgate);
  chk.device_pointer("dup", dup);
  Ptrs p{gate.data, up.data, dout.data, dgate.data, dup.data,
         ar.pitch,  br.pitch, gr.pitch,  d0.pitch,   d1.pitch};
  launch<Mode::glu_bwd>(op, act, gate.dtype, p, ar.rows, ar.cols, stream);
}

}  // namespace

const char* gelu_approx_name(GeluApprox a) {
  return a == GeluApprox::none ? "none" : a == GeluApprox::tanh ? "tanh" : "unknown";
}

void silu_and_mul(const Tensor& x, Tensor& out, cudaStream_t stream) {
  fused_forward("silu_and_mul", Act::silu, x, out, stream);
}
void silu_and_mul_backward(const Tensor& x, const Tensor& dout, Tensor& dx, cudaStream_t stream) {
  fused_backward("silu_and_mul_backward", Act::silu, x, dout, dx, stream);
}
void gelu_and_mul(const Tensor& x, Tensor& out, GeluApprox approx, cudaStream_t stream) {
  check_approx(detail::OpCheck("gelu_and_mul"), approx);
  fused_forward("gelu_and_mul", act_of(approx), x, out, stream);
}
void gelu_and_mul_backward(const Tensor& x, const Tensor& dout, Tensor& dx, GeluApprox approx,
                           cudaStream_t stream) {
  check_approx(detail::OpCheck("gelu_and_mul_backward"), approx);
  fused_backward("gelu_and_mul_backward", act_of(approx), x, dout, dx, stream);
}
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t stream) {
  split_forward("swiglu", Act::silu, gate, up, out, stream);
}
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                     Tensor& dup, cudaStream_t stream) {
  split_backward("swiglu_backward", Act::silu, gate, up, dout, dgate, dup, stream);
}
void geglu(const Tensor& gate, const Tensor& up, Tensor& out, GeluApprox approx,
           cudaStream_t stream) {
  check_approx(detail::OpCheck("geglu"), approx);
  split_forward("geglu", act_of(approx), gate, up, out, stream);
}
void geglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                    Tensor& dup, GeluApprox approx, cudaStream_t stream) {
  check_approx(detail::OpCheck("geglu_backward"), approx);
  split_backward("geglu_backward", act_of(approx), gate, up, dout, dgate, dup, stream);
}

void gelu(const Tensor& x, Tensor& y, GeluApprox approx, cudaStream_t stream) {
  detail::OpCheck chk("gelu");
  check_approx(chk, approx);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("y", y, kFloat);
  chk.same_dtype("y", y, "x", x);
  chk.same_shape("y", y, "x", x);
  const detail::Rows xr = chk.rows("x", x), yr = chk.rows("y", y);
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("y", y);
  Ptrs p{x.data, nullptr, nullptr, y.data, nullptr, xr.pitch, 0, 0, yr.pitch, 0};
  launch<Mode::act_fwd>("gelu", act_of(approx), x.dtype, p, xr.rows, xr.cols, stream);
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluApprox approx,
                   cudaStream_t stream) {
  detail::OpCheck chk("gelu_backward");
  check_approx(chk, approx);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("dy", dy, kFloat);
  chk.dtype_in("dx", dx, kFloat);
  chk.same_dtype("dy", dy, "x", x);
  chk.same_dtype("dx", dx, "x", x);
  chk.same_shape("dy", dy, "x", x);
  chk.same_shape("dx", dx, "x", x);
  const detail::Rows xr = chk.rows("x", x), gr = chk.rows("dy", dy), dr = chk.rows("dx", dx);
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("dy", dy);
  chk.device_pointer("dx", dx);
  Ptrs p{x.data, nullptr, dy.data, dx.data, nullptr, xr.pitch, 0, gr.pitch, dr.pitch, 0};
  launch<Mode::act_bwd>("gelu_backward", act_of(approx), x.dtype, p, xr.rows, xr.cols, stream);
}

}  // namespace tessel
