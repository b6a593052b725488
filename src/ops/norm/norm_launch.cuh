// Host side of the norm family: argument checks shared by the three norms and the launchers
// of the kernels in norm_kernels.cuh.
#pragma once

#include <string>

#include "ops/norm/norm_kernels.cuh"
#include "runtime/launch.cuh"
#include "runtime/workspace.hpp"

namespace tessel::norm {

using detail::OpCheck;

inline void check_eps(const OpCheck& chk, float eps) {
  if (!(eps >= 0.f) || !std::isfinite(eps))
    chk.fail("eps", "a finite value >= 0", std::to_string(eps));
}

// A per-channel/per-column parameter: 1-D, `n` elements, dtype `dt`, contiguous.
inline void check_param(const OpCheck& chk, const char* arg, const Tensor& t, DType dt, int64_t n) {
  chk.dtype_in(arg, t, {DType::f32, DType::f16, DType::bf16});
  if (t.dtype != dt) chk.fail(arg, std::string("dtype ") + dtype_name(dt), dtype_name(t.dtype));
  chk.valid_layout(arg, t);
  if (t.ndim != 1 || t.shape[0] != n)
    chk.fail(arg, "shape (" + std::to_string(n) + ")", t.shape_string());
  chk.contiguous(arg, t);
}

// Per-row statistics: f32 with exactly `shape` (ndim dims), contiguous.
inline void check_stats(const OpCheck& chk, const char* arg, const Tensor& t, int ndim,
                        const int64_t* shape) {
  chk.dtype_in(arg, t, {DType::f32});
  chk.valid_layout(arg, t);
  bool ok = t.ndim == ndim;
  for (int d = 0; ok && d < ndim; ++d) ok = t.shape[d] == shape[d];
  if (!ok) {
    Tensor ref = Tensor::contiguous(nullptr, DType::f32, ndim, shape);
    chk.fail(arg, "shape " + ref.shape_string(), t.shape_string());
  }
  chk.contiguous(arg, t);
}

template <class KernelFn>
void launch(KernelFn kernel, unsigned grid, int block, size_t smem, int cluster,
            cudaStream_t stream, const NormArgs& a) {
  if (smem > 48 * 1024)
    TESSEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (cluster > 1) {
    if (cluster > 8)
      TESSEL_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  TESSEL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
}

template <class T, class C, Mode M>
void launch_fwd(const NormArgs& a, cudaStream_t stream) {
  constexpr int kGroups = C::BLOCK / C::THREADS;
  const int64_t ctas = std::min<int64_t>((a.rows + kGroups - 1) / kGroups, int64_t{1} << 16);
  launch(norm_fwd_kernel<T, C, M>, static_cast<unsigned>(ctas * C::CLUSTER), C::BLOCK, 0,
         C::CLUSTER, stream, a);
}

// RMS / RMS+residual / LayerNorm forward on register rows of fragments (norm_fwd_frags_kernel)
// when the row fits; false (nothing launched) otherwise: the caller uses launch_fwd.
template <class T, Mode M>
bool launch_fwd_frags(const NormArgs& a, bool vec_ok, cudaStream_t stream) {
  if (!vec_ok) return false;  // packed 16-byte vectors only
  return detail::dispatch_row_frags<kVec16<T>>(a.cols, true, [&](auto rc) {
    using RC = decltype(rc);
    if constexpr (PFrag<T, RC::VEC>::kPacked)
      TESSEL_CUDA_CHECK(detail::launch_dependent(norm_fwd_frags_kernel<T, RC, M>,
                                                 dim3(detail::row_grid<RC>(a.rows)),
                                                 dim3(RC::BLOCK), 0, stream, a));
  });
}

// Backward: persistent grid (one wave) so the dw/db partial slots stay few. Returns the
// number of slots written to a.ws (0 for group norm).
template <class T, class C, Mode M, int OCC>
int64_t bwd_slots(int64_t rows, int& cluster, unsigned& grid, size_t& smem) {
  constexpr int kGroups = C::BWD_BLOCK / C::THREADS;
  constexpr int kArrays = acc_arrays<C, M>();
  smem = static_cast<size_t>(kArrays) * C::kChunk * kGroups * sizeof(float);
  auto kernel = norm_bwd_kernel<T, C, M, OCC>;
  if (smem > 48 * 1024)
    TESSEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  int occ = 0;
  TESSEL_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, C::BWD_BLOCK, smem));
  occ = std::max(occ, 1);
  const int64_t wave = int64_t{detail::current_sm_count()} * occ;
  const int64_t needed_ctas = (rows + kGroups - 1) / kGroups * C::CLUSTER;
  if constexpr (C::CLUSTER > 1) {
    cluster = C::CLUSTER;
    int64_t clusters = std::max<int64_t>(1, std::min(needed_ctas, wave) / C::CLUSTER);
    const int64_t resident = max_active_clusters(kernel, C::BWD_BLOCK, smem, C::CLUSTER);
    if (resident > 0) clusters = std::min(clusters, resident);
    grid = static_cast<unsigned>(clusters * C::CLUSTER);
    return kArrays ? clusters : 0;
  } else if constexpr (kArrays > 0) {
    const int64_t ctas = std::min(needed_ctas, wave);
    cluster = ctas >= kAccCluster ? kAccCluster : 1;
    int64_t slots = std::max<int64_t>(1, ctas / cluster);
    if (cluster > 1) {
      const int64_t resident = max_active_clusters(kernel, C::BWD_BLOCK, smem, cluster);
      if (resident > 0) slots = std::min(slots, resident);
    }
    grid = static_cast<unsigned>(slots * cluster);
    return slots;
  } else {
    cluster = 1;
    grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(needed_ctas, int64_t{1} << 16)));
    return 0;
  }
}

