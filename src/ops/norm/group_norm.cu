// GroupNorm forward and backward, x (N, C, *spatial) dense.
// Each (n, g) is one "row" of cpg * HW contiguous elements (norm_kernels.cuh), so the forward
// and dx read the input once. dw/db need per-channel sums over (n, hw): a second kernel
// re-reads x and dy per (n, c) (sums in a fixed order), then the slots are summed over n.
// Rows of >= 2048 elements with hw % VEC == 0 (16-byte aligned) take the shared-memory staged
// kernels of norm_staged.cuh instead: a cluster per row, x (and dy) read once, the backward's
// per-channel sums formed from the staged slices.
//   forward : y = (x - mean) * rstd * w[c] [+ b[c]]
//   backward: dx = rstd * (g - mean(g) - xhat * mean(g*xhat)), g = dy * w[c]
#include "ops/norm/norm_launch.cuh"
#include "ops/norm/norm_staged.cuh"
#include "runtime/workspace.hpp"
#include "tessel/norm.hpp"

namespace tessel {

using norm::Mode;
using norm::NormArgs;

namespace {
constexpr std::initializer_list<DType> kFloat = {DType::f32, DType::f16, DType::bf16};

struct GnShape {
  int64_t n = 0, c = 0, hw = 1, groups = 1, cpg = 1;
};

GnShape gn_shape(const detail::OpCheck& chk, const Tensor& x, int64_t groups) {
  chk.rank_in("x", x, 2, kMaxDims);
  GnShape s;
  s.n = x.shape[0];
  s.c = x.shape[1];
  for (int d = 2; d < x.ndim; ++d) s.hw *= x.shape[d];
  if (groups < 1 || (s.c > 0 && s.c % groups != 0) || (s.c == 0 && groups < 1))
    chk.fail("groups", "a positive divisor of C = " + std::to_string(s.c), std::to_string(groups));
  s.groups = groups;
  s.cpg = s.c / groups;
  return s;
}

// sums over hw of row (n, c): ws[row] = (sum dy*x - mean*sum dy) * rstd, ws[NC + row] = sum dy
template <class T, int VEC>
__global__ void __launch_bounds__(256)
    gn_channel_sums_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                           const float* __restrict__ mean, const float* __restrict__ rstd,
                           int64_t nc, int64_t hw, int cpg, float* __restrict__ ws) {
  using namespace tessel::tile;
  __shared__ float scratch[256 / 32];
  for (int64_t row = blockIdx.x; row < nc; row += gridDim.x) {
    const T* xr = x + row * hw;
    const T* gr = dy + row * hw;
    float s1 = 0.f, s2 = 0.f;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * VEC; c < hw; c += 256 * VEC) {
      const Frag<T, VEC> fx = load_frag_pred<VEC>(xr + c, hw - c, T{});
      const Frag<T, VEC> fg = load_frag_pred<VEC>(gr + c, hw - c, T{});
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float g = to_f32(fg.v[j]);
        s1 = fmaf(g, to_f32(fx.v[j]), s1);
        s2 += g;
      }
    }
    s1 = group_reduce<256, 256>(s1, SumOp{}, scratch);
    s2 = group_reduce<256, 256>(s2, SumOp{}, scratch);
    if (threadIdx.x == 0) {
      const int64_t st = row / cpg;
      ws[row] = (s1 - mean[st] * s2) * rstd[st];
      ws[nc + row] = s2;
    }
  }
}

}  // namespace

void group_norm(const Tensor& x, int64_t groups, const Tensor& w, const Tensor* b, Tensor& y,
                Tensor* mean, Tensor* rstd, float eps, cudaStream_t stream) {
  detail::OpCheck chk("group_norm");
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("y", y, kFloat);
  chk.same_dtype("y", y, "x", x);
  const GnShape s = gn_shape(chk, x, groups);
  norm::check_param(chk, "w", w, x.dtype, s.c);
  if (b) norm::check_param(chk, "b", *b, x.dtype, s.c);
  chk.same_shape("y", y, "x", x);
  const int64_t st_shape[2] = {s.n, s.groups};
  if (mean) norm::check_stats(chk, "mean", *mean, 2, st_shape);
  if (rstd) norm::check_stats(chk, "rstd", *rstd, 2, st_shape);
  chk.contiguous("x", x);
  chk.contiguous("y", y);
  norm::check_eps(chk, eps);
  norm::check_cols(chk, "x", s.cpg * s.hw, "C / groups * prod(spatial)");
  if (x.numel() == 0) return;
  chk.device_pointer("x", x);
  chk.device_pointer("w", w);
  if (b) chk.device_pointer("b", *b);
  chk.device_pointer("y", y);
  if (mean) chk.device_pointer("mean", *mean);
  if (rstd) chk.device_pointer("rstd", *rstd);

  NormArgs a;
  a.x = x.data, a.w = w.data, a.b = b ? b->data : nullptr, a.y = y.data;
  a.mean = mean ? static_cast<float*>(mean->data) : nullptr;
  a.rstd = rstd ? static_cast<float*>(rstd->data) : nullptr;
  a.rows = s.n * s.groups, a.cols = s.cpg * s.hw, a.x_pitch = a.cols, a.y_pitch = a.cols;
  a.eps = eps, a.hw = s.hw, a.cpg = static_cast<int>(s.cpg), a.groups = static_cast<int>(s.groups);
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec =
        s.hw % tile::kVec16<T> == 0 && detail::aligned(x.data, 16) && detail::aligned(y.data, 16);
    if (norm::launch_fwd_staged<T, Mode::gn>(a, vec, stream)) return;
    norm::with_cfg<T>(a.cols, vec,
                      [&](auto cfg) { norm::launch_fwd<T, decltype(cfg), Mode::gn>(a, stream); });
  });
  detail::check_launch("group_norm");
}

