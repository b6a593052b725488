// Cross-entropy forward + backward in one pass over the logits.
//
// Per row: max M, S = Σ exp(x - M), Σ x (label smoothing), x_t; then
//   loss    = M + log S - (1-ε)·x_t - (ε/V)·Σ x
//   dlogits = scale·(exp(x - M)/S - ε/V - (1-ε)·[j == t])
// Three kernels, by row length (16-bit dtypes; f32 rows hold half as many elements per byte
// but the same element counts apply):
//   group   : V ≤ 16384, a group of 32..1024 threads holds the row in registers (rows.cuh
//             RowConfig): logits read once, dlogits written once.
//   cluster : 16384 < V ≤ 131072, a thread-block cluster of ⌈V/16384⌉ ≤ 8 CTAs holds the row
//             in registers (512 threads × 32 elements each); the CTAs exchange their partial
//             (max, sum-exp, Σx) through distributed shared memory (one cluster barrier).
//             Logits read once, dlogits written once: 2·N·V·sizeof(T) bytes, the minimum.
//   stream  : longer rows, or rows that are not 16-byte aligned: one 1024-thread block per
//             row, an online max/sum sweep then a gradient sweep (logits read twice,
//             3·N·V·sizeof(T) bytes; the second read mostly hits L2 for rows ≲ 256 KB).
// Forward only (no dlogits) with V > 16384 and aligned rows: independent CTAs reduce
// 8192-column chunks to partial (max, sum-exp, Σx) and one warp per row merges them.
// Per-row losses go to fp32 scratch; a one-block finalize kernel writes the reduced loss in
// a fixed order (deterministic). Mean needs the non-ignored count before the gradient: a
// one-block count kernel runs first.
#include <cooperative_groups.h>

#include "ops/loss/loss_internal.hpp"
#include "ops/rows.cuh"
#include "runtime/workspace.hpp"
#include "tessel/loss.hpp"

