// Row-normalization kernels shared by RMSNorm, LayerNorm and GroupNorm (see docs/norms.md).
//
// A "row" is what one set of statistics covers: a token's hidden vector (RMS/LN) or one
// (n, g) group of a GroupNorm input (cpg channels x HW contiguous elements). Every thread
// holds kElems = 16 elements of a row in registers as fp32 (ITEMS vectors of VEC), so the
// input is read from memory exactly once and the output written once:
//   * THREADS (32 … 1024) threads of a CTA hold a row of up to 16·THREADS elements;
//   * longer rows (up to 16 · 1024 · 16 = 262144) span a thread-block cluster of CLUSTER CTAs
//     (2 … 16), the partial sums combined through distributed shared memory in rank order.
// Reductions have a fixed shape and order, so results are bitwise deterministic.
// Forward RMS / RMS+residual / LN rows of up to 4096 16-byte vectors use norm_fwd_frags_kernel
// instead: 64 bytes per thread per tensor kept packed, weight preloaded, one reduction.
// Backward of RMS/LN accumulates dw (and db) per thread across the rows the CTA processes
// (each thread owns fixed columns; in registers, in shared memory for 1024-thread rows), with
// the next row's loads in flight during the current row's reduction; it combines the CTA's
// groups and, when the CTAs of a cluster each work on whole rows, the cluster's CTAs in rank
// order; one partial row per slot goes to a workspace and a second kernel sums the slots in a
// fixed order.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "ops/rows.cuh"
#include "runtime/launch.cuh"

namespace tessel::norm {

using namespace tessel::tile;
namespace cg = cooperative_groups;

constexpr int kElems = 16;
constexpr int kMaxThreads = 1024;
constexpr int kMaxCluster = 16;
constexpr int64_t kMaxCols = int64_t{kElems} * kMaxThreads * kMaxCluster;  // 262144
constexpr int kAccCluster = 8;  // CTAs combined at the end of a register-path backward

enum class Mode { rms, rms_add, ln, gn };

template <int VEC_, int THREADS_, int CLUSTER_>
struct Cfg {
  static constexpr int VEC = VEC_;
  static constexpr int ITEMS = kElems / VEC_;
  static constexpr int THREADS = THREADS_;
  static constexpr int CLUSTER = CLUSTER_;
  static constexpr int BLOCK = THREADS_ >= 256 ? THREADS_ : 256;
  static constexpr int BWD_BLOCK = THREADS_ >= 256 ? THREADS_ : 256;
  static constexpr int64_t kChunk = int64_t{VEC_} * ITEMS * THREADS_;  // columns per group/CTA
};

// Calls f(Cfg<VEC, T, C>{}) for the smallest config holding `cols`; false if too long.
template <int VEC, class F>
bool dispatch_cfg(int64_t cols, F&& f) {
  if (cols <= 32 * kElems)
    f(Cfg<VEC, 32, 1>{});
  else if (cols <= 64 * kElems)
    f(Cfg<VEC, 64, 1>{});
  else if (cols <= 128 * kElems)
    f(Cfg<VEC, 128, 1>{});
  else if (cols <= 256 * kElems)
    f(Cfg<VEC, 256, 1>{});
  else if (cols <= 512 * kElems)
    f(Cfg<VEC, 512, 1>{});
  else if (cols <= 1024 * kElems)
    f(Cfg<VEC, 1024, 1>{});
  else if (cols <= 2 * 1024 * kElems)
    f(Cfg<VEC, 1024, 2>{});
  else if (cols <= 4 * 1024 * kElems)
    f(Cfg<VEC, 1024, 4>{});
  else if (cols <= 8 * 1024 * kElems)
    f(Cfg<VEC, 1024, 8>{});
  else if (cols <= 16 * 1024 * kElems)
    f(Cfg<VEC, 1024, 16>{});
  else
    return false;
  return true;
}

struct NormArgs {
  // forward: x, r (residual), w, b -> y, h, mean, rstd
  // backward: x, r (= dy), w, b (= dh, optional add-in) ; mean, rstd in -> y (= dx)
  const void* x = nullptr;
  const void* r = nullptr;
  const void* w = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  void* h = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  float* ws = nullptr;  // backward partials: dw at ws, db at ws + slots * cols
  int64_t rows = 0, cols = 0;
  int64_t x_pitch = 0, r_pitch = 0, b_pitch = 0, y_pitch = 0, h_pitch = 0;
  float eps = 0.f;
  int64_t hw = 1;  // group norm: elements per channel
  int cpg = 1;     // group norm: channels per group
  int groups = 1;  // group norm: groups
};

// ---- reductions --------------------------------------------------------------------------
struct RedSmem {
  float2 warp[kMaxThreads / 32];
  float2 cl[2];
  float2 bc;
};

__device__ __forceinline__ float2 warp_sum2(float2 v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  return v;
}

// Sum over the row's threads (a group of THREADS threads, or the whole cluster). Every thread
// of the CTA calls it; all threads of the row get the same, order-fixed result.
template <class C>
__device__ __forceinline__ float2 row_sum2(float2 v, RedSmem& s, int& phase) {
  v = warp_sum2(v);
  if constexpr (C::THREADS > 32) {
    constexpr int kWarps = C::THREADS / 32;
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) s.warp[warp] = v;
    __syncthreads();
    const int first = warp / kWarps * kWarps;
    float2 r = s.warp[first];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      r.x += s.warp[first + w].x;
      r.y += s.warp[first + w].y;
    }
    __syncthreads();
    v = r;
  }
  if constexpr (C::CLUSTER > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) s.cl[phase] = v;
    cluster.sync();
    if (threadIdx.x < 32) {
      float2 p = make_float2(0.f, 0.f);
      if (threadIdx.x < C::CLUSTER) p = *cluster.map_shared_rank(&s.cl[phase], threadIdx.x);
      p = warp_sum2(p);
      if (threadIdx.x == 0) s.bc = p;
    }
    __syncthreads();
    v = s.bc;
    phase ^= 1;
  }
  return v;
}

