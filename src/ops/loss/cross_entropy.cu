// Cross-entropy forward + backward in one pass over the logits.
//
// Per row: max M, S = Σ exp(x - M), Σ x (label smoothing), x_t; then
//   loss    = M + log S - (1-ε)·x_t - (ε/V)·Σ x
//   dlogits = scale·(exp(x - M)/S - ε/V - (1-ε)·[j == t])
// Kernels, by row length:
//   group   : V ≤ 16384, a group of 32..1024 threads holds the row in registers (rows.cuh
//             RowConfig): logits read once, dlogits written once.
//   slices  : V > 16384, 16-byte aligned rows of ≤ 32 × 200 KB: ⌈row bytes / 48 KB⌉ CTAs per
//             row, each bulk-copying (TMA) its slice of the row into shared memory; a
//             thread-block cluster of ≤ 8 CTAs per row whose CTAs push their partial (max,
//             Σexp, Σx, x_t) into every rank's shared memory (st.async, ce_cluster_kernel) and
//             write dlogits from shared memory. Logits read once, dlogits written once:
//             2·N·V·sizeof(T) bytes, the minimum (forward only: N·V·sizeof(T)).
//             Rows of more than 8 slices, or TESSEL_CE_EXCHANGE=global: the same slices on
//             independent CTAs exchanging through global memory (ops/slice_exchange.cuh,
//             ce_exchange_kernel; up to 32 slices). H200, 4096 x 128256 bf16, three rounds
//             (session 33): cluster 0.877-0.896 of copy, global 0.80-0.85; the cluster kernel
//             with cluster barriers (before session 33) 0.73-0.78.
//   stream  : longer rows, or rows that are not 16-byte aligned: one 1024-thread block per
//             row, an online max/sum sweep then a gradient sweep (logits read twice,
//             3·N·V·sizeof(T) bytes; the second read mostly hits L2 for rows ≲ 256 KB).
// Forward only (no dlogits, so no CTA needs the row's statistics): the cluster kernel's slices
// on independent CTAs (ce_fwd_slice_kernel) write partial (max, sum-exp, Σx) and one warp per
// row merges them (H100, 4096 x 128256 bf16: 0.99 of copy bandwidth, the cluster kernel 0.77:
// a cluster holds all its CTAs until the slowest has reduced and starts only where all fit one
// GPC); rows past the slices (aligned rows over 1.6 MB, or 2^31 CTAs): 8192-column chunks on
// register loads, merged the same way. Per-row losses go to fp32 scratch; a one-block finalize
// kernel writes the reduced loss in a fixed order (deterministic). Mean needs the non-ignored count
// before the gradient: a one-block count kernel runs first.
#include <cooperative_groups.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops/bulk_copy.cuh"
#include "ops/loss/loss_internal.hpp"
#include "ops/rows.cuh"
#include "ops/slice_exchange.cuh"
#include "runtime/launch.cuh"
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
  float m;    // max
  float inv;  // scale / S  (0 on ignored rows)
  float sub;  // scale · ε / V (0 on ignored rows)
  float hit;  // scale · (1 - ε), subtracted at the target column (0 on ignored rows)
  int64_t t;  // target column (-1 if none)
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
  if (ignored)
    *loss = 0.f;
  else if (!valid)
    *loss = __int_as_float(0x7fc00000);
  else
    *loss = lse - (1.f - eps) * xt - (eps / static_cast<float>(a.cols)) * sumx;
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

// ---- instruction-lean helpers of the cluster kernel -----------------------------------------
// At 6 CTAs per SM the cluster kernel is issue-bound, not memory-bound, unless every element
// costs few instructions: one MUFU.EX2 without exp2f's denormal scaling, packed 16-bit max,
// packed f32 -> 16-bit conversion on store.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class T>
using Pair = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;