// Runs the backward kernel, then (RMS/LN) sums the partial slots into dw (and db).
template <class T, class C, Mode M, int OCC>
void launch_bwd_occ(NormArgs a, void* dw, void* db, cudaStream_t stream) {
  int cluster = 1;
  unsigned grid = 1;
  size_t smem = 0;
  const int64_t slots = bwd_slots<T, C, M, OCC>(a.rows, cluster, grid, smem);
  constexpr int kArrays = acc_arrays<C, M>();
  // Own scratch, stream-ordered: every slot is written whole, so nothing needs zeroing (the
  // zeroed stream workspace cost a memset of the slots after the sums: 6.5 / 13 MB at
  // 16384 x 4096, RMS / LayerNorm).
  const detail::AsyncBuffer ws(static_cast<size_t>(kArrays) * slots * a.cols * sizeof(float),
                               stream);
  a.ws = ws.as<float>();
  launch(norm_bwd_kernel<T, C, M, OCC>, grid, C::BWD_BLOCK, smem, cluster, stream, a);
  if (kArrays > 0) launch_sum_slots<T>(a.ws, slots, a.cols, dw, db, stream);
}

template <class T, class C, Mode M>
void launch_bwd(NormArgs a, void* dw, void* db, cudaStream_t stream) {
  launch_bwd_occ<T, C, M, 512>(a, dw, db, stream);
}

template <class T, class F>
void with_cfg(int64_t cols, bool vec_ok, F&& f) {
  bool ok;
  if (vec_ok)
    ok = dispatch_cfg<kVec16<T>>(cols, f);
  else
    ok = dispatch_cfg<1>(cols, f);
  if (!ok) throw Error(TESSEL_ERROR_INTERNAL, "tessel: norm row too long after validation");
}

inline void check_cols(const OpCheck& chk, const char* arg, int64_t cols, const char* what) {
  if (cols > kMaxCols)
    throw Error(TESSEL_ERROR_UNSUPPORTED,
                std::string("tessel::") + chk.op() + ": argument '" + arg + "': expected " + what +
                    " <= " + std::to_string(kMaxCols) + ", got " + std::to_string(cols));
}

}  // namespace tessel::norm