template <class C>
__device__ __forceinline__ int cta_rank() {
  if constexpr (C::CLUSTER > 1)
    return static_cast<int>(cg::this_cluster().block_rank());
  else
    return 0;
}

// Column of element (i, 0) of this thread.
template <class C>
__device__ __forceinline__ int64_t col_of(int rank, int i, int lane) {
  return rank * C::kChunk + (static_cast<int64_t>(i) * C::THREADS + lane) * C::VEC;
}

template <class T, int VEC>
__device__ __forceinline__ void load_vals(const T* p, int64_t valid, float* out) {
  const Frag<T, VEC> f = load_frag_pred<VEC>(p, valid, T{});
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = j < valid ? to_f32(f.v[j]) : 0.f;
}

template <class T, int VEC>
__device__ __forceinline__ void store_vals(T* p, int64_t valid, const float* v) {
  Frag<T, VEC> f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) f.v[j] = from_f32<T>(v[j]);
  store_frag_pred<VEC>(p, f, valid);
}

// Affine parameters of the VEC elements at column c of `row`.
template <class T, int VEC, Mode M>
__device__ __forceinline__ void load_param(const T* p, int64_t row, int64_t c, const NormArgs& a,
                                           float* out) {
  if constexpr (M == Mode::gn) {
    const int64_t base = (row % a.groups) * a.cpg;
    if constexpr (VEC > 1) {  // hw % VEC == 0: one channel per vector
      const float v = c < a.cols ? to_f32(p[base + c / a.hw]) : 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = v;
    } else {
      out[0] = c < a.cols ? to_f32(p[base + c / a.hw]) : 0.f;
    }
  } else {
    load_vals<T, VEC>(p + c, a.cols - c, out);
  }
}

// ---- forward -----------------------------------------------------------------------------
template <class T, class C, Mode M>
__global__ void __launch_bounds__(C::BLOCK) norm_fwd_kernel(const NormArgs a) {
  __shared__ RedSmem red;
  constexpr int kGroups = C::BLOCK / C::THREADS;
  const int rank = cta_rank<C>();
  const int64_t cta = blockIdx.x / C::CLUSTER, nctas = gridDim.x / C::CLUSTER;
  const int lane = threadIdx.x % C::THREADS, group = threadIdx.x / C::THREADS;
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.r);
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  T* y = static_cast<T*>(a.y);
  T* h = static_cast<T*>(a.h);
  const float inv_n = 1.f / static_cast<float>(a.cols);
  int phase = 0;
  for (int64_t base = cta * kGroups; base < a.rows; base += nctas * kGroups) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    float v[C::ITEMS][C::VEC];
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      const int64_t c = col_of<C>(rank, i, lane);
      if (active) {
        load_vals<T, C::VEC>(x + row * a.x_pitch + c, a.cols - c, v[i]);
        if constexpr (M == Mode::rms_add) {
          float rv[C::VEC];
          load_vals<T, C::VEC>(r + row * a.r_pitch + c, a.cols - c, rv);
#pragma unroll
          for (int j = 0; j < C::VEC; ++j) v[i][j] += rv[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) v[i][j] = 0.f;
      }
    }
    if constexpr (M == Mode::rms_add) {
      if (active) {
#pragma unroll
        for (int i = 0; i < C::ITEMS; ++i) {
          const int64_t c = col_of<C>(rank, i, lane);
          if (c < a.cols) store_vals<T, C::VEC>(h + row * a.h_pitch + c, a.cols - c, v[i]);
        }
      }
    }
    float mean = 0.f;
    if constexpr (M == Mode::ln || M == Mode::gn) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) s += v[i][j];
      mean = row_sum2<C>(make_float2(s, 0.f), red, phase).x * inv_n;
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      const int64_t c = col_of<C>(rank, i, lane);
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) {
        const float d = c + j < a.cols ? v[i][j] - mean : 0.f;
        ss = fmaf(d, d, ss);
      }
    }
    const float rstd = rsqrtf(row_sum2<C>(make_float2(ss, 0.f), red, phase).x * inv_n + a.eps);
    if (active) {
      if (rank == 0 && lane == 0) {
        if (a.rstd) a.rstd[row] = rstd;
        if constexpr (M == Mode::ln || M == Mode::gn)
          if (a.mean) a.mean[row] = mean;
      }
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i) {
        const int64_t c = col_of<C>(rank, i, lane);
        if (c >= a.cols) continue;
        float wv[C::VEC], o[C::VEC];
        load_param<T, C::VEC, M>(w, row, c, a, wv);
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) o[j] = (v[i][j] - mean) * rstd * wv[j];
        if (b != nullptr) {
          float bv[C::VEC];
          load_param<T, C::VEC, M>(b, row, c, a, bv);
#pragma unroll
          for (int j = 0; j < C::VEC; ++j) o[j] += bv[j];
        }
        store_vals<T, C::VEC>(y + row * a.y_pitch + c, a.cols - c, o);
      }
    }
  }
  if constexpr (C::CLUSTER > 1) cg::this_cluster().sync();  // peers may still read our smem
}