// Running max over whole fragments, kept packed for 16-bit types: two 3-input VHMNMX per
// 16-byte fragment, unpacked once per piece (unpacking every fragment cost ~7 instructions).
// Same NaN rule as fmaxf (a NaN operand yields the other one).
template <class T, int VEC>
struct FragMax {
  using Acc = std::conditional_t<std::is_same_v<T, float>, float, Pair<T>>;
  Acc m;
  __device__ __forceinline__ FragMax() {
    if constexpr (std::is_same_v<T, float>)
      m = -INFINITY;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
      m = __float2bfloat162_rn(-INFINITY);
    else
      m = __float2half2_rn(-INFINITY);
  }
  __device__ __forceinline__ void add(const Frag<T, VEC>& f) {
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = fmaxf(m, f.v[j]);
    } else {
      const Pair<T>* p = reinterpret_cast<const Pair<T>*>(f.v);
#pragma unroll
      for (int k = 0; k < VEC / 2; k += 2) m = __hmax2(__hmax2(m, p[k]), p[k + 1]);
    }
  }
  __device__ __forceinline__ float value() const {
    if constexpr (std::is_same_v<T, float>)
      return m;
    else
      return fmaxf(to_f32(m.x), to_f32(m.y));
  }
};

// A fragment in fp32. bf16 is the high half of an fp32: the even element is one shift, the odd
// one a mask (to_f32 on the odd half compiles to PRMT + shift: 12 instructions per 8 elements,
// here 8).
template <class T, int VEC>
__device__ __forceinline__ void frag_f32(const Frag<T, VEC>& f, float (&o)[VEC]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t w[VEC / 2];
    memcpy(w, f.v, sizeof(w));
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) {
      o[2 * k] = __uint_as_float(w[k] << 16);
      o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = to_f32(f.v[j]);
  }
}

template <class T, int VEC>
__device__ __forceinline__ Frag<T, VEC> pack_frag(const float (&g)[VEC]) {
  Frag<T, VEC> o;
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = g[j];
  } else {
    Pair<T>* q = reinterpret_cast<Pair<T>*>(o.v);
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>)
        q[k] = __floats2bfloat162_rn(g[2 * k], g[2 * k + 1]);
      else
        q[k] = __floats2half2_rn(g[2 * k], g[2 * k + 1]);
    }
  }
  return o;
}

// ---- cluster kernel: one cluster of CTAs per row, slices staged in shared memory ----------
// Each CTA bulk-copies (TMA) its slice of the row into shared memory in kPieces pieces, folds
// an online (max, Σexp) over each piece as it lands, exchanges the partials through
// distributed shared memory, then writes dlogits from shared memory. Slices of ~48 KB
// (kSliceTarget) keep 5 CTAs per SM at different phases, so one CTA's reductions overlap others'
// copies (H100, 4096 x 128256 bf16: the register version, 2 CTAs per SM with loads / reduce /
// stores in lockstep, 0.48 of copy bandwidth; this kernel 0.84-0.85 with 32 or 64 KB slices, 0.80
// with 16 KB; forward only 0.75 / 0.78-0.81 / 0.73).
constexpr int kClusterBlock = 256;
constexpr int kClusterMax = 8;
constexpr int kPieces = 4;
// Bytes per CTA. H200 sweep (docs/loss_optim.md, session 12), 4096 x 128256 bf16: 48 KB (6
// slices of 42 KB, 5 CTAs per SM) loss+dlogits 0.71-0.76 / forward only 1.00-1.01 of copy,
// against 0.68-0.69 / 0.96 at 40 KB, 0.70 / 0.89-0.90 at 64 KB (3 per SM), 0.69 / 0.90 at 56.
constexpr int64_t kSliceTarget = 48 * 1024;
// TESSEL_CE_SLICE_KB=n overrides the slice target (16 ... 192 KB; the H100 sweep, session 22).
inline int64_t slice_target() {
  static const int64_t bytes = [] {
    const char* e = std::getenv("TESSEL_CE_SLICE_KB");
    const int64_t kb = e ? std::atoll(e) : 0;
    return kb >= 16 && kb <= 192 ? kb * 1024 : kSliceTarget;
  }();
  return bytes;
}
constexpr int64_t kSliceMax = 200 * 1024;  // of the 227 KB an SM offers one CTA
constexpr int kCeSpinSleepNs = 1000;       // ce_exchange_kernel's poll interval (try_exchange)