namespace tessel {
namespace detail {
namespace {

namespace cg = cooperative_groups;
using namespace tessel::tile;

constexpr float kLog2e = 1.4426950408889634f;

struct CeArgs {
  const void* x;
  void* dx;
  int64_t rows, cols, x_pitch, dx_pitch;
  const void* targets;
  bool t64;
  int64_t ignore_index;
  float smoothing;
  float grad_scale;
  const float* count;
  float* row_loss;
};

__device__ __forceinline__ int64_t load_target(const CeArgs& a, int64_t row) {
  return a.t64 ? static_cast<const int64_t*>(a.targets)[row]
               : static_cast<int64_t>(static_cast<const int32_t*>(a.targets)[row]);
}

// Per-row constants once the row's statistics are known.
struct RowFinish {
  float m;        // max
  float inv;      // scale / S  (0 on ignored rows)
  float sub;      // scale · ε / V (0 on ignored rows)
  float hit;      // scale · (1 - ε), subtracted at the target column (0 on ignored rows)
  int64_t t;      // target column (-1 if none)
};

__device__ __forceinline__ float grad_scale(const CeArgs& a) {
  return a.count != nullptr ? a.grad_scale / *a.count : a.grad_scale;
}

// Computes the loss (written by the caller's elected thread) and the gradient constants.
__device__ __forceinline__ RowFinish finish_row(const CeArgs& a, int64_t t, float m, float s,
                                                float sumx, float xt, float* loss) {
  RowFinish f;
  f.m = m;
  const bool ignored = t == a.ignore_index;
  const bool valid = !ignored && t >= 0 && t < a.cols;
  const float eps = a.smoothing;
  const float lse = m + logf(s);
  if (ignored) *loss = 0.f;
  else if (!valid) *loss = __int_as_float(0x7fc00000);
  else *loss = lse - (1.f - eps) * xt - (eps / static_cast<float>(a.cols)) * sumx;
  const float scale = ignored ? 0.f : grad_scale(a);
  f.inv = scale / s;
  f.sub = scale * eps / static_cast<float>(a.cols);
  f.hit = scale * (1.f - eps);
  f.t = valid ? t : -1;
  return f;
}

__device__ __forceinline__ float grad_of(const RowFinish& f, float x, int64_t col) {
  float g = exp2f((x - f.m) * kLog2e) * f.inv - f.sub;
  return col == f.t ? g - f.hit : g;
}

// ---- group kernel: one group of THREADS threads per row ---------------------------------
template <class T, class Cfg>
__global__ void __launch_bounds__(Cfg::BLOCK) ce_group_kernel(CeArgs a) {
  __shared__ float scratch[Cfg::BLOCK / 32];
  const T* x = static_cast<const T*>(a.x);
  T* dx = static_cast<T*>(a.dx);
  using Slice = RowSlice<T, Cfg::VEC, Cfg::ITEMS, Cfg::THREADS>;
  for (RowGroups<Cfg::THREADS, Cfg::BLOCK> g; g.valid_block(a.rows); g.next()) {
    Slice s;
    int64_t t = a.ignore_index;
    float xt = 0.f;
    if (g.active) {
      s.load(x + g.row * a.x_pitch, a.cols, g.lane, -INFINITY);
      t = load_target(a, g.row);
      if (g.lane == 0 && t >= 0 && t < a.cols) xt = to_f32(x[g.row * a.x_pitch + t]);
    } else {
      s.map([](float) { return 0.f; });
    }
    const float m = group_reduce<Cfg::THREADS, Cfg::BLOCK>(s.fold(MaxOp{}), MaxOp{}, scratch);
    float se = 0.f, sx = 0.f;
#pragma unroll
    for (int i = 0; i < Cfg::ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::VEC; ++j) {
        se += exp2f((s.x[i][j] - m) * kLog2e);
        if (Slice::col(i, g.lane) + j < a.cols) sx += s.x[i][j];
      }
    se = group_reduce<Cfg::THREADS, Cfg::BLOCK>(se, SumOp{}, scratch);
    if (a.smoothing != 0.f) sx = group_reduce<Cfg::THREADS, Cfg::BLOCK>(sx, SumOp{}, scratch);
    float loss;
    const RowFinish f = finish_row(a, t, m, se, sx, xt, &loss);
    if (g.active && g.lane == 0) a.row_loss[g.row] = loss;
    if (dx != nullptr && g.active) {
#pragma unroll
      for (int i = 0; i < Cfg::ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::VEC; ++j)
          s.x[i][j] = grad_of(f, s.x[i][j], Slice::col(i, g.lane) + j);
      s.store(dx + g.row * a.dx_pitch, a.cols, g.lane);
    }
  }
}

// ---- cluster kernel: one cluster of CTAs per row -----------------------------------------
constexpr int kClusterBlock = 512;
constexpr int kClusterMax = 8;

template <class T>
struct ClusterCfg {
  static constexpr int VEC = kVec16<T>;
  static constexpr int ITEMS = 32 / VEC;
  static constexpr int64_t kCols = int64_t{kClusterBlock} * VEC * ITEMS;  // per CTA: 16384
};

template <class T>
__global__ void __launch_bounds__(kClusterBlock, 2) ce_cluster_kernel(CeArgs a) {
  using C = ClusterCfg<T>;
  using Slice = RowSlice<T, C::VEC, C::ITEMS, kClusterBlock>;
  __shared__ float scratch[kClusterBlock / 32];
  __shared__ float part[3];  // this CTA's (max, sum-exp relative to it, Σx)
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int csize = static_cast<int>(cluster.num_blocks());
  const int64_t row = blockIdx.x / csize;
  const T* xr = static_cast<const T*>(a.x) + row * a.x_pitch;
  const int64_t base = rank * C::kCols;
  const int lane = threadIdx.x;

  Slice s;
  s.load(xr + base, a.cols - base, lane, -INFINITY);
  const int64_t t = load_target(a, row);
  float xt = 0.f;
  if (rank == 0 && lane == 0 && t >= 0 && t < a.cols) xt = to_f32(xr[t]);  // before any write

  const float cm = group_reduce<kClusterBlock, kClusterBlock>(s.fold(MaxOp{}), MaxOp{}, scratch);
  float se = 0.f, sx = 0.f;
  const int rem = static_cast<int>(a.cols - base);  // columns of this CTA (may be <= 0)
  const float shift = cm == -INFINITY ? 0.f : cm;
#pragma unroll
  for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
    for (int j = 0; j < C::VEC; ++j) {
      se += exp2f((s.x[i][j] - shift) * kLog2e);
      if ((i * kClusterBlock + lane) * C::VEC + j < rem) sx += s.x[i][j];
    }
  se = group_reduce<kClusterBlock, kClusterBlock>(se, SumOp{}, scratch);
  if (a.smoothing != 0.f) sx = group_reduce<kClusterBlock, kClusterBlock>(sx, SumOp{}, scratch);
  if (lane == 0) {
    part[0] = cm;
    part[1] = se;
    part[2] = sx;
  }
  __shared__ float stats[3];  // the row's (max, sum-exp, Σx)
  cluster.sync();
  // Warp 0: lane r reads rank r's partial (one remote read per rank, not per thread), the
  // warp combines them with a fixed butterfly (deterministic) and publishes to shared memory.
  if (threadIdx.x < 32) {
    const int r = threadIdx.x;
    float pm = -INFINITY, ps = 0.f, px = 0.f;
    if (r < csize) {
      const float* p = cluster.map_shared_rank(part, r);
      pm = p[0];
      ps = p[1];
      px = p[2];
    }
    const float m = warp_reduce<32>(pm, MaxOp{});
    float sc = pm == -INFINITY ? 0.f : ps * exp2f((pm - m) * kLog2e);
    sc = warp_reduce<32>(sc, SumOp{});
    px = warp_reduce<32>(px, SumOp{});
    if (r == 0) {
      stats[0] = m;
      stats[1] = sc;
      stats[2] = px;
    }
  }
  __syncthreads();
  const float m = stats[0], S = stats[1], SX = stats[2];
  // No CTA may leave (and free its shared memory) while others still read it.
  cluster.barrier_arrive();
  float loss;
  const RowFinish f = finish_row(a, t, m, S, SX, xt, &loss);
  if (rank == 0 && lane == 0) a.row_loss[row] = loss;
  if (a.dx != nullptr) {
    const int tl = f.t >= base && f.t < base + C::kCols ? static_cast<int>(f.t - base) : -1;
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) {
        const float g = exp2f((s.x[i][j] - f.m) * kLog2e) * f.inv - f.sub;
        s.x[i][j] = (i * kClusterBlock + lane) * C::VEC + j == tl ? g - f.hit : g;
      }
    s.store(static_cast<T*>(a.dx) + row * a.dx_pitch + base, a.cols - base, lane);
  }
  cluster.barrier_wait();
}

// ---- stream kernel: one block per row, two sweeps ------------------------------------------
constexpr int kStreamBlock = 1024;

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamBlock) ce_stream_kernel(CeArgs a) {
  __shared__ float scratch[kStreamBlock / 32];
  using Slice = RowSlice<T, VEC, 1, kStreamBlock>;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = static_cast<const T*>(a.x) + row * a.x_pitch;
    const int64_t t = load_target(a, row);
    float xt = 0.f;
    if (threadIdx.x == 0 && t >= 0 && t < a.cols) xt = to_f32(xr[t]);
    float m = -INFINITY, se = 0.f, sx = 0.f;
    for (int64_t c0 = 0; c0 < a.cols; c0 += Slice::kCols) {
      Slice sl;
      sl.load(xr + c0, a.cols - c0, threadIdx.x, -INFINITY);
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (c0 + Slice::col(0, threadIdx.x) + j < a.cols) sx += sl.x[0][j];
      const float nm = fmaxf(m, sl.fold(MaxOp{}));
      if (nm != -INFINITY) {
        se *= exp2f((m - nm) * kLog2e);
        sl.map([&](float v) { return exp2f((v - nm) * kLog2e); });
        se += sl.fold(SumOp{});
        m = nm;
      }
    }
    const float bm = group_reduce<kStreamBlock, kStreamBlock>(m, MaxOp{}, scratch);
    const float part = m == -INFINITY ? 0.f : se * exp2f((m - bm) * kLog2e);
    const float S = group_reduce<kStreamBlock, kStreamBlock>(part, SumOp{}, scratch);
    if (a.smoothing != 0.f) sx = group_reduce<kStreamBlock, kStreamBlock>(sx, SumOp{}, scratch);
    float loss;
    const RowFinish f = finish_row(a, t, bm, S, sx, xt, &loss);
    if (threadIdx.x == 0) a.row_loss[row] = loss;
    if (a.dx != nullptr) {
      T* dr = static_cast<T*>(a.dx) + row * a.dx_pitch;
      for (int64_t c0 = 0; c0 < a.cols; c0 += Slice::kCols) {
        Slice sl;
        sl.load(xr + c0, a.cols - c0, threadIdx.x, 0.f);
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          sl.x[0][j] = grad_of(f, sl.x[0][j], c0 + Slice::col(0, threadIdx.x) + j);
        sl.store(dr + c0, a.cols - c0, threadIdx.x);
      }
    }
  }
}