// VEC elements of T as loaded. A full 16-byte vector stays packed in four 32-bit registers
// (two 16-bit values each) and is widened per use: held as T v[VEC], ptxas gives every 16-bit
// element its own register, and a 64-register kernel holding x and w spilled 300+ bytes.
// opaque() (no instruction), applied after a row's reduction, keeps the compiler from
// holding the first pass's fp32 conversions alive until the second pass instead of
// re-widening.
template <class T, int VEC>
struct PFrag {
  static constexpr bool kPacked = sizeof(T) * VEC == 16;
  using Store = std::conditional_t<kPacked, uint4, Frag<T, VEC>>;
  Store s;

  // valid: elements left in the row from p (<= 0: zeros). Packed vectors are whole (the
  // caller's vec_ok guarantees cols % VEC == 0).
  __device__ __forceinline__ void load(const T* p, int64_t valid) {
    if constexpr (kPacked) {
      s = valid > 0 ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
    } else {
      s = load_frag_pred<VEC>(p, valid, T{});
    }
  }
  __device__ __forceinline__ float at(int j) const {
    if constexpr (kPacked) {
      constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
      const int k = j / kPerWord;
      const uint32_t w = k == 0 ? s.x : k == 1 ? s.y : k == 2 ? s.z : s.w;
      if constexpr (sizeof(T) == 4) {
        return __uint_as_float(w);
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __uint_as_float(j % 2 ? (w & 0xffff0000u) : (w << 16));
      } else {
        return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 ? w >> 16 : w)));
      }
    } else {
      return to_f32(s.v[j]);
    }
  }
  __device__ __forceinline__ void opaque() {
    if constexpr (kPacked) asm volatile("" : "+r"(s.x), "+r"(s.y), "+r"(s.z), "+r"(s.w));
  }
};

// ---- forward, register rows of storage-dtype fragments -------------------------------------
// RMS / RMS+residual / LayerNorm rows of up to 4096 vectors (rows.cuh dispatch_row_frags):
// each thread keeps 4 vectors (64 bytes) per tensor as loaded, like softmax, which reaches the
// copy bandwidth where 16 fp32 elements per thread (32 bytes of bf16 in flight) did not. The
// weight (and bias) vectors of a thread's columns are loaded once, before the row loop, so no
// dependent load follows the reduction. LayerNorm's statistics come from one reduction of
// (Σd, Σd²), d = x - x[0] (shifted data: the cancellation in E[d²] - E[d]² is relative to
// (mean - x[0])² / var, which is O(1), not to mean² / var).
template <class RC>
struct FragRowRed {  // row_sum2's view of a register-row config
  static constexpr int THREADS = RC::THREADS;
  static constexpr int CLUSTER = 1;
};

// LayerNorm re-reads its weight and bias vectors (L1 hits: 8-16 KB shared by every row) at
// the store instead of holding them across the row loop: with w, b and x held it needed 76
// registers (768 threads per SM), too few bytes in flight for the H200 (0.84 of copy).
template <Mode M>
constexpr bool kFwdStreamWB = M == Mode::ln;

template <class RC, Mode M>
constexpr int fwd_frags_min_blocks() {
  // RMS holds x and w (32 registers of fragments): 64 registers per thread, 1024 threads per
  // SM; LayerNorm holds x only (kFwdStreamWB). RMS+residual holds one tensor more: up to 85
  // registers, 768 threads.
  // LayerNorm: 1280 threads (48 registers, no spill). Its rows take ~10 instructions per
  // element against RMSNorm's ~6 (the shifted statistics, the mean, w and b unpacked at the
  // store), so each row holds its CTA longer and 1024 threads kept too few rows' loads in
  // flight on the H200: 16384 x 4096 bf16 0.85-0.87 of copy -> 0.90 (docs/norms.md, session 30;
  // 1536 threads, 40 registers, read 0.87-0.90).
  const int threads = M == Mode::rms ? 1024 : kFwdStreamWB<M> ? 1280 : 768;
  return threads / RC::BLOCK > 0 ? threads / RC::BLOCK : 1;
}