// One CTA's slice of a row: bulk-copied into shared memory in kPieces pieces, folded into
// this thread's online (max m, Σexp relative to m, Σx with label smoothing) as pieces land.
template <class T>
struct SliceFold {
  float m = -INFINITY, se = 0.f, sx = 0.f;
};

template <class T>
__device__ __forceinline__ SliceFold<T> load_and_fold_slice(const T* xr, T* slice, int nv,
                                                            uint64_t (&bar)[kPieces], bool smooth) {
  constexpr int VEC = kVec16<T>;
  const int piece_v = (nv + kPieces - 1) / kPieces;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < kPieces; ++p) mbar_init(&bar[p], 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int p = 0; p < kPieces; ++p) {
      const int v0 = p * piece_v, v1 = min(nv, v0 + piece_v);
      if (v1 <= v0) break;
      const uint32_t bytes = static_cast<uint32_t>(v1 - v0) * 16u;
      mbar_arrive_expect_tx(&bar[p], bytes);
      bulk_copy_g2s(slice + v0 * VEC, xr + v0 * VEC, bytes, &bar[p]);
    }
  }
  SliceFold<T> r;
  for (int p = 0; p < kPieces; ++p) {
    const int v0 = p * piece_v, v1 = min(nv, v0 + piece_v);
    if (v1 <= v0) break;
    mbar_wait(&bar[p], 0);
    FragMax<T, VEC> fm;
    for (int v = v0 + threadIdx.x; v < v1; v += kClusterBlock) {
      const Frag<T, VEC> f = load_frag<VEC>(slice + v * VEC);
      fm.add(f);
      if (smooth) {
        float x[VEC];
        frag_f32(f, x);
#pragma unroll
        for (int j = 0; j < VEC; ++j) r.sx += x[j];
      }
    }
    const float nm = fmaxf(r.m, fm.value());
    if (nm == -INFINITY) continue;
    const float nms = nm * kLog2e;
    float ps0 = 0.f, ps1 = 0.f;  // two chains: the FADDs are the critical path per fragment
    for (int v = v0 + threadIdx.x; v < v1; v += kClusterBlock) {
      const Frag<T, VEC> f = load_frag<VEC>(slice + v * VEC);
      float x[VEC];
      frag_f32(f, x);
#pragma unroll
      for (int j = 0; j < VEC; j += 2) {
        ps0 += fast_exp2(fmaf(x[j], kLog2e, -nms));
        ps1 += fast_exp2(fmaf(x[j + 1], kLog2e, -nms));
      }
    }
    const float ps = ps0 + ps1;
    r.se = (r.m == -INFINITY ? 0.f : r.se * fast_exp2((r.m - nm) * kLog2e)) + ps;
    r.m = nm;
  }
  return r;
}

// Slice `rank` of `row` (`chunk` columns from base = rank · chunk, n of them inside the row):
// staged in shared memory, folded, and reduced over the CTA to its (max, Σexp relative to that
// max, Σx with label smoothing). Shared by the cluster, exchange and forward-only slice kernels.
template <class T>
struct SliceReduce {
  int64_t base;
  int n, nv;
  float m, s, sx;  // the CTA's max, Σexp(x - m), Σx (0 without smoothing)
};