// ---- forward only, long rows: independent CTAs over (row, chunk) + a combine kernel ------
// Without dlogits nothing needs the row held at once: each CTA reduces an 8192-column chunk
// to (max, Σexp(x - max), Σx) in a workspace, and one warp per row merges its chunks in chunk
// order (deterministic). No cluster barriers: the cluster kernel's per-row load → reduce →
// cluster.sync chain held the forward at 0.34 of copy bandwidth (H100, 4096 x 128256 bf16).
constexpr int kPartBlock = 256;

template <class T>
struct PartCfg {
  static constexpr int VEC = kVec16<T>;
  static constexpr int ITEMS = 32 / VEC;  // 32 elements (64 B bf16, 128 B f32) per thread
  static constexpr int64_t kCols = int64_t{kPartBlock} * VEC * ITEMS;
};

template <class T>
__global__ void __launch_bounds__(kPartBlock)
    ce_fwd_part_kernel(CeArgs a, int chunks, float* part) {
  using C = PartCfg<T>;
  using Slice = RowSlice<T, C::VEC, C::ITEMS, kPartBlock>;
  __shared__ float scratch[kPartBlock / 32];
  const int64_t row = blockIdx.x / chunks;
  const int chunk = static_cast<int>(blockIdx.x % chunks);
  const int64_t base = chunk * C::kCols;
  const T* xr = static_cast<const T*>(a.x) + row * a.x_pitch + base;
  const int lane = threadIdx.x;
  const int64_t rem = a.cols - base;
  Slice s;
  s.load(xr, rem, lane, -INFINITY);
  const float cm = group_reduce<kPartBlock, kPartBlock>(s.fold(MaxOp{}), MaxOp{}, scratch);
  const float shift = cm == -INFINITY ? 0.f : cm;
  float se = 0.f, sx = 0.f;
#pragma unroll
  for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
    for (int j = 0; j < C::VEC; ++j) {
      se += exp2f((s.x[i][j] - shift) * kLog2e);
      if (Slice::col(i, lane) + j < rem) sx += s.x[i][j];
    }
  se = group_reduce<kPartBlock, kPartBlock>(se, SumOp{}, scratch);
  if (a.smoothing != 0.f) sx = group_reduce<kPartBlock, kPartBlock>(sx, SumOp{}, scratch);
  if (lane == 0) {
    float* p = part + (row * chunks + chunk) * 3;
    p[0] = cm;
    p[1] = se;
    p[2] = sx;
  }
}