template <class T, class RC, Mode M>
__global__ void __launch_bounds__(RC::BLOCK, (fwd_frags_min_blocks<RC, M>()))
    norm_fwd_frags_kernel(const NormArgs a) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  static_assert(M != Mode::gn, "group norm parameters vary per row");
  static_assert(PFrag<T, RC::VEC>::kPacked, "16-byte vectors only");
  constexpr int ITEMS = RC::ITEMS, VEC = RC::VEC;
  __shared__ RedSmem red;
  using Row = RowFrags<T, VEC, ITEMS, RC::THREADS>;  // column map and store
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.r);
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  T* y = static_cast<T*>(a.y);
  const float inv_n = 1.f / static_cast<float>(a.cols);
  const int lane = threadIdx.x % RC::THREADS;
  constexpr bool kStreamWB = kFwdStreamWB<M>;
  PFrag<T, VEC> ws[kStreamWB ? 1 : ITEMS], bs[kStreamWB ? 1 : ITEMS];
  if constexpr (!kStreamWB) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int64_t c = Row::col(i, lane);
      ws[i].load(w + c, a.cols - c);
      if (b != nullptr) bs[i].load(b + c, a.cols - c);
    }
  }
  int phase = 0;
#pragma unroll 1
  for (RowGroups<RC::THREADS, RC::BLOCK> g; g.valid_block(a.rows); g.next()) {
    const int64_t n = g.active ? a.cols : 0;
    PFrag<T, VEC> xs[ITEMS], rs[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int64_t c = Row::col(i, g.lane);
      xs[i].load(x + g.row * a.x_pitch + c, n - c);
      if constexpr (M == Mode::rms_add) rs[i].load(r + g.row * a.r_pitch + c, n - c);
    }
    float pivot = 0.f;
    if constexpr (M == Mode::ln)
      if (g.active) pivot = to_f32(x[g.row * a.x_pitch]);
    auto val = [&](int i, int j) {
      if constexpr (M == Mode::rms_add)
        return xs[i].at(j) + rs[i].at(j);
      else
        return xs[i].at(j);
    };
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (Row::valid(i, g.lane, n))
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = val(i, j) - pivot;
          s1 += d;
          s2 = fmaf(d, d, s2);
        }
    const float2 t = row_sum2<FragRowRed<RC>>(make_float2(s1, s2), red, phase);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      xs[i].opaque();
      if constexpr (M == Mode::rms_add) rs[i].opaque();
      if constexpr (!kStreamWB) {
        ws[i].opaque();
        if (b != nullptr) bs[i].opaque();
      }
    }
    float mean = 0.f, rstd;
    if constexpr (M == Mode::ln) {
      const float dm = t.x * inv_n;
      mean = pivot + dm;
      rstd = rsqrtf(fmaxf(fmaf(-dm, dm, t.y * inv_n), 0.f) + a.eps);
    } else {
      rstd = rsqrtf(t.y * inv_n + a.eps);
    }
    if (g.active && g.lane == 0) {
      if (a.rstd) a.rstd[g.row] = rstd;
      if constexpr (M == Mode::ln)
        if (a.mean) a.mean[g.row] = mean;
    }
    if constexpr (M == Mode::rms_add)
      store_row<T, VEC, ITEMS, RC::THREADS>(static_cast<T*>(a.h) + g.row * a.h_pitch, n, g.lane,
                                            val);
    if constexpr (kStreamWB) {
      // Item i's weight / bias vectors, loaded when its first element is formed (store_row
      // unrolls i and j, so the test is resolved at compile time).
      PFrag<T, VEC> wi, bi;
      if (b != nullptr)
        store_row<T, VEC, ITEMS, RC::THREADS>(y + g.row * a.y_pitch, n, g.lane, [&](int i, int j) {
          if (j == 0) {
            const int64_t c = Row::col(i, g.lane);
            wi.load(w + c, a.cols - c);
            bi.load(b + c, a.cols - c);
          }
          return fmaf((val(i, j) - mean) * rstd, wi.at(j), bi.at(j));
        });
      else
        store_row<T, VEC, ITEMS, RC::THREADS>(y + g.row * a.y_pitch, n, g.lane, [&](int i, int j) {
          if (j == 0) {
            const int64_t c = Row::col(i, g.lane);
            wi.load(w + c, a.cols - c);
          }
          return (val(i, j) - mean) * rstd * wi.at(j);
        });
    } else if (b != nullptr) {
      store_row<T, VEC, ITEMS, RC::THREADS>(y + g.row * a.y_pitch, n, g.lane, [&](int i, int j) {
        return fmaf((val(i, j) - mean) * rstd, ws[i].at(j), bs[i].at(j));
      });
    } else {
      store_row<T, VEC, ITEMS, RC::THREADS>(y + g.row * a.y_pitch, n, g.lane, [&](int i, int j) {
        return (val(i, j) - mean) * rstd * ws[i].at(j);
      });
    }
  }
}

// ---- backward ----------------------------------------------------------------------------
// dx = rstd * (g - xhat * mean(g * xhat) [- mean(g)]), g = dy * w, xhat = (x - mean) * rstd.
// ACC: accumulate dw (= sum dy * xhat) and, for LN, db (= sum dy) into a.ws.
template <class C, Mode M>
constexpr int acc_arrays() {
  return M == Mode::ln ? 2 : (M == Mode::rms ? 1 : 0);
}

