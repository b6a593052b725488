// Attention backward kernels (FlashAttention-2 style) on mma.sync m16n8k16 tensor cores.
//
// dk/dv kernel: one CTA (4 warps) per (64-key block, kv head, sequence). K and V stay in
//   shared memory; the CTA walks every q head of its kv head's group and every 64-row query
//   block that sees one of its keys (in a fixed order: GQA sums are deterministic), with the
//   next block's Q / dO copied in (cp.async, double buffer) while the current one computes.
//   Warp w owns keys 16w .. 16w+15 and per query block computes, transposed:
//     S^T = K Q^T, dP^T = V dO^T                  (16 x 64 each, fp32 registers)
//     P^T = exp2(S^T scale log2e - lse log2e)     (masked), dS^T = P^T (dP^T - delta) s'
//     dV += P^T dO, dK += dS^T Q                  (P, dS rounded to T as A operands)
//   and, unless deterministic, dQ += dS K: dS^T goes through shared memory, warp w takes
//   query rows 16w .. 16w+15 and adds them to an f32 workspace with float2 atomics.
// dq kernel (deterministic mode): one CTA per (64-row query block, q head, sequence); warp w
//   owns 16 query rows, walks the visible key blocks in order recomputing S, dP, dS, and
//   accumulates dQ += dS K in registers; written once, in T.
// D = 256 runs the dk/dv kernel in two passes (dV, then dK + dQ): both accumulators of 256
// columns would not fit in the registers.
// Shared tiles are 64 rows of D (or 64) elements with the 16-byte chunks XOR-swizzled by
// row % 8, so that ldmatrix of 8 rows reads 8 different bank groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "ops/attention/attention_bwd.cuh"

namespace tessel::attention_detail {

namespace bwd {

constexpr int kBlock = 64;  // query rows and keys per block
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

template <int W>  // element offset of (r, c) in a swizzled tile of rows W elements wide
__device__ __forceinline__ int swz(int r, int c) {
  return r * W + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  }
}

template <class T>
__device__ __forceinline__ T from_f(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(x);
  else
    return __float2half(x);
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 64 rows x D of a strided global tile (rows >= valid: zeros) into a swizzled shared tile.
template <class T, int D>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t row_stride, int valid,
                                          bool vec) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < kBlock * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    T* dst = s + swz<D>(r, c);
    const bool ok = r < valid;
    if (vec) {
      cp_async_16(dst, ok ? g + r * row_stride + c : g, ok);
    } else {
      for (int e = 0; e < 8; ++e) dst[e] = ok ? g[r * row_stride + c + e] : from_f<T>(0.f);
    }
  }
}