template <class T>
__device__ __forceinline__ SliceReduce<T> reduce_slice(const CeArgs& a, int64_t row, int rank,
                                                       int chunk, T* slice,
                                                       uint64_t (&bar)[kPieces], float* scratch) {
  constexpr int VEC = kVec16<T>;
  SliceReduce<T> r;
  r.base = int64_t{rank} * chunk;
  const int64_t left = a.cols - r.base;
  r.n = left <= 0 ? 0 : left < chunk ? static_cast<int>(left) : chunk;
  r.nv = r.n / VEC;
  const T* xr = static_cast<const T*>(a.x) + row * a.x_pitch + r.base;
  const SliceFold<T> f = load_and_fold_slice(xr, slice, r.nv, bar, a.smoothing != 0.f);
  r.m = group_reduce<kClusterBlock, kClusterBlock>(f.m, MaxOp{}, scratch);
  const float s = f.m == -INFINITY ? 0.f : f.se * exp2f((f.m - r.m) * kLog2e);
  r.s = group_reduce<kClusterBlock, kClusterBlock>(s, SumOp{}, scratch);
  r.sx = a.smoothing != 0.f ? group_reduce<kClusterBlock, kClusterBlock>(f.sx, SumOp{}, scratch)
                            : f.sx;
  return r;
}

// Warp 0 merges the slices' partials (lane r holds slice r's; idle lanes -inf / 0) with a
// fixed butterfly (deterministic) and publishes the row's (max, Σexp, Σx, x_t) to `stats`.
__device__ __forceinline__ void merge_slice_partials(float pm, float ps, float px, float pt,
                                                     float* stats) {
  const float bm2 = warp_reduce<32>(pm, MaxOp{});
  float sc = pm == -INFINITY ? 0.f : ps * exp2f((pm - bm2) * kLog2e);
  sc = warp_reduce<32>(sc, SumOp{});
  px = warp_reduce<32>(px, SumOp{});
  pt = warp_reduce<32>(pt, SumOp{});  // one nonzero term: exact
  if (threadIdx.x == 0) {
    stats[0] = bm2;
    stats[1] = sc;
    stats[2] = px;
    stats[3] = pt;
  }
}

// dlogits of a CTA's slice (n columns from `base`, staged in shared memory) once the row's
// statistics are known: the cluster kernel and the exchange kernel share it.
template <class T>
__device__ __forceinline__ void write_slice_dlogits(const CeArgs& a, const RowFinish& f,
                                                    const T* slice, int64_t row, int64_t base,
                                                    int n, int nv) {
  constexpr int VEC = kVec16<T>;
  T* dr = static_cast<T*>(a.dx) + row * a.dx_pitch + base;
  const float ms = f.m == -INFINITY ? 0.f : f.m * kLog2e;
  // 16-bit outputs: the factor 1/S (with the reduction scale) moves into the exponent,
  // exp(x - M)·inv = 2^(x·log2e - (M·log2e - log2 inv)), one FFMA + one MUFU per element
  // (+ one FADD with label smoothing) instead of FFMA + MUFU + FFMA. The exponent's extra
  // rounding (~4e-6 relative) is far below the 16-bit output's; inv = 0 (ignored rows) gives
  // 2^-inf = 0 as before. fp32 outputs, and a negative or NaN inv (grad_scale < 0 or NaN),
  // keep the product.
  const bool fold = !std::is_same_v<T, float> && f.inv >= 0.f;
  const float mi = fold ? ms - log2f(f.inv) : ms;
  const float sub = f.sub;
  // One element's gradient without the target term, in one of three forms (kMode):
  // 0 folded without smoothing (sub is 0 and x - 0 = x exactly: no FADD), 1 folded, 2 product.
  auto grad = [&](float x, auto mode) {
    constexpr int kMode = decltype(mode)::value;
    if constexpr (kMode == 0)
      return fast_exp2(fmaf(x, kLog2e, -mi));
    else if constexpr (kMode == 1)
      return fast_exp2(fmaf(x, kLog2e, -mi)) - sub;
    else
      return fmaf(fast_exp2(fmaf(x, kLog2e, -mi)), f.inv, -sub);
  };
  // Pointers walk with the loop (unrolled, the four stores share one 64-bit address and
  // immediate offsets; indexing dr + v * VEC recomputed it per fragment: 4 instructions).
  // The target column's extra term is not tested per fragment: see below.
  auto sweep = [&](auto mode) {
    const T* sp = slice + threadIdx.x * VEC;
    T* dp = dr + threadIdx.x * VEC;
#pragma unroll 4
    for (int v = threadIdx.x; v < nv;
         v += kClusterBlock, sp += kClusterBlock * VEC, dp += kClusterBlock * VEC) {
      float x[VEC];
      frag_f32(load_frag<VEC>(sp), x);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = grad(x[j], mode);
      store_frag_global<VEC>(dp, pack_frag<T, VEC>(x));
    }
    // The thread that wrote the target's fragment writes it again with the term (same
    // thread, same address: program order keeps the second).
    const int64_t tl = f.t - base;
    if (tl >= 0 && tl < n) {
      const int tv = static_cast<int>(tl / VEC);
      if (tv % kClusterBlock == static_cast<int>(threadIdx.x)) {
        const int tj = static_cast<int>(tl % VEC);
        float x[VEC];
        frag_f32(load_frag<VEC>(slice + tv * VEC), x);
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[j] = grad(x[j], mode) - (j == tj ? f.hit : 0.f);
        store_frag_global<VEC>(dr + tv * VEC, pack_frag<T, VEC>(x));
      }
    }
  };
  if constexpr (std::is_same_v<T, float>) {
    sweep(std::integral_constant<int, 2>{});
  } else {
    if (!fold)
      sweep(std::integral_constant<int, 2>{});
    else if (sub != 0.f)
      sweep(std::integral_constant<int, 1>{});
    else
      sweep(std::integral_constant<int, 0>{});
  }
}