template <class T>
__global__ void __launch_bounds__(256)
    ce_fwd_combine_kernel(CeArgs a, int chunks, const float* part) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) return;  // the whole warp
  float m = -INFINITY, se = 0.f, sx = 0.f;
  for (int c = lane; c < chunks; c += 32) {  // online merge, chunk order per lane
    const float* p = part + (row * chunks + c) * 3;
    const float pm = p[0], nm = fmaxf(m, pm);
    if (nm != -INFINITY) {
      se = (m == -INFINITY ? 0.f : se * exp2f((m - nm) * kLog2e)) +
           (pm == -INFINITY ? 0.f : p[1] * exp2f((pm - nm) * kLog2e));
      m = nm;
    }
    sx += p[2];
  }
  const float M = warp_reduce<32>(m, MaxOp{});
  float S = m == -INFINITY ? 0.f : se * exp2f((m - M) * kLog2e);
  S = warp_reduce<32>(S, SumOp{});
  sx = warp_reduce<32>(sx, SumOp{});
  if (lane == 0) {
    const int64_t t = load_target(a, row);
    const T* xr = static_cast<const T*>(a.x) + row * a.x_pitch;
    const float xt = t >= 0 && t < a.cols ? to_f32(xr[t]) : 0.f;
    float loss;
    finish_row(a, t, M, S, sx, xt, &loss);
    a.row_loss[row] = loss;
  }
}