// acc[NT][4] += A (16 rows from m0 of a swizzled K-major tile) * B^T (NT*8 rows from n0 of a
// swizzled K-major tile), K = D: both operands "row . row" (S = Q K^T shape).
template <class T, int D, int NT>
__device__ __forceinline__ void gemm_nt(float (&acc)[NT][4], const T* sa, int m0, const T* sb,
                                        int n0) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int kb = 0; kb < D / 16; ++kb) {
    uint32_t a[4];
    ldsm_x4(a, sa + swz<D>(m0 + (l % 8) + 8 * ((l / 8) % 2), kb * 16 + 8 * (l / 16)));
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      uint32_t b[4];
      ldsm_x4(b, sb + swz<D>(n0 + 16 * p + (l % 8) + 8 * (l / 16), kb * 16 + 8 * ((l / 8) % 2)));
      mma<T>(acc[2 * p], a, b[0], b[1]);
      mma<T>(acc[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// acc[D/8][4] += A (16 x 64, fp32 accumulator fragments `f` of a 16 x 64 product, rounded to
// T) * B (64 rows x D of a swizzled tile whose row index is the K index).
template <class T, int D>
__device__ __forceinline__ void gemm_rs(float (&acc)[D / 8][4], const float (&f)[8][4],
                                        const T* sb) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    // Accumulator (row g / g+8, cols 2t, 2t+1) of n-tiles 2kb, 2kb+1 = the A fragment.
    const uint32_t a[4] = {
        pack2<T>(f[2 * kb][0], f[2 * kb][1]), pack2<T>(f[2 * kb][2], f[2 * kb][3]),
        pack2<T>(f[2 * kb + 1][0], f[2 * kb + 1][1]), pack2<T>(f[2 * kb + 1][2], f[2 * kb + 1][3])};
#pragma unroll
    for (int p = 0; p < D / 16; ++p) {
      uint32_t b[4];
      ldsm_x4_t(b, sb + swz<D>(kb * 16 + (l % 8) + 8 * ((l / 8) % 2), 16 * p + 8 * (l / 16)));
      mma<T>(acc[2 * p], a, b[0], b[1]);
      mma<T>(acc[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// Which keys / queries of one sequence a block handles.
struct Seq {
  int b = 0, blk = 0;  // sequence, block index within it
  int64_t q_row0 = 0, k_row0 = 0;
  int sq = 0, skv = 0;
};

// Block `id` of a grid over blocks of the q (by_q) or k rows of every sequence.
__device__ __forceinline__ bool find_seq(const BwdArgs& a, bool by_q, Seq& s) {
  if (a.cu_q == nullptr) {
    s.b = blockIdx.z;
    s.blk = blockIdx.x;
    s.sq = a.sq;
    s.skv = a.skv;
    return true;
  }
  int id = static_cast<int>(blockIdx.x);
  for (int b = 0; b < a.batches; ++b) {
    const int q0 = a.cu_q[b], q1 = a.cu_q[b + 1], k0 = a.cu_k[b], k1 = a.cu_k[b + 1];
    const int nb = ((by_q ? q1 - q0 : k1 - k0) + kBlock - 1) / kBlock;
    if (id < nb) {
      s.b = b, s.blk = id, s.q_row0 = q0, s.k_row0 = k0, s.sq = q1 - q0, s.skv = k1 - k0;
      return true;
    }
    id -= nb;
  }
  return false;
}

// P and dS (into s and dp, in place) of one 16 x 64 fragment pair. Element e of n-tile nt
// is (row r0 + g + 8 (e / 2), col c0 + 8 nt + 2 t + e % 2); `transposed`: rows are keys.
// L2(i) = lse_i log2 e (+inf: the query sees nothing), delta(i) per query.
template <bool kTransposed, bool kCapped, bool kMasked, class LseF, class DeltaF>
__device__ __forceinline__ void probs_and_grads_case(const BwdArgs& a, float (&s)[8][4],
                                                     float (&dp)[8][4], bool need_dp, int r0,
                                                     int c0, int skv, int offset, LseF L2,
                                                     DeltaF delta) {
  const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
  const float mult = a.scale * kLog2e, cap_in = a.scale / a.softcap;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + g + 8 * (e / 2), c = c0 + 8 * nt + 2 * t + e % 2;
      const int i = kTransposed ? c : r, j = kTransposed ? r : c;
      float p, dfac = a.scale;
      if constexpr (kCapped) {
        const float th = tanhf(s[nt][e] * cap_in);
        p = exp2f(fmaf(a.softcap * th, kLog2e, -L2(i)));
        dfac *= 1.f - th * th;
      } else {
        p = exp2f(fmaf(s[nt][e], mult, -L2(i)));
      }
      if constexpr (kMasked) {
        bool vis = j < skv;
        if (a.window_right >= 0) vis = vis && j <= i + offset + a.window_right;
        if (a.window_left >= 0) vis = vis && j >= i + offset - a.window_left;
        if (!vis) p = 0.f;
      }
      s[nt][e] = p;
      if (need_dp) dp[nt][e] = p * (dp[nt][e] - delta(i)) * dfac;
    }
}

// One straight-line copy of the loop per (soft-cap, mask) case: a runtime branch per element
// on either keeps the unrolled loop from being scheduled (as in the WGMMA kernel, session 18).
template <bool kTransposed, class LseF, class DeltaF>
__device__ __forceinline__ void probs_and_grads(const BwdArgs& a, float (&s)[8][4],
                                                float (&dp)[8][4], bool need_dp, int r0, int c0,
                                                int skv, int offset, bool need_mask, LseF L2,
                                                DeltaF delta) {
  if (a.softcap > 0.f) {
    if (need_mask)
      probs_and_grads_case<kTransposed, true, true>(a, s, dp, need_dp, r0, c0, skv, offset, L2,
                                                    delta);
    else
      probs_and_grads_case<kTransposed, true, false>(a, s, dp, need_dp, r0, c0, skv, offset, L2,
                                                     delta);
  } else if (need_mask) {
    probs_and_grads_case<kTransposed, false, true>(a, s, dp, need_dp, r0, c0, skv, offset, L2,
                                                   delta);
  } else {
    probs_and_grads_case<kTransposed, false, false>(a, s, dp, need_dp, r0, c0, skv, offset, L2,
                                                    delta);
  }
}

// kWhich: bit 0 accumulates dV, bit 1 dK (and dQ unless deterministic).
template <class T, int D, int kWhich>
__global__ void __launch_bounds__(kThreads) attention_bwd_dkdv(const BwdArgs a) {
  constexpr bool kDv = kWhich & 1, kDk = kWhich & 2;
  extern __shared__ __align__(128) char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kBlock * D;
  T* sQ = sV + kBlock * D;                                      // [2][64 * D]
  T* sdO = sQ + 2 * kBlock * D;                                 // [2][64 * D]
  T* sDS = sdO + 2 * kBlock * D;                                // [64 * 64], dS^T
  float* sL = reinterpret_cast<float*>(sDS + kBlock * kBlock);  // [2][64]
  float* sDelta = sL + 2 * kBlock;                              // [2][64]

  Seq sq_;
  if (!find_seq(a, false, sq_)) return;
  const int hk = blockIdx.y, group = a.hq / a.hkv;
  const int j0 = sq_.blk * kBlock;
  const int offset = sq_.skv - sq_.sq;
  const int bb = a.cu_q != nullptr ? 0 : sq_.b;  // batch index into the strided views
  const int warp = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;

  // Queries that see some key of [j0, j_last].
  const int j_last = min(j0 + kBlock, sq_.skv) - 1;
  int i_min = 0, i_max = sq_.sq - 1;
  if (a.window_right >= 0) i_min = max(i_min, j0 - offset - a.window_right);
  if (a.window_left >= 0) i_max = min(i_max, j_last - offset + a.window_left);
  const int m_lo = i_min / kBlock;
  const int nm = i_max >= i_min ? i_max / kBlock + 1 - m_lo : 0;
  const int iters = nm * group;

  const T* kg = static_cast<const T*>(a.k) + bb * a.k_sb + (sq_.k_row0 + j0) * a.k_ss + hk * a.k_sh;
  const T* vg = static_cast<const T*>(a.v) + bb * a.v_sb + (sq_.k_row0 + j0) * a.v_ss + hk * a.v_sh;
  load_tile<T, D>(sK, kg, a.k_ss, sq_.skv - j0, a.vec);
  load_tile<T, D>(sV, vg, a.v_ss, sq_.skv - j0, a.vec);

  auto load_q_block = [&](int it, int buf) {
    const int h = hk * group + it / nm, m = m_lo + it % nm;
    const int i0 = m * kBlock;
    const T* qg =
        static_cast<const T*>(a.q) + bb * a.q_sb + (sq_.q_row0 + i0) * a.q_ss + h * a.q_sh;
    const T* dog =
        static_cast<const T*>(a.dout) + bb * a.do_sb + (sq_.q_row0 + i0) * a.do_ss + h * a.do_sh;
    load_tile<T, D>(sQ + buf * kBlock * D, qg, a.q_ss, sq_.sq - i0, a.vec);
    load_tile<T, D>(sdO + buf * kBlock * D, dog, a.do_ss, sq_.sq - i0, a.vec);
    if (threadIdx.x < kBlock) {
      const int i = i0 + threadIdx.x;
      float l2 = INFINITY, dl = 0.f;
      if (i < sq_.sq) {
        const int64_t at = sq_.b * a.lse_sb + h * a.lse_sh + sq_.q_row0 + i;
        const float lse = a.lse[at];
        l2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
        dl = a.delta[at];
      }
      sL[buf * kBlock + threadIdx.x] = l2;
      sDelta[buf * kBlock + threadIdx.x] = dl;
    }
  };

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  if (iters > 0) load_q_block(0, 0);
  cp_async_commit();
  for (int it = 0; it < iters; ++it) {
    const int buf = it % 2;
    if (it + 1 < iters) load_q_block(it + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int h = hk * group + it / nm, m = m_lo + it % nm;
    const int i0 = m * kBlock;
    const T* q_s = sQ + buf * kBlock * D;
    const T* do_s = sdO + buf * kBlock * D;
    const float* l2_s = sL + buf * kBlock;
    const float* dl_s = sDelta + buf * kBlock;

    float s[8][4] = {}, dp[8][4] = {};
    gemm_nt<T, D, 8>(s, sK, 16 * warp, q_s, 0);
    if (kDk) gemm_nt<T, D, 8>(dp, sV, 16 * warp, do_s, 0);
    const bool need_mask =
        j0 + kBlock > sq_.skv ||
        (a.window_right >= 0 && j0 + kBlock - 1 > i0 + offset + a.window_right) ||
        (a.window_left >= 0 && j0 < i0 + kBlock - 1 + offset - a.window_left);
    probs_and_grads<true>(
        a, s, dp, kDk, j0 + 16 * warp, i0, sq_.skv, offset, need_mask,
        [&](int i) { return l2_s[i - i0]; }, [&](int i) { return dl_s[i - i0]; });
    if (kDv) gemm_rs<T, D>(dv, s, do_s);
    if (kDk) {
      gemm_rs<T, D>(dk, dp, q_s);
      if (a.dq_accum != nullptr) {
        // dS^T to shared memory (rows: keys), then dQ rows 16w .. 16w+15 = dS K.
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int r = 16 * warp + g, c = 8 * nt + 2 * t;
          *reinterpret_cast<uint32_t*>(sDS + swz<kBlock>(r, c)) = pack2<T>(dp[nt][0], dp[nt][1]);
          *reinterpret_cast<uint32_t*>(sDS + swz<kBlock>(r + 8, c)) =
              pack2<T>(dp[nt][2], dp[nt][3]);
        }
        __syncthreads();
        float* dq_rows = a.dq_accum + ((int64_t{bb} * a.sq + sq_.q_row0 + i0) * a.hq + h) * D;
        const int64_t row_pitch = int64_t{a.hq} * D;
#pragma unroll 1
        for (int c0 = 0; c0 < D; c0 += 64) {
          float acc[8][4] = {};
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            uint32_t af[4];
            ldsm_x4_t(af, sDS + swz<kBlock>(kb * 16 + (l % 8) + 8 * (l / 16),
                                            16 * warp + 8 * ((l / 8) % 2)));
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              uint32_t b[4];
              ldsm_x4_t(b, sK + swz<D>(kb * 16 + (l % 8) + 8 * ((l / 8) % 2),
                                       c0 + 16 * p + 8 * (l / 16)));
              mma<T>(acc[2 * p], af, b[0], b[1]);
              mma<T>(acc[2 * p + 1], af, b[2], b[3]);
            }
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = 16 * warp + g + 8 * half;
            if (i0 + r >= sq_.sq) continue;
            float* row = dq_rows + r * row_pitch + c0 + 2 * t;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
              atomicAdd(reinterpret_cast<float2*>(row + 8 * nt),
                        make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]));
          }
        }
      }
    }
    __syncthreads();  // the buffers of this block are refilled two iterations on
  }
  cp_async_wait<0>();

  // Write this warp's 16 keys (zeros for keys no query sees).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = j0 + 16 * warp + g + 8 * half;
    if (j >= sq_.skv) continue;
    T* dkr = static_cast<T*>(a.dk) + bb * a.dk_sb + (sq_.k_row0 + j) * a.dk_ss + hk * a.dk_sh;
    T* dvr = static_cast<T*>(a.dv) + bb * a.dv_sb + (sq_.k_row0 + j) * a.dv_ss + hk * a.dv_sh;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int c = 8 * nt + 2 * t;
      if (kDk) {
        dkr[c] = from_f<T>(dk[nt][2 * half]);
        dkr[c + 1] = from_f<T>(dk[nt][2 * half + 1]);
      }
      if (kDv) {
        dvr[c] = from_f<T>(dv[nt][2 * half]);
        dvr[c + 1] = from_f<T>(dv[nt][2 * half + 1]);
      }
    }
  }
}