template <class T>
__global__ void __launch_bounds__(kClusterBlock) ce_cluster_kernel(CeArgs a, int chunk) {
  extern __shared__ __align__(128) unsigned char slice_raw[];
  T* slice = reinterpret_cast<T*>(slice_raw);
  __shared__ uint64_t bar[kPieces];
  __shared__ float scratch[kClusterBlock / 32];
  // Each rank's (max, Σexp relative to it, Σx, x_t if held there), pushed by that rank
  __shared__ float4 part[kClusterMax];
  __shared__ uint64_t part_bar;
  __shared__ float stats[4];  // the row's
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int csize = static_cast<int>(cluster.num_blocks());
  const int64_t row = blockIdx.x / csize;
  if (threadIdx.x == 0) {
    mbar_init(&part_bar, 1);
    mbar_init_fence();
    mbar_arrive_expect_tx(&part_bar, static_cast<uint32_t>(csize) * sizeof(float4));
  }
  // part_bar is initialized cluster-wide before any peer pushes into it: this arrive releases
  // the initialization (its fence), the wait sits just before the pushes.
  cluster_arrive_relaxed();
  const int64_t t = load_target(a, row);
  const SliceReduce<T> sr = reduce_slice(a, row, rank, chunk, slice, bar, scratch);
  const int64_t base = sr.base;
  const int n = sr.n, nv = sr.nv;
  cluster_wait();
  // Warp 0: lane r pushes this CTA's partial to rank r (st.async, completing on its part_bar),
  // waits for the csize partials, reads rank r's, and the warp combines them with a fixed
  // butterfly (deterministic). No cluster barrier after the reduction (cluster.sync released
  // in every thread) and no closing one: nothing reads a peer's shared memory, and every push
  // into this CTA has landed before it leaves.
  if (threadIdx.x < 32) {
    const int r = threadIdx.x;
    if (r < csize)
      st_async_f4(&part[rank], &part_bar, static_cast<uint32_t>(r),
                  make_float4(sr.m, sr.s, sr.sx,
                              t >= base && t < base + n ? to_f32(slice[t - base]) : 0.f));
    mbar_wait(&part_bar, 0);
    float pm = -INFINITY, ps = 0.f, px = 0.f, pt = 0.f;
    if (r < csize) {
      const float4 p = part[r];
      pm = p.x;
      ps = p.y;
      px = p.z;
      pt = p.w;
    }
    merge_slice_partials(pm, ps, px, pt, stats);
  }
  __syncthreads();
  float loss;
  const RowFinish f = finish_row(a, t, stats[0], stats[1], stats[2], stats[3], &loss);
  if (rank == 0 && threadIdx.x == 0) a.row_loss[row] = loss;
  if (a.dx != nullptr) write_slice_dlogits(a, f, slice, row, base, n, nv);
}

