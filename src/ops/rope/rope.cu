// Rotary position embedding, in place on q and k in one launch. A block handles `tpb` tokens:
// first its threads build cos/sin for every (token, frequency) in shared memory (angle formed
// and range-reduced in fp64, sincosf in fp32), then they sweep the (token, head, pair-vector)
// items of q and k heads alike. Vector path: neox moves two 16-byte vectors (x[i..], x[i+half..])
// per item, gptj one 16-byte vector of interleaved pairs. Bytes: read + write the rotary part
// of q and k, read positions.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <string>

#include "ops/rows.cuh"
#include "tessel/rope.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 256;
constexpr int kMaxRotary = 512;

template <class T>
struct RopeArgs {
  T* q;
  T* k;
  int64_t q_ts, q_hs, k_ts, k_hs;  // token / head strides (elements)
  int64_t tokens;
  int hq, hkv, half, tpb;
  float sign;  // +1 forward, -1 backward
  double inv_freq[kMaxRotary / 2];
};

// The block's cos / sin table: (token, frequency) of its tokens, the angle formed and
// range-reduced in fp64, sincosf in fp32; sin carries the direction's sign.
template <class T, class P>
__device__ __forceinline__ void rope_tables(const P* __restrict__ pos, const RopeArgs<T>& a,
                                            int64_t t0, int half, float* cs, float* sn) {
  constexpr double kTwoPi = 2.0 * std::numbers::pi, kInvTwoPi = 1.0 / kTwoPi;
  for (int idx = threadIdx.x; idx < a.tpb * half; idx += kBlock) {
    const int t = idx / half, i = idx - t * half;
    if (t0 + t >= a.tokens) break;
    double ang = static_cast<double>(pos[t0 + t]) * a.inv_freq[i];
    ang = fma(-rint(ang * kInvTwoPi), kTwoPi, ang);
    float s, c;
    sincosf(static_cast<float>(ang), &s, &c);
    cs[idx] = c;
    sn[idx] = a.sign * s;
  }
}

// One neox (token, head, pair-vector) item in place: x[i0 ..] and x[half + i0 ..].
template <class T, int VP>
struct NeoxItem {
  T* base = nullptr;
  const float* c = nullptr;
  const float* s = nullptr;
  int i0 = 0;
  Frag<T, VP> fa, fb;
  __device__ __forceinline__ void load(int half) {
    fa = load_frag<VP>(base + i0);
    fb = load_frag<VP>(base + half + i0);
  }
  __device__ __forceinline__ void rotate_store(int half) {
#pragma unroll
    for (int j = 0; j < VP; ++j) {
      const float x0 = to_f32(fa.v[j]), x1 = to_f32(fb.v[j]);
      fa.v[j] = from_f32<T>(x0 * c[j] - x1 * s[j]);
      fb.v[j] = from_f32<T>(x1 * c[j] + x0 * s[j]);
    }
    store_frag<VP>(base + i0, fa);
    store_frag<VP>(base + half + i0, fb);
  }
};