// OCC: resident threads per SM the register budget is sized for. 512 (128 registers per
// thread) measured better than 768 (80 registers, where RMS and LayerNorm spill 200-300
// bytes): 16384x4096 bf16 RMS 0.56 vs 0.52, LN 0.51 vs 0.32 of copy bandwidth (H100).
template <class C, int OCC>
constexpr int bwd_min_blocks() {
  return OCC / C::BWD_BLOCK > 0 ? OCC / C::BWD_BLOCK : 1;
}

template <class T, class C, Mode M, int OCC = 512>
__global__ void __launch_bounds__(C::BWD_BLOCK, (bwd_min_blocks<C, OCC>()))
    norm_bwd_kernel(const NormArgs a) {
  __shared__ RedSmem red;
  extern __shared__ float acc[];  // [kArrays][groups][ITEMS][VEC][THREADS]
  constexpr int BLOCK = C::BWD_BLOCK;
  constexpr int kGroups = BLOCK / C::THREADS;
  constexpr int kArrays = acc_arrays<C, M>();
  constexpr int64_t kPerGroup = C::kChunk;
  constexpr int64_t kPerArray = kPerGroup * kGroups;
  const int rank = cta_rank<C>();
  const int64_t cta = blockIdx.x / C::CLUSTER, nctas = gridDim.x / C::CLUSTER;
  const int lane = threadIdx.x % C::THREADS, group = threadIdx.x / C::THREADS;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.r);
  const T* w = static_cast<const T*>(a.w);
  const T* dh = static_cast<const T*>(a.b);
  T* dx = static_cast<T*>(a.y);
  const float inv_n = 1.f / static_cast<float>(a.cols);
  auto acc_at = [&](int arr, int i, int j) -> float& {
    return acc[arr * kPerArray + group * kPerGroup + (i * C::VEC + j) * C::THREADS + lane];
  };
  // dw (and db) of this thread's fixed columns accumulate in registers over its rows (a
  // shared-memory read-modify-write per element and row cost more than the row's loads);
  // shared memory combines them once, at the end. x, dy and the weight stay packed in the
  // storage dtype (opaque() after the reduction keeps the compiler from holding fp32 copies).
  // The weight of the thread's columns is loaded once (RMS/LN; group norm's varies per row).
  float acc_w[C::ITEMS][C::VEC], acc_b[C::ITEMS][C::VEC];
  PFrag<T, C::VEC> w_cols[C::ITEMS];
#pragma unroll
  for (int i = 0; i < C::ITEMS; ++i) {
    const int64_t c = col_of<C>(rank, i, lane);
    if constexpr (M != Mode::gn) w_cols[i].load(w + c, a.cols - c);
#pragma unroll
    for (int j = 0; j < C::VEC; ++j) acc_w[i][j] = acc_b[i][j] = 0.f;
  }
  auto weights = [&](int i, int64_t row, int64_t c, bool active, float* wv) {
    if constexpr (M != Mode::gn) {
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) wv[j] = w_cols[i].at(j);
    } else if (active) {
      load_param<T, C::VEC, M>(w, row, c, a, wv);
    } else {
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) wv[j] = 0.f;
    }
  };
  // The next row's x, dy and statistics are loaded before this row's reduction (one row in
  // flight while the other is reduced and written: the grid is a single persistent wave, so
  // without it every CTA waits a full memory latency per row).
  PFrag<T, C::VEC> xf[C::ITEMS], gf[C::ITEMS];
  float mu = 0.f, rs = 0.f;
  using Vec = PFrag<T, C::VEC>;
  auto load_row = [&](int64_t row, Vec* xq, Vec* gq, float& m, float& r) {
    const bool on = row < a.rows;
    m = 0.f;
    r = 0.f;
    if (on) {
      r = a.rstd[row];
      if constexpr (M != Mode::rms) m = a.mean[row];
    }
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      const int64_t c = col_of<C>(rank, i, lane);
      const int64_t nv = on ? a.cols - c : 0;  // rows past the end load nothing: zeros
      xq[i].load(x + row * a.x_pitch + c, nv);
      gq[i].load(dy + row * a.r_pitch + c, nv);
    }
  };
  // 1024-thread rows (64 registers per thread) have no room for a second row or register
  // accumulators: they load each row in turn and accumulate in shared memory.
  constexpr bool kLean = C::THREADS >= 1024;
  if constexpr (kLean && kArrays > 0) {
#pragma unroll
    for (int k = 0; k < kArrays; ++k)
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) acc_at(k, i, j) = 0.f;
  }
  if constexpr (!kLean) load_row(cta * kGroups + group, xf, gf, mu, rs);
  int phase = 0;