// Deterministic dQ: one CTA per (64-row query block, q head, sequence).
template <class T, int D>
__global__ void __launch_bounds__(kThreads) attention_bwd_dq(const BwdArgs a) {
  extern __shared__ __align__(128) char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + kBlock * D;
  T* sK = sdO + kBlock * D;     // [2][64 * D]
  T* sV = sK + 2 * kBlock * D;  // [2][64 * D]

  Seq sq_;
  if (!find_seq(a, true, sq_)) return;
  const int h = blockIdx.y, hk = h / (a.hq / a.hkv);
  const int i0 = sq_.blk * kBlock;
  const int offset = sq_.skv - sq_.sq;
  const int bb = a.cu_q != nullptr ? 0 : sq_.b;
  const int warp = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;

  const int i_last = min(i0 + kBlock, sq_.sq) - 1;
  int end = sq_.skv, begin = 0;
  if (a.window_right >= 0) end = min(end, i_last + offset + a.window_right + 1);
  if (a.window_left >= 0) begin = max(0, i0 + offset - a.window_left);
  const int n_hi = end > 0 ? (end + kBlock - 1) / kBlock : 0;
  const int n_lo = min(begin / kBlock, n_hi);

  const T* qg = static_cast<const T*>(a.q) + bb * a.q_sb + (sq_.q_row0 + i0) * a.q_ss + h * a.q_sh;
  const T* dog =
      static_cast<const T*>(a.dout) + bb * a.do_sb + (sq_.q_row0 + i0) * a.do_ss + h * a.do_sh;
  load_tile<T, D>(sQ, qg, a.q_ss, sq_.sq - i0, a.vec);
  load_tile<T, D>(sdO, dog, a.do_ss, sq_.sq - i0, a.vec);
  float l2[2], dl[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = i0 + 16 * warp + g + 8 * half;
    l2[half] = INFINITY, dl[half] = 0.f;
    if (i < sq_.sq) {
      const int64_t at = sq_.b * a.lse_sb + h * a.lse_sh + sq_.q_row0 + i;
      const float lse = a.lse[at];
      l2[half] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      dl[half] = a.delta[at];
    }
  }
  auto load_kv = [&](int n, int buf) {
    const int j0 = n * kBlock;
    const T* kg =
        static_cast<const T*>(a.k) + bb * a.k_sb + (sq_.k_row0 + j0) * a.k_ss + hk * a.k_sh;
    const T* vg =
        static_cast<const T*>(a.v) + bb * a.v_sb + (sq_.k_row0 + j0) * a.v_ss + hk * a.v_sh;
    load_tile<T, D>(sK + buf * kBlock * D, kg, a.k_ss, sq_.skv - j0, a.vec);
    load_tile<T, D>(sV + buf * kBlock * D, vg, a.v_ss, sq_.skv - j0, a.vec);
  };

  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;

  if (n_hi > n_lo) load_kv(n_lo, 0);
  cp_async_commit();
  for (int n = n_lo; n < n_hi; ++n) {
    const int buf = (n - n_lo) % 2;
    if (n + 1 < n_hi) load_kv(n + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int j0 = n * kBlock;
    const T* k_s = sK + buf * kBlock * D;
    const T* v_s = sV + buf * kBlock * D;
    float s[8][4] = {}, dp[8][4] = {};
    gemm_nt<T, D, 8>(s, sQ, 16 * warp, k_s, 0);
    gemm_nt<T, D, 8>(dp, sdO, 16 * warp, v_s, 0);
    const bool need_mask =
        j0 + kBlock > sq_.skv ||
        (a.window_right >= 0 && j0 + kBlock - 1 > i0 + offset + a.window_right) ||
        (a.window_left >= 0 && j0 < i0 + kBlock - 1 + offset - a.window_left);
    const int r0 = i0 + 16 * warp;
    probs_and_grads<false>(
        a, s, dp, true, r0, j0, sq_.skv, offset, need_mask,
        [&](int i) { return i - r0 < 8 ? l2[0] : l2[1]; },
        [&](int i) { return i - r0 < 8 ? dl[0] : dl[1]; });
    gemm_rs<T, D>(dq, dp, k_s);
    __syncthreads();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = i0 + 16 * warp + g + 8 * half;
    if (i >= sq_.sq) continue;
    T* row = static_cast<T*>(a.dq) + bb * a.dq_sb + (sq_.q_row0 + i) * a.dq_ss + h * a.dq_sh;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      row[8 * nt + 2 * t] = from_f<T>(dq[nt][2 * half]);
      row[8 * nt + 2 * t + 1] = from_f<T>(dq[nt][2 * half + 1]);
    }
  }
}