template <class T>
void fwd_chunked(const CeArgs& a, cudaStream_t stream) {
  const int chunks = static_cast<int>((a.cols + PartCfg<T>::kCols - 1) / PartCfg<T>::kCols);
  void* part = nullptr;
  // Own scratch: the caller's count / row-loss pointers live in stream_workspace, which a
  // request here could grow (and free).
  TESSEL_CUDA_CHECK(cudaMallocAsync(&part, size_t(a.rows) * chunks * 3 * sizeof(float), stream));
  ce_fwd_part_kernel<T><<<static_cast<unsigned>(a.rows * chunks), kPartBlock, 0, stream>>>(
      a, chunks, static_cast<float*>(part));
  ce_fwd_combine_kernel<T><<<static_cast<unsigned>((a.rows + 7) / 8), 256, 0, stream>>>(
      a, chunks, static_cast<const float*>(part));
  TESSEL_CUDA_CHECK(cudaFreeAsync(part, stream));
}

// ---- count and finalize (one block each; deterministic order) ----------------------------
constexpr int kSmallBlock = 1024;

__global__ void __launch_bounds__(kSmallBlock)
    ce_count_kernel(const void* targets, bool t64, int64_t n, int64_t ignore, float* count) {
  __shared__ float scratch[kSmallBlock / 32];
  float c = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kSmallBlock) {
    const int64_t t = t64 ? static_cast<const int64_t*>(targets)[i]
                          : static_cast<int64_t>(static_cast<const int32_t*>(targets)[i]);
    c += t != ignore ? 1.f : 0.f;
  }
  c = group_reduce<kSmallBlock, kSmallBlock>(c, SumOp{}, scratch);
  if (threadIdx.x == 0) *count = c;
}

template <class O>
__global__ void __launch_bounds__(kSmallBlock)
    ce_finalize_kernel(float* row_loss, float* count, int64_t n, int reduction, O* out) {
  __shared__ float scratch[kSmallBlock / 32];
  if (reduction == static_cast<int>(Reduction::none)) {
    for (int64_t i = threadIdx.x; i < n; i += kSmallBlock) {
      out[i] = from_f32<O>(row_loss[i]);
      row_loss[i] = 0.f;
    }
    if (threadIdx.x == 0 && count != nullptr) *count = 0.f;
    return;
  }
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kSmallBlock) {
    s += row_loss[i];
    row_loss[i] = 0.f;
  }
  s = group_reduce<kSmallBlock, kSmallBlock>(s, SumOp{}, scratch);
  if (threadIdx.x == 0) {
    if (reduction == static_cast<int>(Reduction::mean)) s /= *count;
    out[0] = from_f32<O>(s);
    if (count != nullptr) *count = 0.f;
  }
}