#pragma unroll 1
  for (int64_t base = cta * kGroups; base < a.rows; base += nctas * kGroups) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    PFrag<T, C::VEC> xn[C::ITEMS], gn[C::ITEMS];
    float mu_n = 0.f, rs_n = 0.f;
    if constexpr (kLean)
      load_row(row, xf, gf, mu, rs);
    else
      load_row(row + nctas * kGroups, xn, gn, mu_n, rs_n);
    float s_gx = 0.f, s_g = 0.f;
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      const int64_t c = col_of<C>(rank, i, lane);
      float wv[C::VEC];
      weights(i, row, c, active, wv);
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) {
        // Past the row's end x and dy were loaded as 0, so d = 0 and nothing accumulates.
        const float xh = (xf[i].at(j) - mu) * rs;
        const float d = gf[i].at(j);
        if constexpr (kLean) {
          if constexpr (kArrays >= 1) acc_at(0, i, j) = fmaf(d, xh, acc_at(0, i, j));
          if constexpr (kArrays >= 2) acc_at(1, i, j) += d;
        } else {
          if constexpr (kArrays >= 1) acc_w[i][j] = fmaf(d, xh, acc_w[i][j]);
          if constexpr (kArrays >= 2) acc_b[i][j] += d;
        }
        const float g = d * wv[j];
        s_gx = fmaf(g, xh, s_gx);
        s_g += g;
      }
    }
    const float2 sums = row_sum2<C>(make_float2(s_gx, s_g), red, phase);
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      xf[i].opaque();
      gf[i].opaque();
      if constexpr (M != Mode::gn) w_cols[i].opaque();
    }
    const float m_gx = sums.x * inv_n;
    const float m_g = M == Mode::rms ? 0.f : sums.y * inv_n;
    if (active) {
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i) {
        const int64_t c = col_of<C>(rank, i, lane);
        if (c >= a.cols) continue;
        float wv[C::VEC], o[C::VEC];
        weights(i, row, c, active, wv);
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) {
          const float xh = (xf[i].at(j) - mu) * rs;
          o[j] = rs * (gf[i].at(j) * wv[j] - fmaf(xh, m_gx, m_g));
        }
        if (dh != nullptr) {
          float hv[C::VEC];
          load_vals<T, C::VEC>(dh + row * a.b_pitch + c, a.cols - c, hv);
#pragma unroll
          for (int j = 0; j < C::VEC; ++j) o[j] += hv[j];
        }
        store_vals<T, C::VEC>(dx + row * a.y_pitch + c, a.cols - c, o);
      }
    }
    if constexpr (!kLean) {
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i) {
        xf[i] = xn[i];
        gf[i] = gn[i];
      }
      mu = mu_n;
      rs = rs_n;
    }
  }
  tile::allow_next_grid();  // the slot sums may start launching (they wait for our exit)
  if constexpr (kArrays > 0) {
    if constexpr (!kLean) {
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) {
          acc_at(0, i, j) = acc_w[i][j];
          if constexpr (kArrays >= 2) acc_at(1, i, j) = acc_b[i][j];
        }
    }
    // Combine the CTA's groups (fixed order) into group 0's slots.
    __syncthreads();
    if constexpr (kGroups > 1) {
      for (int64_t idx = threadIdx.x; idx < kPerGroup; idx += BLOCK)
#pragma unroll
        for (int k = 0; k < kArrays; ++k) {
          float s = acc[k * kPerArray + idx];
          for (int g = 1; g < kGroups; ++g) s += acc[k * kPerArray + g * kPerGroup + idx];
          acc[k * kPerArray + idx] = s;
        }
    }
    if constexpr (C::CLUSTER == 1) {
      // The CTAs of the launch cluster work on whole rows and share one slot: rank r adds its
      // 1/n of the entries over the n CTAs in rank order (the order of one CTA summing all of
      // them: the same bits) and writes them. (Rank 0 alone summing everything, its remote
      // loads one after another, left the other n - 1 SMs idle at the end of the kernel.)
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      const unsigned n = cluster.num_blocks();
      const unsigned slot = blockIdx.x / n, slots = gridDim.x / n;
      const int per = static_cast<int>((kPerGroup + n - 1) / n);
      const int lo = static_cast<int>(cluster.block_rank()) * per;
      const int hi = min(lo + per, static_cast<int>(kPerGroup));
      for (int idx = lo + static_cast<int>(threadIdx.x); idx < hi; idx += BLOCK) {
        const int l = idx % C::THREADS, j = (idx / C::THREADS) % C::VEC;
        const int i = idx / (C::THREADS * C::VEC);
        const int64_t c = col_of<C>(0, i, l) + j;
#pragma unroll
        for (int k = 0; k < kArrays; ++k) {
          float s = cluster.map_shared_rank(acc, 0u)[k * kPerArray + idx];
          for (unsigned q = 1; q < n; ++q)
            s += cluster.map_shared_rank(acc, q)[k * kPerArray + idx];
          if (c < a.cols) a.ws[(int64_t{k} * slots + slot) * a.cols + c] = s;
        }
      }
      cluster.sync();  // peers' shared memory stays until every rank has read it
    } else {
      __syncthreads();
      const int64_t slots = gridDim.x / C::CLUSTER;
      for (int64_t idx = threadIdx.x; idx < kPerGroup; idx += BLOCK) {
        const int l = static_cast<int>(idx % C::THREADS);
        const int j = static_cast<int>((idx / C::THREADS) % C::VEC);
        const int i = static_cast<int>(idx / (C::THREADS * C::VEC));
        const int64_t c = col_of<C>(rank, i, l) + j;
        if (c < a.cols)
#pragma unroll
          for (int k = 0; k < kArrays; ++k)
            a.ws[(k * slots + cta) * a.cols + c] = acc[k * kPerArray + idx];
      }
    }
  }
  if constexpr (C::CLUSTER > 1) cg::this_cluster().sync();
}