// U items per thread per round, all loaded before any is stored (the stores may alias later
// loads as far as the compiler knows, so it would not hoist them itself).
template <class T, int VP, int U, class P>
__global__ void __launch_bounds__(kBlock)
    rope_neox_kernel(const P* __restrict__ pos, const __grid_constant__ RopeArgs<T> a) {
  extern __shared__ float sm[];
  const int half = a.half;
  float* cs = sm;
  float* sn = sm + a.tpb * half;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * a.tpb;
  rope_tables(pos, a, t0, half, cs, sn);
  __syncthreads();
  const int per_head = half / VP;
  const int items = (a.hq + a.hkv) * per_head;
  const int64_t left = a.tokens - t0;
  const int total = static_cast<int>(left < a.tpb ? left : a.tpb) * items;
  for (int idx0 = threadIdx.x; idx0 < total; idx0 += U * kBlock) {
    NeoxItem<T, VP> it[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = idx0 + u * kBlock;
      if (idx >= total) break;
      const int t = idx / items;
      const int r = idx - t * items;
      const int64_t tok = t0 + t;
      const int h = r / per_head;
      it[u].i0 = (r - h * per_head) * VP;
      it[u].base =
          h < a.hq ? a.q + tok * a.q_ts + h * a.q_hs : a.k + tok * a.k_ts + (h - a.hq) * a.k_hs;
      it[u].c = cs + t * half + it[u].i0;
      it[u].s = sn + t * half + it[u].i0;
      it[u].load(half);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (idx0 + u * kBlock < total) it[u].rotate_store(half);
  }
}

// The earlier kernel (gptj, unaligned views, TESSEL_ROPE_UNROLL=0): one item per thread and
// round, its token bound checked per item. (Its cos / sin loop is rope_neox_kernel's.)
template <class T, int VP, bool NEOX, class P>
__global__ void __launch_bounds__(kBlock)
    rope_kernel(const P* __restrict__ pos, const __grid_constant__ RopeArgs<T> a) {
  extern __shared__ float sm[];
  const int half = a.half;
  float* cs = sm;
  float* sn = sm + a.tpb * half;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * a.tpb;
  rope_tables(pos, a, t0, half, cs, sn);
  __syncthreads();
  const int per_head = half / VP;
  const int items = (a.hq + a.hkv) * per_head;
  for (int idx = threadIdx.x; idx < a.tpb * items; idx += kBlock) {
    const int t = idx / items;
    const int r = idx - t * items;
    const int64_t tok = t0 + t;
    if (tok >= a.tokens) break;
    const int h = r / per_head;
    const int i0 = (r - h * per_head) * VP;
    T* base = h < a.hq ? a.q + tok * a.q_ts + h * a.q_hs : a.k + tok * a.k_ts + (h - a.hq) * a.k_hs;
    const float* c = cs + t * half + i0;
    const float* s = sn + t * half + i0;
    if constexpr (NEOX) {
      Frag<T, VP> fa = load_frag<VP>(base + i0), fb = load_frag<VP>(base + half + i0);
#pragma unroll
      for (int j = 0; j < VP; ++j) {
        const float x0 = to_f32(fa.v[j]), x1 = to_f32(fb.v[j]);
        fa.v[j] = from_f32<T>(x0 * c[j] - x1 * s[j]);
        fb.v[j] = from_f32<T>(x1 * c[j] + x0 * s[j]);
      }
      store_frag<VP>(base + i0, fa);
      store_frag<VP>(base + half + i0, fb);
    } else if constexpr (VP > 1) {
      Frag<T, 2 * VP> f = load_frag<2 * VP>(base + 2 * i0);
#pragma unroll
      for (int j = 0; j < VP; ++j) {
        const float x0 = to_f32(f.v[2 * j]), x1 = to_f32(f.v[2 * j + 1]);
        f.v[2 * j] = from_f32<T>(x0 * c[j] - x1 * s[j]);
        f.v[2 * j + 1] = from_f32<T>(x1 * c[j] + x0 * s[j]);
      }
      store_frag<2 * VP>(base + 2 * i0, f);
    } else {
      const float x0 = to_f32(base[2 * i0]), x1 = to_f32(base[2 * i0 + 1]);
      base[2 * i0] = from_f32<T>(x0 * c[0] - x1 * s[0]);
      base[2 * i0 + 1] = from_f32<T>(x1 * c[0] + x0 * s[0]);
    }
  }
}

// The current device's peak memory bandwidth per SM (GB/s), from its memory clock and bus
// width (2 transfers per clock); 0 where the attributes are unavailable.
double memory_gbps_per_sm() {
  static double cache[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0.0;
  if (cache[dev] == 0.0) {
    int khz = 0, bits = 0, sms = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms <= 0) {
      (void)cudaGetLastError();
      return 0.0;
    }
    cache[dev] = 2.0 * khz * 1e3 * (bits / 8.0) / 1e9 / sms;
  }
  return cache[dev];
}

void inv_freq(const RopeParams& prm, int64_t rd, double* out) {
  for (int64_t i = 0; i < rd / 2; ++i) {
    double f = std::pow(prm.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
    if (prm.llama3) {
      const double old_len = static_cast<double>(prm.original_max_position_embeddings);
      const double low_wl = old_len / prm.low_freq_factor, high_wl = old_len / prm.high_freq_factor;
      const double wl = 2.0 * std::numbers::pi / f;
      if (wl > low_wl) {
        f = f / prm.factor;
      } else if (wl >= high_wl) {
        const double sm =
            (old_len / wl - prm.low_freq_factor) / (prm.high_freq_factor - prm.low_freq_factor);
        f = (1.0 - sm) * f / prm.factor + sm * f;
      }
    }
    out[i] = f;
  }
}

void run(const char* op, const char* qn, const char* kn, Tensor& q, Tensor& k,
         const Tensor& positions, const RopeParams& prm, float sign, cudaStream_t stream) {
  detail::OpCheck chk(op);
  if (prm.style != RopeStyle::neox && prm.style != RopeStyle::gptj)
    chk.fail("params.style", "tessel::RopeStyle neox (0) or gptj (1)",
             "code " + std::to_string(static_cast<int>(prm.style)));
  if (!(prm.theta > 0.0) || !std::isfinite(prm.theta))
    chk.fail("params.theta", "a finite theta > 0", std::to_string(prm.theta));
  if (prm.llama3 &&
      !(prm.factor > 0.0 && prm.low_freq_factor > 0.0 &&
        prm.high_freq_factor > prm.low_freq_factor && prm.original_max_position_embeddings > 0))
    chk.fail("params",
             "llama3 scaling with factor > 0, 0 < low_freq_factor < high_freq_factor, "
             "original_max_position_embeddings > 0",
             "factor " + std::to_string(prm.factor) + ", low " +
                 std::to_string(prm.low_freq_factor) + ", high " +
                 std::to_string(prm.high_freq_factor) + ", original " +
                 std::to_string(prm.original_max_position_embeddings));
  chk.dtype_in(qn, q, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in(kn, k, {DType::f32, DType::f16, DType::bf16});
  chk.dtype_in("positions", positions, {DType::i32, DType::i64});
  chk.same_dtype(kn, k, qn, q);
  chk.rank_in(qn, q, 3, 3);
  chk.rank_in(kn, k, 3, 3);
  chk.rank_in("positions", positions, 1, 1);
  const int64_t T = q.shape[0], D = q.shape[2];
  if (k.shape[0] != T || k.shape[2] != D)
    chk.fail(kn,
             "shape (" + std::to_string(T) + ", Hkv, " + std::to_string(D) +
                 ") (q's tokens and head dim)",
             "shape " + detail::dims_string(k));
  if (positions.shape[0] != T)
    chk.fail("positions", "shape (" + std::to_string(T) + ",) (one position per token)",
             "shape " + detail::dims_string(positions));
  const int64_t rd = prm.rotary_dim == 0 ? D : prm.rotary_dim;
  if (rd < 0 || rd % 2 != 0 || rd > D || rd > kMaxRotary)
    chk.fail("params.rotary_dim",
             "an even rotary_dim <= head dim " + std::to_string(D) +
                 " and <= " + std::to_string(kMaxRotary) + " (0: head dim)",
             std::to_string(prm.rotary_dim));
  for (const Tensor* t : {&q, &k}) {
    const char* nm = t == &q ? qn : kn;
    for (int d = 0; d < 3; ++d)
      if (t->strides[d] < 0)
        chk.fail(nm, "non-negative strides", "strides of " + detail::dims_string(*t));
    if (t->shape[2] > 1 && t->strides[2] != 1 && t->numel() > 0)
      chk.fail(nm, "unit stride on the last axis", "last stride " + std::to_string(t->strides[2]));
  }
  chk.contiguous("positions", positions);
  const int64_t hq = q.shape[1], hkv = k.shape[1];
  if (T == 0 || rd == 0 || hq + hkv == 0) return;
  if (hq > 0) chk.device_pointer(qn, q);
  if (hkv > 0) chk.device_pointer(kn, k);
  chk.device_pointer("positions", positions);
  if ((hq + hkv) * (rd / 2) > (int64_t{1} << 30))
    chk.fail(qn, "fewer than 2^30 rotary pairs per token", "more");

  detail::dispatch_float_dtype(q.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    constexpr int V = kVec16<T_>;
    RopeArgs<T_> a{};
    a.q = static_cast<T_*>(q.data);
    a.k = static_cast<T_*>(k.data);
    a.q_ts = q.strides[0];
    a.q_hs = q.strides[1];
    a.k_ts = k.strides[0];
    a.k_hs = k.strides[1];
    a.tokens = T;
    a.hq = static_cast<int>(hq);
    a.hkv = static_cast<int>(hkv);
    a.half = static_cast<int>(rd / 2);
    a.sign = sign;
    inv_freq(prm, rd, a.inv_freq);
    auto ok = [&](const Tensor& t, int64_t heads) {
      return heads == 0 || (detail::aligned(t.data, 16) && (T == 1 || t.strides[0] % V == 0) &&
                            (heads == 1 || t.strides[1] % V == 0));
    };
    const bool neox = prm.style == RopeStyle::neox;
    const bool vec_ok = ok(q, hq) && ok(k, hkv) && (neox ? a.half % V == 0 : rd % V == 0);
    const int vp = vec_ok ? (neox ? V : V / 2) : 1;
    const int64_t items = (hq + hkv) * (a.half / vp);
    // Tokens per block from the bytes each SM must keep in flight (docs/llm_ops.md, session 22;
    // T = 16384, 32 + 8 heads x 128, bf16 neox): ~1.25 items per thread where an SM draws
    // ~25 GB/s (H100: 1 token per block, 0.97 of copy; 2 tokens 0.95), ~2.5 where it draws
    // ~37 GB/s (H200: 2 tokens 0.94 of copy; 1 token 0.88-0.91, 4 tokens 0.91).
    // TESSEL_ROPE_TPB=n overrides; TESSEL_ROPE_UNROLL=1/2/4 items in flight per thread in the
    // neox vector kernel (default 1), 0 the earlier kernel (A/B switches).
    static const int tpb_env = [] {
      const char* e = std::getenv("TESSEL_ROPE_TPB");
      return e ? std::atoi(e) : 0;
    }();
    static const int unroll_env = [] {
      const char* e = std::getenv("TESSEL_ROPE_UNROLL");
      return e ? std::atoi(e) : 1;
    }();
    const int64_t per_block = kBlock * (memory_gbps_per_sm() > 30.0 ? 10 : 5) / 4;  // 2.5 / 1.25
    a.tpb = static_cast<int>(
        std::clamp<int64_t>((per_block + items - 1) / std::max<int64_t>(items, 1), 1, 16));
    if (tpb_env >= 1 && tpb_env <= 64 && int64_t{tpb_env} * a.half <= 16384) a.tpb = tpb_env;
    const unsigned grid = static_cast<unsigned>(tile::ceil_div(T, a.tpb));
    const size_t smem = sizeof(float) * 2 * a.tpb * a.half;
    auto launch = [&](auto pos_tag) {
      using P = decltype(pos_tag);
      const P* pp = static_cast<const P*>(positions.data);
      if (vec_ok && neox && unroll_env > 0) {
        if (unroll_env >= 4)
          rope_neox_kernel<T_, V, 4, P><<<grid, kBlock, smem, stream>>>(pp, a);
        else if (unroll_env >= 2)
          rope_neox_kernel<T_, V, 2, P><<<grid, kBlock, smem, stream>>>(pp, a);
        else
          rope_neox_kernel<T_, V, 1, P><<<grid, kBlock, smem, stream>>>(pp, a);
      } else if (vec_ok) {
        if (neox)
          rope_kernel<T_, V, true, P><<<grid, kBlock, smem, stream>>>(pp, a);
        else
          rope_kernel<T_, V / 2, false, P><<<grid, kBlock, smem, stream>>>(pp, a);
      } else {
        if (neox)
          rope_kernel<T_, 1, true, P><<<grid, kBlock, smem, stream>>>(pp, a);
        else
          rope_kernel<T_, 1, false, P><<<grid, kBlock, smem, stream>>>(pp, a);
      }
    };
    if (positions.dtype == DType::i32)
      launch(int32_t{});
    else
      launch(int64_t{});
  });
  detail::check_launch(op);
}

}  // namespace

void rope(Tensor& q, Tensor& k, const Tensor& positions, const RopeParams& params,
          cudaStream_t stream) {
  run("rope", "q", "k", q, k, positions, params, 1.f, stream);
}

void rope_backward(Tensor& dq, Tensor& dk, const Tensor& positions, const RopeParams& params,
                   cudaStream_t stream) {
  run("rope_backward", "dq", "dk", dq, dk, positions, params, -1.f, stream);
}

}  // namespace tessel