template <class T>
bool try_cluster(const CeArgs& a, cudaStream_t stream) {
  using C = ClusterCfg<T>;
  const int64_t csize = (a.cols + C::kCols - 1) / C::kCols;
  if (csize < 2 || csize > kClusterMax) return false;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.rows * csize));
  cfg.blockDim = dim3(kClusterBlock);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(csize);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, ce_cluster_kernel<T>, a) == cudaSuccess;
}

}  // namespace

void ce_launch(const CeLaunch& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  CeArgs a{p.x,     p.dx,          p.rows,         p.cols,      p.x_pitch, p.dx_pitch,
           p.targets, p.targets_i64, p.ignore_index, p.smoothing, p.grad_scale, p.count,
           p.row_loss};
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec_ok =
        p.dx != nullptr
            ? rows_vectorizable<T>(p.cols, {{p.x, p.x_pitch}, {p.dx, p.dx_pitch}})
            : rows_vectorizable<T>(p.cols, {{p.x, p.x_pitch}});
    const bool grouped = dispatch_row_config<kVec16<T>>(p.cols, vec_ok, [&](auto cfg) {
      using Cfg = decltype(cfg);
      ce_group_kernel<T, Cfg><<<row_grid<Cfg>(p.rows), Cfg::BLOCK, 0, stream>>>(a);
    });
    if (grouped) return;
    // Forward only: independent chunk CTAs (grid x is 2^31 - 1: rows * chunks must fit).
    if (p.dx == nullptr && vec_ok &&
        p.rows * ((p.cols + PartCfg<T>::kCols - 1) / PartCfg<T>::kCols) < (int64_t{1} << 31)) {
      fwd_chunked<T>(a, stream);
      return;
    }
    if (vec_ok && p.rows <= (int64_t{1} << 28) && try_cluster<T>(a, stream)) return;
    cudaGetLastError();  // a refused cluster launch falls back to streaming
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(p.rows, int64_t{current_sm_count()} * 64));
    if (vec_ok) ce_stream_kernel<T, kVec16<T>><<<grid, kStreamBlock, 0, stream>>>(a);
    else ce_stream_kernel<T, 1><<<grid, kStreamBlock, 0, stream>>>(a);
  });
}

void ce_count(const void* targets, bool i64, int64_t n, int64_t ignore_index, float* count,
              cudaStream_t stream) {
  ce_count_kernel<<<1, kSmallBlock, 0, stream>>>(targets, i64, n, ignore_index, count);
}

void ce_finalize(const float*, float* row_loss, float* count, int64_t n, Reduction reduction,
                 void* out, DType out_dtype, cudaStream_t stream) {
  dispatch_float_dtype(out_dtype, [&](auto tag) {
    using O = decltype(tag);
    ce_finalize_kernel<O><<<1, kSmallBlock, 0, stream>>>(row_loss, count, n,
                                                         static_cast<int>(reduction),
                                                         static_cast<O*>(out));
  });
}

}  // namespace detail

// ---- public op ---------------------------------------------------------------------------
namespace {

void check_loss_out(const detail::OpCheck& chk, const Tensor& loss, DType logits_dtype,
                    int64_t n, Reduction reduction) {
  if (loss.dtype != DType::f32 && loss.dtype != logits_dtype)
    chk.fail("loss", std::string("dtype f32 or ") + dtype_name(logits_dtype),
             dtype_name(loss.dtype));
  chk.valid_layout("loss", loss);
  if (reduction == Reduction::none) {
    if (loss.ndim != 1 || loss.shape[0] != n)
      chk.fail("loss", "shape (" + std::to_string(n) + ",) for reduction none",
               loss.shape_string());
  } else if (!(loss.ndim == 0 || (loss.ndim == 1 && loss.shape[0] == 1))) {
    chk.fail("loss", "one element (shape () or (1,)) for reduction mean/sum", loss.shape_string());
  }
  chk.contiguous("loss", loss);
}

}  // namespace