// out[c] = sum_{k < K} ws[k * n + c], for one or two consecutive arrays (blockIdx.y). A block
// covers 32 columns with 8 slot lanes: lane l adds slots l, l + 8, … (four independent partial
// sums, so four loads are in flight), then lane 0 adds the 8 lanes' sums in lane order: a fixed
// order (deterministic). One thread per column walking all K slots in a dependent chain took
// ~K memory latencies (~100 us for K = 99), as long as the backward kernel itself.
constexpr int kSumCols = 32, kSumLanes = 8;

template <class TW>
__global__ void __launch_bounds__(kSumCols* kSumLanes)
    sum_slots_kernel(const float* __restrict__ ws, int64_t K, int64_t n, TW* __restrict__ out0,
                     TW* __restrict__ out1) {
  __shared__ float part[kSumLanes][kSumCols];
  tile::wait_prior_grid();  // the partials are the previous kernel's output
  const int col = threadIdx.x % kSumCols, lane = threadIdx.x / kSumCols;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + col;
  const int arr = blockIdx.y;
  float s = 0.f;
  if (c < n) {
    const float* p = ws + arr * K * n + c;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    int64_t k = lane;
    for (; k + 3 * kSumLanes < K; k += 4 * kSumLanes) {
      s0 += p[k * n];
      s1 += p[(k + kSumLanes) * n];
      s2 += p[(k + 2 * kSumLanes) * n];
      s3 += p[(k + 3 * kSumLanes) * n];
    }
    for (; k < K; k += kSumLanes) s0 += p[k * n];
    s = (s0 + s1) + (s2 + s3);
  }
  part[lane][col] = s;
  __syncthreads();
  if (lane == 0 && c < n) {
    float t = part[0][col];
#pragma unroll
    for (int l = 1; l < kSumLanes; ++l) t += part[l][col];
    (arr == 0 ? out0 : out1)[c] = from_f32<TW>(t);
  }
}

// n % 4 == 0 (16-byte slot rows): the same sums with 32 slot lanes and 16-byte loads: a block
// covers 32 columns as 8 groups of 4; lane l adds slots l, l + 32, … in four independent
// float4 partials, lane 0 adds the 32 lanes in lane order (deterministic). The 8-lane kernel
// above kept too few loads in flight: Nsight Compute, H100, 16384x4096 bf16 backward: 6.5 us
// (RMS, 198 slots) and 10.6 us (LayerNorm, 2 x 396 slots) after a 144-145 us backward kernel,
// at 0.5 / 1.2 TB/s. With this kernel (same run, TESSEL_NORM_SUM_VEC=0 / 1 alternating, two
// rounds): RMS backward 0.886 / 0.885 -> 0.892 / 0.890 of copy, LayerNorm 0.861 / 0.858 ->
// 0.873 / 0.870 (dependent launch had hidden part of the old kernel's time).
constexpr int kSumVecCols = 32, kSumVecLanes = 32, kSumVecGroups = kSumVecCols / 4;

template <class TW>
__global__ void __launch_bounds__(kSumVecGroups* kSumVecLanes)
    sum_slots_vec_kernel(const float* __restrict__ ws, int64_t K, int64_t n, TW* __restrict__ out0,
                         TW* __restrict__ out1) {
  __shared__ float4 part[kSumVecLanes][kSumVecGroups];
  tile::wait_prior_grid();  // the partials are the previous kernel's output
  const int grp = threadIdx.x % kSumVecGroups, lane = threadIdx.x / kSumVecGroups;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumVecCols + grp * 4;
  const int arr = blockIdx.y;
  auto add = [](float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  };
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c < n) {
    const float* p = ws + arr * K * n + c;
    auto ld = [&](int64_t k) { return __ldcg(reinterpret_cast<const float4*>(p + k * n)); };
    float4 s0 = s, s1 = s, s2 = s, s3 = s;
    int64_t k = lane;
    for (; k + 3 * kSumVecLanes < K; k += 4 * kSumVecLanes) {
      s0 = add(s0, ld(k));
      s1 = add(s1, ld(k + kSumVecLanes));
      s2 = add(s2, ld(k + 2 * kSumVecLanes));
      s3 = add(s3, ld(k + 3 * kSumVecLanes));
    }
    for (; k < K; k += kSumVecLanes) s0 = add(s0, ld(k));
    s = add(add(s0, s1), add(s2, s3));
  }
  part[lane][grp] = s;
  __syncthreads();
  if (lane == 0 && c < n) {
    float4 t = part[0][grp];
#pragma unroll 4
    for (int l = 1; l < kSumVecLanes; ++l) t = add(t, part[l][grp]);
    TW* o = (arr == 0 ? out0 : out1) + c;
    o[0] = from_f32<TW>(t.x);
    o[1] = from_f32<TW>(t.y);
    o[2] = from_f32<TW>(t.z);
    o[3] = from_f32<TW>(t.w);
  }
}