// Forward only, the same slices without a cluster: each CTA folds its slice and writes the
// partial (max, Σexp, Σx) like ce_fwd_part_kernel; ce_fwd_combine_kernel merges a row's
// slices in order. No cluster barrier: a CTA leaves as soon as its slice is reduced (the
// cluster kernel keeps all of a row's CTAs until the slowest has reduced and exchanged).
template <class T>
__global__ void __launch_bounds__(kClusterBlock)
    ce_fwd_slice_kernel(CeArgs a, int chunk, int slices, float* part) {
  extern __shared__ __align__(128) unsigned char slice_raw[];
  T* slice = reinterpret_cast<T*>(slice_raw);
  __shared__ uint64_t bar[kPieces];
  __shared__ float scratch[kClusterBlock / 32];
  const int64_t row = blockIdx.x / slices;
  const int rank = static_cast<int>(blockIdx.x % slices);
  const SliceReduce<T> sr = reduce_slice(a, row, rank, chunk, slice, bar, scratch);
  if (threadIdx.x == 0) {
    float* p = part + (row * slices + rank) * 3;
    p[0] = sr.m;
    p[1] = sr.s;
    p[2] = sr.sx;
  }
}

// Loss + dlogits with the cluster kernel's slices on independent CTAs, exchanging the partials
// (max, Σexp, Σx, x_t) through global memory (ops/slice_exchange.cuh) instead of distributed
// shared memory; merged like the cluster kernel's (bit-identical results). H200, 4096 x 128256
// bf16: 0.82-0.84 of copy against 0.75-0.78 with the cluster kernel of the time (session 26);
// the cluster kernel without cluster barriers (session 33) leads it, so this one takes rows of
// more than 8 slices only (or TESSEL_CE_EXCHANGE=global).
template <class T>
__global__ void __launch_bounds__(kClusterBlock)
    ce_exchange_kernel(CeArgs a, int chunk, int slices, float4* part, unsigned* sync,
                       int sleep_ns) {
  extern __shared__ __align__(128) unsigned char slice_raw[];
  T* slice = reinterpret_cast<T*>(slice_raw);
  __shared__ uint64_t bar[kPieces];
  __shared__ float scratch[kClusterBlock / 32];
  __shared__ float stats[4];
  __shared__ unsigned s_id;
  if (threadIdx.x == 0) s_id = take_slice_ticket(sync);
  __syncthreads();
  const int64_t row = s_id / slices;
  const int rank = static_cast<int>(s_id % slices);
  const int64_t t = load_target(a, row);
  const SliceReduce<T> sr = reduce_slice(a, row, rank, chunk, slice, bar, scratch);
  const int64_t base = sr.base;
  const int n = sr.n, nv = sr.nv;
  if (threadIdx.x == 0)
    post_slice_and_wait(
        sync, part, row, slices, rank,
        make_float4(sr.m, sr.s, sr.sx, t >= base && t < base + n ? to_f32(slice[t - base]) : 0.f),
        sleep_ns);
  __syncthreads();
  if (threadIdx.x < 32) {
    const float4 p =
        slice_partial(part, row, slices, threadIdx.x, make_float4(-INFINITY, 0.f, 0.f, 0.f));
    merge_slice_partials(p.x, p.y, p.z, p.w, stats);
  }
  __syncthreads();
  float loss;
  const RowFinish f = finish_row(a, t, stats[0], stats[1], stats[2], stats[3], &loss);
  if (rank == 0 && threadIdx.x == 0) a.row_loss[row] = loss;
  write_slice_dlogits(a, f, slice, row, base, n, nv);
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
  // Own scratch: the caller's count / row-loss pointers live in stream_workspace, which a
  // request here could grow (and free).
  const detail::AsyncBuffer part(size_t(a.rows) * chunks * 3 * sizeof(float), stream);
  ce_fwd_part_kernel<T><<<static_cast<unsigned>(a.rows * chunks), kPartBlock, 0, stream>>>(
      a, chunks, part.as<float>());
  ce_fwd_combine_kernel<T><<<static_cast<unsigned>((a.rows + 7) / 8), 256, 0, stream>>>(
      a, chunks, part.as<const float>());
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

// A row in ⌈row bytes / kSliceTarget⌉ <= kClusterMax slices of `chunk` elements (16-byte
// multiples); ok = false where a slice would pass kSliceMax or the grid 2^31 CTAs.
struct Slices {
  int64_t count, chunk, smem;
  bool ok;
};

// max_count: kClusterMax for a cluster; up to 32 (a warp's lanes merge them) exchanging
// through global memory.
template <class T>
Slices slices_of(const CeArgs& a, int64_t max_count = kClusterMax) {
  constexpr int64_t kVec = kVec16<T>;
  const int64_t row_bytes = a.cols * int64_t{sizeof(T)};
  Slices s;
  s.count = std::min<int64_t>(
      max_count, std::max<int64_t>(1, (row_bytes + slice_target() - 1) / slice_target()));
  s.chunk = ((a.cols + s.count - 1) / s.count + kVec - 1) / kVec * kVec;
  s.smem = s.chunk * int64_t{sizeof(T)};
  s.ok = s.smem <= kSliceMax && a.rows * s.count < (int64_t{1} << 31);
  return s;
}

template <class T>
bool try_cluster(const CeArgs& a, cudaStream_t stream) {
  const Slices sl = slices_of<T>(a);
  if (!sl.ok) return false;
  const int64_t csize = sl.count, chunk = sl.chunk, smem = sl.smem;
  if (cudaFuncSetAttribute(ce_cluster_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess)
    return false;
  return detail::launch_cluster(ce_cluster_kernel<T>, dim3(static_cast<unsigned>(a.rows * csize)),
                                dim3(kClusterBlock), static_cast<size_t>(smem),
                                static_cast<int>(csize), stream, a,
                                static_cast<int>(chunk)) == cudaSuccess;
}

// Forward only with try_cluster's slices but independent CTAs (ce_fwd_slice_kernel) and the
// chunk combine; false (nothing launched) where those slices do not apply.
// TESSEL_CE_FWD_SLICES=0 keeps the cluster kernel for the forward only (A/B).
template <class T>
bool try_fwd_slices(const CeArgs& a, cudaStream_t stream) {
  static const bool enabled = [] {
    const char* e = std::getenv("TESSEL_CE_FWD_SLICES");
    return !(e != nullptr && e[0] == '0');
  }();
  const Slices sl = slices_of<T>(a);
  if (!enabled || !sl.ok) return false;
  const int64_t slices = sl.count, chunk = sl.chunk, smem = sl.smem;
  if (cudaFuncSetAttribute(ce_fwd_slice_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const detail::AsyncBuffer part(size_t(a.rows) * slices * 3 * sizeof(float), stream);
  ce_fwd_slice_kernel<T>
      <<<static_cast<unsigned>(a.rows * slices), kClusterBlock, static_cast<size_t>(smem),
         stream>>>(a, static_cast<int>(chunk), static_cast<int>(slices), part.as<float>());
  ce_fwd_combine_kernel<T><<<static_cast<unsigned>((a.rows + 7) / 8), 256, 0, stream>>>(
      a, static_cast<int>(slices), part.as<const float>());
  return true;
}

// Loss + dlogits with try_cluster's slices on independent CTAs (ce_exchange_kernel), for rows
// of more than kClusterMax slices (up to 32; the cluster would take fewer, larger slices) or
// with TESSEL_CE_EXCHANGE=global (A/B; the cluster kernel leads where both apply); false
// (nothing launched) otherwise or where those slices do not apply.
template <class T>
bool try_exchange(const CeArgs& a, cudaStream_t stream) {
  static const bool forced = [] {
    const char* e = std::getenv("TESSEL_CE_EXCHANGE");
    return e != nullptr && std::string(e) == "global";
  }();
  const Slices sl = slices_of<T>(a, 32);
  if (!(forced || sl.count > kClusterMax) || !sl.ok || a.dx == nullptr) return false;
  const int64_t slices = sl.count, chunk = sl.chunk, smem = sl.smem;
  if (cudaFuncSetAttribute(ce_exchange_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // Nanoseconds slept between polls of the row's arrival counter (TESSEL_CE_SPIN_NS overrides).
  // H200, 4096 x 128256 bf16, loss + dlogits, rounds over three device calls (session 33):
  // no sleep 0.79-0.84 of copy (mean 0.809, 8 rounds), 1000 ns 0.82-0.85 (0.836, 5 rounds),
  // 2000 ns 0.825-0.839, 400 ns 0.81-0.85. The polls of up to 5 waiting CTAs per SM compete with
  // the running CTAs' copies; a release add with relaxed polls, which spin faster, measured
  // slower (session 32).
  static const int sleep_ns = [] {
    const char* e = std::getenv("TESSEL_CE_SPIN_NS");
    return e != nullptr ? std::max(0, std::min(std::atoi(e), 100000)) : kCeSpinSleepNs;
  }();
  // Own scratch: the caller's count / row losses live in stream_workspace.
  const SliceExchange ex(a.rows, slices, stream);
  ce_exchange_kernel<T><<<static_cast<unsigned>(a.rows * slices), kClusterBlock,
                          static_cast<size_t>(smem), stream>>>(
      a, static_cast<int>(chunk), static_cast<int>(slices), ex.part, ex.sync, sleep_ns);
  return true;
}

}  // namespace

void ce_launch(const CeLaunch& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  CeArgs a{p.x,          p.dx,      p.rows,        p.cols,         p.x_pitch,
           p.dx_pitch,   p.targets, p.targets_i64, p.ignore_index, p.smoothing,
           p.grad_scale, p.count,   p.row_loss};
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vec_ok = p.dx != nullptr
                            ? rows_vectorizable<T>(p.cols, {{p.x, p.x_pitch}, {p.dx, p.dx_pitch}})
                            : rows_vectorizable<T>(p.cols, {{p.x, p.x_pitch}});
    const bool grouped = dispatch_row_config<kVec16<T>>(p.cols, vec_ok, [&](auto cfg) {
      using Cfg = decltype(cfg);
      ce_group_kernel<T, Cfg><<<row_grid<Cfg>(p.rows), Cfg::BLOCK, 0, stream>>>(a);
    });
    if (grouped) return;
    if (p.dx == nullptr && vec_ok && try_fwd_slices<T>(a, stream)) return;
    if (vec_ok && try_exchange<T>(a, stream)) return;
    if (vec_ok && try_cluster<T>(a, stream)) return;
    cudaGetLastError();  // a refused cluster launch falls back
    // Forward only: independent chunk CTAs (grid x is 2^31 - 1: rows * chunks must fit).
    if (p.dx == nullptr && vec_ok &&
        p.rows * ((p.cols + PartCfg<T>::kCols - 1) / PartCfg<T>::kCols) < (int64_t{1} << 31)) {
      fwd_chunked<T>(a, stream);
      return;
    }
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(p.rows, int64_t{current_sm_count()} * 64));
    if (vec_ok)
      ce_stream_kernel<T, kVec16<T>><<<grid, kStreamBlock, 0, stream>>>(a);
    else
      ce_stream_kernel<T, 1><<<grid, kStreamBlock, 0, stream>>>(a);
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
    ce_finalize_kernel<O><<<1, kSmallBlock, 0, stream>>>(
        row_loss, count, n, static_cast<int>(reduction), static_cast<O*>(out));
  });
}

}  // namespace detail

// ---- public op ---------------------------------------------------------------------------
namespace {

void check_loss_out(const detail::OpCheck& chk, const Tensor& loss, DType logits_dtype, int64_t n,
                    Reduction reduction) {
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
  float* ws =
      static_cast<float*>(detail::stream_workspace(stream, (4 + size_t(n)) * sizeof(float)));
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
