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
// Backward of RMS/LN accumulates dw (and db) per thread in shared memory across the rows the
// CTA processes (each thread owns fixed columns), combines the CTA's groups and, when the CTAs
// of a cluster each work on whole rows, the cluster's CTAs in rank order; one partial row per
// slot goes to a workspace and a second kernel sums the slots in a fixed order.
#pragma once

#include <cooperative_groups.h>

#include "ops/rows.cuh"

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
  static constexpr int BWD_BLOCK = THREADS_ >= 512 ? THREADS_ : 512;
  static constexpr int64_t kChunk = int64_t{VEC_} * ITEMS * THREADS_;  // columns per group/CTA
};

// Calls f(Cfg<VEC, T, C>{}) for the smallest config holding `cols`; false if too long.
template <int VEC, class F>
bool dispatch_cfg(int64_t cols, F&& f) {
  if (cols <= 32 * kElems) f(Cfg<VEC, 32, 1>{});
  else if (cols <= 64 * kElems) f(Cfg<VEC, 64, 1>{});
  else if (cols <= 128 * kElems) f(Cfg<VEC, 128, 1>{});
  else if (cols <= 256 * kElems) f(Cfg<VEC, 256, 1>{});
  else if (cols <= 512 * kElems) f(Cfg<VEC, 512, 1>{});
  else if (cols <= 1024 * kElems) f(Cfg<VEC, 1024, 1>{});
  else if (cols <= 2 * 1024 * kElems) f(Cfg<VEC, 1024, 2>{});
  else if (cols <= 4 * 1024 * kElems) f(Cfg<VEC, 1024, 4>{});
  else if (cols <= 8 * 1024 * kElems) f(Cfg<VEC, 1024, 8>{});
  else if (cols <= 16 * 1024 * kElems) f(Cfg<VEC, 1024, 16>{});
  else return false;
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
  if constexpr (C::CLUSTER > 1) return static_cast<int>(cg::this_cluster().block_rank());
  else return 0;
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

// ---- backward ----------------------------------------------------------------------------
// dx = rstd * (g - xhat * mean(g * xhat) [- mean(g)]), g = dy * w, xhat = (x - mean) * rstd.
// ACC: accumulate dw (= sum dy * xhat) and, for LN, db (= sum dy) into a.ws.
template <class C, Mode M>
constexpr int acc_arrays() {
  return M == Mode::ln ? 2 : (M == Mode::rms ? 1 : 0);
}

template <class T, class C, Mode M>
__global__ void __launch_bounds__(C::BWD_BLOCK) norm_bwd_kernel(const NormArgs a) {
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
  if constexpr (kArrays > 0) {
#pragma unroll
    for (int k = 0; k < kArrays; ++k)
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) acc_at(k, i, j) = 0.f;
  }
  int phase = 0;
  for (int64_t base = cta * kGroups; base < a.rows; base += nctas * kGroups) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    float xv[C::ITEMS][C::VEC], gv[C::ITEMS][C::VEC];
    float mu = 0.f, rs = 0.f;
    if (active) {
      rs = a.rstd[row];
      if constexpr (M != Mode::rms) mu = a.mean[row];
    }
    float s_gx = 0.f, s_g = 0.f;
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      const int64_t c = col_of<C>(rank, i, lane);
      if (active) {
        load_vals<T, C::VEC>(x + row * a.x_pitch + c, a.cols - c, xv[i]);
        load_vals<T, C::VEC>(dy + row * a.r_pitch + c, a.cols - c, gv[i]);
      } else {
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) xv[i][j] = gv[i][j] = 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < C::ITEMS; ++i) {
      const int64_t c = col_of<C>(rank, i, lane);
      float wv[C::VEC];
      if (active) load_param<T, C::VEC, M>(w, row, c, a, wv);
      else
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) wv[j] = 0.f;
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) {
        const float xh = c + j < a.cols ? (xv[i][j] - mu) * rs : 0.f;
        xv[i][j] = xh;
        if constexpr (kArrays >= 1) acc_at(0, i, j) = fmaf(gv[i][j], xh, acc_at(0, i, j));
        if constexpr (kArrays >= 2) acc_at(1, i, j) += gv[i][j];
        const float g = gv[i][j] * wv[j];
        gv[i][j] = g;
        s_gx = fmaf(g, xh, s_gx);
        s_g += g;
      }
    }
    const float2 sums = row_sum2<C>(make_float2(s_gx, s_g), red, phase);
    const float m_gx = sums.x * inv_n;
    const float m_g = M == Mode::rms ? 0.f : sums.y * inv_n;
    if (active) {
#pragma unroll
      for (int i = 0; i < C::ITEMS; ++i) {
        const int64_t c = col_of<C>(rank, i, lane);
        if (c >= a.cols) continue;
        float o[C::VEC];
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) o[j] = rs * (gv[i][j] - fmaf(xv[i][j], m_gx, m_g));
        if (dh != nullptr) {
          float hv[C::VEC];
          load_vals<T, C::VEC>(dh + row * a.b_pitch + c, a.cols - c, hv);
#pragma unroll
          for (int j = 0; j < C::VEC; ++j) o[j] += hv[j];
        }
        store_vals<T, C::VEC>(dx + row * a.y_pitch + c, a.cols - c, o);
      }
    }
  }
  if constexpr (kArrays > 0) {
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
    int64_t slot;
    bool writer = true;
    if constexpr (C::CLUSTER == 1) {
      // The CTAs of the launch cluster work on whole rows: rank 0 adds the others' partials.
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      const unsigned n = cluster.num_blocks();
      writer = cluster.block_rank() == 0;
      slot = blockIdx.x / n;
      if (writer) {
        for (int64_t idx = threadIdx.x; idx < kPerGroup; idx += BLOCK)
#pragma unroll
          for (int k = 0; k < kArrays; ++k) {
            float s = acc[k * kPerArray + idx];
            for (unsigned q = 1; q < n; ++q) s += cluster.map_shared_rank(acc, q)[k * kPerArray + idx];
            acc[k * kPerArray + idx] = s;
          }
      }
      cluster.sync();
    } else {
      __syncthreads();
      slot = cta;
    }
    if (writer) {
      const int64_t slots = gridDim.x / (C::CLUSTER == 1 ? cg::this_cluster().num_blocks() : C::CLUSTER);
      for (int64_t idx = threadIdx.x; idx < kPerGroup; idx += BLOCK) {
        const int l = static_cast<int>(idx % C::THREADS);
        const int j = static_cast<int>((idx / C::THREADS) % C::VEC);
        const int i = static_cast<int>(idx / (C::THREADS * C::VEC));
        const int64_t c = col_of<C>(rank, i, l) + j;
        if (c < a.cols)
#pragma unroll
          for (int k = 0; k < kArrays; ++k)
            a.ws[(k * slots + slot) * a.cols + c] = acc[k * kPerArray + idx];
      }
    }
  }
  if constexpr (C::CLUSTER > 1) cg::this_cluster().sync();
}

// out[c] = sum_{k < K} ws[k * n + c] (fixed order), for `arrays` consecutive arrays.
template <class TW>
__global__ void __launch_bounds__(256) sum_slots_kernel(const float* __restrict__ ws, int64_t K,
                                                        int64_t n, TW* __restrict__ out0,
                                                        TW* __restrict__ out1) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const int arr = blockIdx.y;
  const float* p = ws + arr * K * n + c;
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += p[k * n];
  (arr == 0 ? out0 : out1)[c] = from_f32<TW>(s);
}

}  // namespace tessel::norm
