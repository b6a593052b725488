// tessel::gemm: argument validation, kernel choice and launch (kernel in gemm_kernel.cuh).
//
// Instantiations (kept lean for 2-core CI): {bf16, f16} x {B (N,K), B (K,N)} x {128x256
// cluster 2x1, 128x128, 128x64 tiles}; the output dtype is a run-time switch inside the epilogue.
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <string>

#include "ops/gemm/gemm_kernel.cuh"
#include "tile/tile.cuh"
#include "runtime/check.hpp"
#include "tessel/gemm.hpp"

namespace tessel {
namespace {

using gemm_detail::GemmConfig;
using gemm_detail::GemmParams;
using tile::sm90::Major;
using tile::sm90::OutType;

int g_raster_group = 0;  // 0: heuristic below; > 0: forced (tuning hook, set_raster_group)

// 128x256 tiles in clusters of 2 along M (B multicast) when they fill the machine; else
// 128x128, else 128x64 tiles (small M: more CTAs streaming B).
template <class T, Major MB>
using BigTile = GemmConfig<T, MB, 128, 256, 64, 4, 2>;
template <class T, Major MB>
using MidTile = GemmConfig<T, MB, 128, 128, 64, 6, 1>;
template <class T, Major MB>
using SmallTile = GemmConfig<T, MB, 128, 64, 64, 8, 1>;

// Raster group: 8 cluster-tile rows walked together (a shape-dependent choice was tried and
// not confirmed by the suite runs; docs/gemm.md step 3).
template <class Cfg>
cudaError_t launch(const void* a, int64_t lda, const void* b, int64_t ldb, GemmParams p, int sms,
                   cudaStream_t stream) {
  p.group = g_raster_group > 0 ? g_raster_group : 8;
  return gemm_detail::launch_gemm<Cfg>(a, lda, b, ldb, p, sms, stream);
}

template <class T, Major MB>
void run(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
         cudaStream_t stream) {
  const int sms = detail::current_sm_count();
  const int64_t tiles_m = (p.m + 127) / 128;
  cudaError_t err;
  if (tiles_m * ((p.n + 255) / 256) >= sms)
    err = launch<BigTile<T, MB>>(a, lda, b, ldb, p, sms, stream);
  else if (tiles_m * ((p.n + 127) / 128) >= sms)
    err = launch<MidTile<T, MB>>(a, lda, b, ldb, p, sms, stream);
  else
    err = launch<SmallTile<T, MB>>(a, lda, b, ldb, p, sms, stream);
  TESSEL_CUDA_CHECK(err);
}

template <class T>
void run_layout(BLayout layout, const void* a, int64_t lda, const void* b, int64_t ldb,
                const GemmParams& p, cudaStream_t stream) {
  if (layout == BLayout::nk) run<T, Major::K>(a, lda, b, ldb, p, stream);
  else run<T, Major::MN>(a, lda, b, ldb, p, stream);
}

// K == 0: D = beta * C (or 0).
template <class TD>
__global__ void scale_kernel(TD* d, int64_t ldd, const TD* c, int64_t ldc, int m, int n,
                             float beta) {
  const int64_t total = int64_t{m} * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, col = i % n;
    const float v = c ? beta * tile::to_f32(c[r * ldc + col]) : 0.f;
    d[r * ldd + col] = tile::from_f32<TD>(v);
  }
}

template <class TD>
void scale(const Tensor& d, int64_t ldd, const Tensor* c, int64_t ldc, float beta,
           cudaStream_t stream) {
  const int m = static_cast<int>(d.shape[0]), n = static_cast<int>(d.shape[1]);
  const int64_t total = int64_t{m} * n;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  scale_kernel<TD><<<grid, 256, 0, stream>>>(static_cast<TD*>(d.data), ldd,
                                             c ? static_cast<const TD*>(c->data) : nullptr, ldc,
                                             m, n, beta);
  TESSEL_CUDA_CHECK(cudaGetLastError());
}

std::string dim_name(const char* what, int64_t v) { return std::string(what) + " = " + std::to_string(v); }

}  // namespace

namespace gemm_detail {
// Tuning hook for benchmarks (not public API): cluster-tile rows per raster group.
void set_raster_group(int group) { g_raster_group = group > 0 ? group : 0; }
}  // namespace gemm_detail