// Few slots (K <= kSumLanes: the long rows' one slot per cluster), n % 4 == 0: one thread per
// 4 columns adds the K slots in slot order, all K loads in flight. The 8-lane kernel gave such
// a sum one block per 32 columns, most lanes idle: 2 x 8192 blocks for 256x262144, ~20 us of a
// 155 us LayerNorm backward (H200; Nsight Compute put the backward kernel itself at 132 us).
// Same operations in the same order as the 8-lane kernel for K <= 8 (each slot value enters as
// 0 + x, its empty lanes add +0), so the sums are bitwise the same.
template <class TW>
__global__ void __launch_bounds__(256)
    sum_few_slots_kernel(const float* __restrict__ ws, int64_t K, int64_t n, TW* __restrict__ out0,
                         TW* __restrict__ out1) {
  tile::wait_prior_grid();  // the partials are the previous kernel's output
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  const int arr = blockIdx.y;
  if (c >= n) return;
  auto add = [](float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  };
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  const float* p = ws + arr * K * n + c;
  float4 v[kSumLanes];
#pragma unroll
  for (int k = 0; k < kSumLanes; ++k)
    if (k < K) v[k] = add(zero, __ldcg(reinterpret_cast<const float4*>(p + k * n)));
  float4 t = v[0];
#pragma unroll
  for (int k = 1; k < kSumLanes; ++k)
    if (k < K) t = add(t, v[k]);
  if (K < kSumLanes) t = add(t, zero);
  TW* o = (arr == 0 ? out0 : out1) + c;
  o[0] = from_f32<TW>(t.x);
  o[1] = from_f32<TW>(t.y);
  o[2] = from_f32<TW>(t.z);
  o[3] = from_f32<TW>(t.w);
}

// dw (and db when out1 != nullptr) from K partial slots of n columns each.
template <class TW>
void launch_sum_slots(const float* ws, int64_t K, int64_t n, void* out0, void* out1,
                      cudaStream_t stream) {
  // TESSEL_NORM_SUM_VEC=0: the 8-lane kernel for every K (A/B).
  static const bool vec_allowed = [] {
    const char* e = std::getenv("TESSEL_NORM_SUM_VEC");
    return !(e && e[0] == '0');
  }();
  // Up to 63 slots do not take the 32-lane kernel: its lanes would mostly idle (256x262144 RMS
  // backward: 0.60 with them, 0.63 with the 8-lane kernel); up to 8 take sum_few_slots_kernel.
  if (vec_allowed && K >= 2 * kSumVecLanes && n % 4 == 0 &&
      reinterpret_cast<uintptr_t>(ws) % 16 == 0) {
    const dim3 g(static_cast<unsigned>((n + kSumVecCols - 1) / kSumVecCols), out1 ? 2 : 1);
    TESSEL_CUDA_CHECK(detail::launch_follow_up(sum_slots_vec_kernel<TW>, g,
                                               dim3(kSumVecGroups * kSumVecLanes), 0, stream, ws, K,
                                               n, static_cast<TW*>(out0), static_cast<TW*>(out1)));
    return;
  }
  if (vec_allowed && K <= kSumLanes && n % 4 == 0 && reinterpret_cast<uintptr_t>(ws) % 16 == 0) {
    const dim3 g(static_cast<unsigned>((n / 4 + 255) / 256), out1 ? 2 : 1);
    TESSEL_CUDA_CHECK(detail::launch_follow_up(sum_few_slots_kernel<TW>, g, dim3(256), 0, stream,
                                               ws, K, n, static_cast<TW*>(out0),
                                               static_cast<TW*>(out1)));
    return;
  }
  const dim3 g(static_cast<unsigned>((n + kSumCols - 1) / kSumCols), out1 ? 2 : 1);
  // A dependent launch: its CTAs start while the backward kernel drains (which lets it go
  // once its rows are done) and wait there for the partials.
  TESSEL_CUDA_CHECK(detail::launch_follow_up(sum_slots_kernel<TW>, g, dim3(kSumCols * kSumLanes), 0,
                                             stream, ws, K, n, static_cast<TW*>(out0),
                                             static_cast<TW*>(out1)));
}

// Clusters of `cluster` CTAs that can be resident at once. A persistent grid must not exceed
// it: clusters only start where a whole cluster fits in one GPC, so SM count x CTAs per SM
// over-counts (392 CTAs of 8-CTA clusters at 3 CTAs per SM on an H100 -> 45 resident clusters
// = 360 CTAs; the 4 left over ran as a second wave and doubled the backward's time).
template <class KernelFn>
int64_t max_active_clusters(KernelFn kernel, int block, size_t smem, int cluster) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(cluster));
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cluster > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                          1) != cudaSuccess)
    cudaGetLastError();
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  return n;
}

}  // namespace tessel::norm