void group_norm_backward(const Tensor& dy, const Tensor& x, int64_t groups, const Tensor& w,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dw, Tensor* db,
                         cudaStream_t stream) {
  detail::OpCheck chk("group_norm_backward");
  chk.dtype_in("dy", dy, kFloat);
  chk.dtype_in("x", x, kFloat);
  chk.dtype_in("dx", dx, kFloat);
  chk.same_dtype("dy", dy, "x", x);
  chk.same_dtype("dx", dx, "x", x);
  const GnShape s = gn_shape(chk, x, groups);
  chk.same_shape("dy", dy, "x", x);
  norm::check_param(chk, "w", w, x.dtype, s.c);
  const int64_t st_shape[2] = {s.n, s.groups};
  norm::check_stats(chk, "mean", mean, 2, st_shape);
  norm::check_stats(chk, "rstd", rstd, 2, st_shape);
  chk.same_shape("dx", dx, "x", x);
  norm::check_param(chk, "dw", dw, x.dtype, s.c);
  if (db) norm::check_param(chk, "db", *db, x.dtype, s.c);
  chk.contiguous("dy", dy);
  chk.contiguous("x", x);
  chk.contiguous("dx", dx);
  norm::check_cols(chk, "x", s.cpg * s.hw, "C / groups * prod(spatial)");
  if (x.numel() == 0) {
    if (dw.numel() == 0) return;
    chk.device_pointer("dw", dw);
    if (db) chk.device_pointer("db", *db);
    TESSEL_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.nbytes(), stream));
    if (db) TESSEL_CUDA_CHECK(cudaMemsetAsync(db->data, 0, db->nbytes(), stream));
    return;
  }
  chk.device_pointer("dy", dy);
  chk.device_pointer("x", x);
  chk.device_pointer("w", w);
  chk.device_pointer("mean", mean);
  chk.device_pointer("rstd", rstd);
  chk.device_pointer("dx", dx);
  chk.device_pointer("dw", dw);
  if (db) chk.device_pointer("db", *db);

  NormArgs a;
  a.x = x.data, a.r = dy.data, a.w = w.data, a.y = dx.data;
  a.mean = static_cast<float*>(mean.data);
  a.rstd = static_cast<float*>(rstd.data);
  a.rows = s.n * s.groups, a.cols = s.cpg * s.hw;
  a.x_pitch = a.r_pitch = a.y_pitch = a.cols;
  a.hw = s.hw, a.cpg = static_cast<int>(s.cpg), a.groups = static_cast<int>(s.groups);
  const int64_t nc = s.n * s.c;
  detail::dispatch_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = s.hw % tile::kVec16<T> == 0 && detail::aligned(x.data, 16) &&
                     detail::aligned(dy.data, 16) && detail::aligned(dx.data, 16);
    // dw/db: per-(n, c) sums, then summed over n in order. Own scratch, stream-ordered: every
    // (n, c) is written, so nothing needs zeroing afterwards (the zeroed stream workspace cost
    // a memset launch per call).
    const detail::AsyncBuffer ws_buf(2 * static_cast<size_t>(nc) * sizeof(float), stream);
    float* ws = ws_buf.as<float>();
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(nc, int64_t{1} << 20));
    if (!norm::launch_gn_bwd_staged<T>(a, vec, ws, nc, stream)) {  // else: dx and ws in one pass
      norm::with_cfg<T>(a.cols, vec, [&](auto cfg) {
        norm::launch_bwd<T, decltype(cfg), Mode::gn>(a, nullptr, nullptr, stream);
      });
      if (vec)
        gn_channel_sums_kernel<T, tile::kVec16<T>><<<grid, 256, 0, stream>>>(
            static_cast<const T*>(x.data), static_cast<const T*>(dy.data), a.mean, a.rstd, nc, s.hw,
            a.cpg, ws);
      else
        gn_channel_sums_kernel<T, 1><<<grid, 256, 0, stream>>>(static_cast<const T*>(x.data),
                                                               static_cast<const T*>(dy.data),
                                                               a.mean, a.rstd, nc, s.hw, a.cpg, ws);
    }
    norm::launch_sum_slots<T>(ws, s.n, s.c, dw.data, db ? db->data : nullptr, stream);
  });
  detail::check_launch("group_norm_backward");
}

}  // namespace tessel