void gemm(const Tensor& a, const Tensor& b, Tensor& d, cudaStream_t stream, const GemmOptions& opt) {
  detail::OpCheck chk("gemm");
  const bool kn = opt.b_layout == BLayout::kn;
  const Tensor* c = opt.beta != 0.f ? opt.c : nullptr;
  // dtype
  chk.dtype_in("a", a, {DType::bf16, DType::f16});
  chk.same_dtype("b", b, "a", a);
  chk.dtype_in("d", d, {DType::f32, DType::f16, DType::bf16});
  if (opt.beta != 0.f && opt.c == nullptr)
    chk.fail("c", "a tensor when beta != 0", "none (beta = " + std::to_string(opt.beta) + ")");
  if (c) chk.same_dtype("c", *c, "d", d);
  // rank / shape
  chk.rank_in("a", a, 2, 2);
  chk.rank_in("b", b, 2, 2);
  chk.rank_in("d", d, 2, 2);
  if (c) chk.rank_in("c", *c, 2, 2);
  const int64_t M = a.shape[0], K = a.shape[1];
  const int64_t N = kn ? b.shape[1] : b.shape[0];
  const int64_t Kb = kn ? b.shape[0] : b.shape[1];
  if (Kb != K)
    chk.fail("b", std::string(kn ? "(K, N) with K = " : "(N, K) with K = ") + std::to_string(K) +
                      " (a's columns)",
             b.shape_string());
  if (d.shape[0] != M || d.shape[1] != N)
    chk.fail("d", "(M, N) = (" + std::to_string(M) + ", " + std::to_string(N) + ")", d.shape_string());
  if (c) chk.same_shape("c", *c, "d", d);
  if (N % 8 != 0) chk.fail("b", "N a multiple of 8", dim_name("N", N));
  if (K % 8 != 0) chk.fail("a", "K a multiple of 8", dim_name("K", K));
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (M >= kMaxDim || N >= kMaxDim || K >= kMaxDim)
    chk.fail("a", "M, N, K < 2^31", "(" + std::to_string(M) + ", " + std::to_string(N) + ", " +
                                        std::to_string(K) + ")");
  // strides / alignment
  const detail::Rows ar = chk.rows("a", a), br = chk.rows("b", b), dr = chk.rows("d", d);
  const detail::Rows cr = c ? chk.rows("c", *c) : detail::Rows{};
  auto pitch_ok = [&](const char* arg, const Tensor& t, const detail::Rows& r) {
    if (t.numel() == 0) return;
    if (r.rows > 1 && r.pitch % 8 != 0)
      chk.fail(arg, "row pitch a multiple of 8 elements", "pitch " + std::to_string(r.pitch));
    if (!detail::aligned(t.data, 16)) chk.fail(arg, "data pointer aligned to 16 bytes", "misaligned pointer");
  };
  pitch_ok("a", a, ar);
  pitch_ok("b", b, br);
  pitch_ok("d", d, dr);
  if (c) pitch_ok("c", *c, cr);
  if (M == 0 || N == 0) return;
  chk.device_pointer("a", a);
  chk.device_pointer("b", b);
  chk.device_pointer("d", d);
  if (c) chk.device_pointer("c", *c);

  const int64_t ldd = dr.rows > 1 ? dr.pitch : N;
  const int64_t ldc = c ? (cr.rows > 1 ? cr.pitch : N) : 0;
  if (K == 0) {
    switch (d.dtype) {
      case DType::f32: scale<float>(d, ldd, c, ldc, opt.beta, stream); break;
      case DType::f16: scale<__half>(d, ldd, c, ldc, opt.beta, stream); break;
      default: scale<__nv_bfloat16>(d, ldd, c, ldc, opt.beta, stream); break;
    }
    return;
  }

  GemmParams p;
  p.m = static_cast<int>(M);
  p.n = static_cast<int>(N);
  p.k = static_cast<int>(K);
  p.epi.d = d.data;
  p.epi.ldd = ldd;
  p.epi.c = c ? c->data : nullptr;
  p.epi.ldc = ldc;
  p.epi.alpha = opt.alpha;
  p.epi.beta = c ? opt.beta : 0.f;
  p.epi.out = d.dtype == DType::f32 ? OutType::f32 : d.dtype == DType::f16 ? OutType::f16 : OutType::bf16;
  const int64_t lda = ar.rows > 1 ? ar.pitch : K;
  const int64_t ldb = br.rows > 1 ? br.pitch : (kn ? N : K);
  if (a.dtype == DType::bf16) run_layout<cutlass::bfloat16_t>(opt.b_layout, a.data, lda, b.data, ldb, p, stream);
  else run_layout<cutlass::half_t>(opt.b_layout, a.data, lda, b.data, ldb, p, stream);
}

}  // namespace tessel