namespace detail {
// Shared by cross_entropy and fused_linear_cross_entropy.
void check_ce_options(const OpCheck& chk, const CrossEntropyOptions& opt) {
  const int r = static_cast<int>(opt.reduction);
  if (r < 0 || r > 2) chk.fail("reduction", "none (0), mean (1) or sum (2)", std::to_string(r));
  if (!(opt.label_smoothing >= 0.f && opt.label_smoothing <= 1.f))
    chk.fail("label_smoothing", "a value in [0, 1]", std::to_string(opt.label_smoothing));
}
void check_ce_targets(const OpCheck& chk, const Tensor& targets, int64_t n) {
  chk.dtype_in("targets", targets, {DType::i32, DType::i64});
  chk.valid_layout("targets", targets);
  if (targets.ndim != 1 || targets.shape[0] != n)
    chk.fail("targets", "shape (" + std::to_string(n) + ",)", targets.shape_string());
  chk.contiguous("targets", targets);
}
void check_ce_loss(const OpCheck& chk, const Tensor& loss, DType dt, int64_t n, Reduction r) {
  check_loss_out(chk, loss, dt, n, r);
}
}  // namespace detail

void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor* dlogits,
                   cudaStream_t stream, const CrossEntropyOptions& opt) {
  detail::OpCheck chk("cross_entropy");
  chk.dtype_in("logits", logits, {DType::f32, DType::f16, DType::bf16});
  detail::check_ce_options(chk, opt);
  if (dlogits != nullptr) {
    chk.dtype_in("dlogits", *dlogits, {DType::f32, DType::f16, DType::bf16});
    chk.same_dtype("dlogits", *dlogits, "logits", logits);
  }
  chk.valid_layout("logits", logits);
  if (logits.ndim != 2) chk.fail("logits", "a 2-D tensor (N, V)", logits.shape_string());
  const int64_t n = logits.shape[0];
  const int64_t v = logits.shape[1];
  detail::check_ce_targets(chk, targets, n);
  detail::check_ce_loss(chk, loss, logits.dtype, n, opt.reduction);
  if (dlogits != nullptr) chk.same_shape("dlogits", *dlogits, "logits", logits);
  const detail::Rows xr = chk.rows("logits", logits);
  detail::Rows dr{};
  if (dlogits != nullptr) dr = chk.rows("dlogits", *dlogits);
  if (n == 0) return;
  if (v == 0) chk.fail("logits", "at least one class (V >= 1)", logits.shape_string());
  chk.device_pointer("logits", logits);
  chk.device_pointer("targets", targets);
  chk.device_pointer("loss", loss);
  if (dlogits != nullptr) chk.device_pointer("dlogits", *dlogits);

  const bool mean = opt.reduction == Reduction::mean;
  // Scratch: [count, pad×3, row_loss × n], left zeroed by the finalize kernel.
  float* ws = static_cast<float*>(detail::stream_workspace(stream, (4 + size_t(n)) * sizeof(float)));
  float* count = ws;
  float* row_loss = ws + 4;
  if (mean)
    detail::ce_count(targets.data, targets.dtype == DType::i64, n, opt.ignore_index, count, stream);
  detail::CeLaunch p;
  p.dtype = logits.dtype;
  p.x = logits.data;
  p.dx = dlogits != nullptr ? dlogits->data : nullptr;
  p.rows = n;
  p.cols = v;
  p.x_pitch = xr.pitch;
  p.dx_pitch = dlogits != nullptr ? dr.pitch : 0;
  p.targets = targets.data;
  p.targets_i64 = targets.dtype == DType::i64;
  p.ignore_index = opt.ignore_index;
  p.smoothing = opt.label_smoothing;
  p.grad_scale = opt.grad_scale;
  p.count = mean ? count : nullptr;
  p.row_loss = row_loss;
  detail::ce_launch(p, stream);
  detail::check_launch("cross_entropy");
  detail::ce_finalize(row_loss, row_loss, count, n, opt.reduction, loss.data, loss.dtype, stream);
  detail::check_launch("cross_entropy");
}

}  // namespace tessel