// The kernels need more than 48 KB of dynamic shared memory: opt in once per instantiation
// (every dk/dv variant has the same function type, so the flag lives in this template).
template <class T, int D, int kWhich>
void launch_dkdv(const BwdArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  static bool configured = false;
  if (!configured) {
    cudaFuncSetAttribute(attention_bwd_dkdv<T, D, kWhich>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    configured = true;
  }
  if (grid.x > 0) attention_bwd_dkdv<T, D, kWhich><<<grid, kThreads, smem, stream>>>(a);
}

template <class T, int D>
void launch_bwd_d(const BwdArgs& a, cudaStream_t stream) {
  const bool varlen = a.cu_q != nullptr;
  const size_t dkdv_smem = (6 * kBlock * D + kBlock * kBlock) * sizeof(T) + 4 * kBlock * 4;
  const unsigned kblocks = static_cast<unsigned>((a.skv + kBlock - 1) / kBlock);
  const dim3 kgrid(varlen ? kblocks + a.batches : kblocks, a.hkv, varlen ? 1 : a.batches);
  if constexpr (D == 256) {
    launch_dkdv<T, D, 1>(a, kgrid, dkdv_smem, stream);
    launch_dkdv<T, D, 2>(a, kgrid, dkdv_smem, stream);
  } else {
    launch_dkdv<T, D, 3>(a, kgrid, dkdv_smem, stream);
  }
  if (a.dq_accum == nullptr) {
    const size_t dq_smem = 6 * kBlock * D * sizeof(T);
    const unsigned qblocks = static_cast<unsigned>((a.sq + kBlock - 1) / kBlock);
    const dim3 qgrid(varlen ? qblocks + a.batches : qblocks, a.hq, varlen ? 1 : a.batches);
    static bool configured = false;
    if (!configured) {
      cudaFuncSetAttribute(attention_bwd_dq<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(dq_smem));
      configured = true;
    }
    if (qgrid.x > 0) attention_bwd_dq<T, D><<<qgrid, kThreads, dq_smem, stream>>>(a);
  }
}

}  // namespace bwd

template <class T>
void launch_bwd_typed(const BwdArgs& a, cudaStream_t stream) {
  switch (a.d) {
    case 64: bwd::launch_bwd_d<T, 64>(a, stream); break;
    case 128: bwd::launch_bwd_d<T, 128>(a, stream); break;
    default: bwd::launch_bwd_d<T, 256>(a, stream); break;
  }
}

}  // namespace tessel::attention_detail
