// tessel::attention_forward: validation, the choice between the WGMMA kernels
// (attention_fwd_kernel.cuh) and the SIMT path below, and the SIMT path itself.
//   flops (reported by the bench): 4 * B * Hq * Sq * Skv * D, halved for causal
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/attention/attention_check.hpp"
#include "ops/attention/attention_fwd.cuh"
#include "ops/rows.cuh"
#include "runtime/check.hpp"
#include "tessel/attention.hpp"

namespace tessel {

namespace attention_detail {

namespace {

__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half(x);
}

constexpr int kSimtWarps = 4;
constexpr int kMaxD = 256;

// One warp per (query row, head): lanes take 32 keys at a time (one dot product each), the
// online softmax runs on the warp, and lane l accumulates output columns l, l+32, ...
// Correct for every layout and variant; fp32 CUDA cores, no tensor cores (slow).
template <class T>
__global__ void __launch_bounds__(kSimtWarps * 32) attention_fwd_simt(const FwdArgs a) {
  __shared__ float q_row[kSimtWarps][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t{blockIdx.x} * kSimtWarps + warp;
  const int h = blockIdx.y, hk = h / (a.hq / a.hkv);
  if (r >= a.sq) return;  // per warp; no block-wide barrier below
  int b = blockIdx.z;
  int64_t q_row0 = 0, k_row0 = 0;
  int sq = a.sq, skv = a.skv;
  if (a.cu_q != nullptr) {  // global row r: find its sequence (last b with cu_q[b] <= r)
    int lo = 0, hi = a.batches - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.cu_q[mid] <= r)
        lo = mid;
      else
        hi = mid - 1;
    }
    b = lo;
    q_row0 = a.cu_q[b];
    k_row0 = a.cu_k[b];
    sq = a.cu_q[b + 1] - a.cu_q[b];
    skv = a.cu_k[b + 1] - a.cu_k[b];
  }
  const int i = static_cast<int>(r - q_row0);
  const int bb = a.cu_q != nullptr ? 0 : b;  // batch index into the strided views
  const T* q = static_cast<const T*>(a.q) + bb * a.q_sb + (q_row0 + i) * a.q_ss + h * a.q_sh;
  const T* k = static_cast<const T*>(a.k) + bb * a.k_sb + k_row0 * a.k_ss + hk * a.k_sh;
  const T* v = static_cast<const T*>(a.v) + bb * a.v_sb + k_row0 * a.v_ss + hk * a.v_sh;
  for (int c = lane; c < a.d; c += 32) q_row[warp][c] = to_f(q[c]);
  __syncwarp();

  const int offset = skv - sq;
  int j_lo = 0, j_hi = skv;
  if (a.window_right >= 0) j_hi = min(j_hi, i + offset + a.window_right + 1);
  if (a.window_left >= 0) j_lo = max(j_lo, i + offset - a.window_left);
  const int cols = a.d / 32;  // output columns per lane
  float acc[kMaxD / 32] = {};
  float m = -INFINITY, l = 0.f;
  for (int j0 = j_lo; j0 < j_hi; j0 += 32) {
    const int j = j0 + lane;
    float s = -INFINITY;
    if (j < j_hi) {
      const T* kj = k + int64_t{j} * a.k_ss;
      float dot = 0.f;
      for (int c = 0; c < a.d; ++c) dot += q_row[warp][c] * to_f(kj[c]);
      s = dot * a.scale;
      if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
    }
    float mx = s;
    for (int w = 16; w > 0; w /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, w));
    const float m_new = fmaxf(m, mx);
    const float alpha = expf(m - m_new);  // m = -inf: 0
    const float p = expf(s - m_new);
    float ps = p;
    for (int w = 16; w > 0; w /= 2) ps += __shfl_xor_sync(0xffffffffu, ps, w);
    l = l * alpha + ps;
    for (int t = 0; t < cols; ++t) acc[t] *= alpha;
    const int n = min(32, j_hi - j0);
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const T* vj = v + int64_t{j0 + jj} * a.v_ss;
      for (int t = 0; t < cols; ++t) acc[t] += pj * to_f(vj[lane + 32 * t]);
    }
    m = m_new;
  }
  // m stays -inf only when no key is visible (every chunk has a finite logit otherwise).
  float o_scale = 0.f, lse = -INFINITY;
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  const float m_fin = fmaxf(m, sink);
  if (m_fin != -INFINITY) {
    const float keep = m == -INFINITY ? 0.f : expf(m - m_fin);
    const float den = l * keep + (a.sinks != nullptr ? expf(sink - m_fin) : 0.f);
    o_scale = keep / den;
    lse = m_fin + logf(den);
  }
  T* o = static_cast<T*>(a.out) + bb * a.o_sb + (q_row0 + i) * a.o_ss + h * a.o_sh;
  for (int t = 0; t < cols; ++t) o[lane + 32 * t] = from_f<T>(acc[t] * o_scale);
  if (a.lse != nullptr && lane == 0) a.lse[b * a.lse_sb + h * a.lse_sh + q_row0 + i] = lse;
}

template <class T>
void launch_simt(const FwdArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.sq + kSimtWarps - 1) / kSimtWarps), a.hq,
                  a.cu_q != nullptr ? 1 : a.batches);
  attention_fwd_simt<T><<<grid, kSimtWarps * 32, 0, stream>>>(a);
}

bool stride_ok(int64_t s) { return s % 8 == 0 && s > 0 && s < (int64_t{1} << 38); }

}  // namespace

bool wgmma_supported(const FwdArgs& a, bool) {
  if (a.d != 64 && a.d != 128 && a.d != 256) return false;
  if (a.sq < 1 || a.skv < 1 || a.batches > 65535 || a.hq > 65535) return false;
  for (const void* p : {a.q, a.k, a.v, static_cast<const void*>(a.out)})
    if (!detail::aligned(p, 16)) return false;
  const bool varlen = a.cu_q != nullptr;
  // Strides of size-1 modes are never used (and TMA gets a valid stand-in).
  auto ok = [&](int64_t size, int64_t s) { return size <= 1 || stride_ok(s); };
  const int64_t b = varlen ? 1 : a.batches;
  return ok(b, a.q_sb) && ok(a.sq, a.q_ss) && ok(a.hq, a.q_sh) && ok(b, a.k_sb) &&
         ok(a.skv, a.k_ss) && ok(a.hkv, a.k_sh) && ok(b, a.v_sb) && ok(a.skv, a.v_ss) &&
         ok(a.hkv, a.v_sh) && ok(b, a.o_sb) && ok(a.sq, a.o_ss) && ok(a.hq, a.o_sh);
}

}  // namespace attention_detail

namespace {

using attention_detail::check_last_contiguous;
using attention_detail::FwdArgs;

// "simt" forces the SIMT path (tests cover both paths on the same inputs).
bool force_simt() {
  const char* e = std::getenv("TESSEL_ATTENTION_PATH");
  return e != nullptr && std::strcmp(e, "simt") == 0;
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor* lse,
                       const AttentionParams& params, cudaStream_t stream) {
  detail::OpCheck chk("attention_forward");
  const attention_detail::AttnShape g = attention_detail::check_qkv(chk, q, k, v, lse, params);
  chk.same_dtype("out", out, "q", q);
  chk.same_shape("out", out, "q", q);
  check_last_contiguous(chk, "out", out);
  const bool varlen = g.varlen;
  const int64_t batches = g.batches, sq = g.sq, skv = g.skv, d = g.d, hq = g.hq, hkv = g.hkv;
  if (batches == 0 || sq == 0 || hq == 0) return;  // nothing to write
  chk.device_pointer("q", q);
  chk.device_pointer("k", k);
  chk.device_pointer("v", v);
  chk.device_pointer("out", out);
  if (lse) chk.device_pointer("lse", *lse);
  if (params.sinks) chk.device_pointer("sinks", *params.sinks);
  if (varlen) {
    chk.device_pointer("cu_seqlens_q", *params.cu_seqlens_q);
    chk.device_pointer("cu_seqlens_k", *params.cu_seqlens_k);
  }

  FwdArgs a;
  a.q = q.data, a.k = k.data, a.v = v.data, a.out = out.data;
  a.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  a.sinks = params.sinks ? static_cast<const float*>(params.sinks->data) : nullptr;
  const int o = varlen ? 1 : 0;  // axis offset: varlen tensors have no batch axis
  if (varlen) {
    a.cu_q = static_cast<const int*>(params.cu_seqlens_q->data);
    a.cu_k = static_cast<const int*>(params.cu_seqlens_k->data);
  } else {
    a.q_sb = q.strides[0], a.k_sb = k.strides[0], a.v_sb = v.strides[0], a.o_sb = out.strides[0];
  }
  a.q_ss = q.strides[1 - o], a.q_sh = q.strides[2 - o];
  a.k_ss = k.strides[1 - o], a.k_sh = k.strides[2 - o];
  a.v_ss = v.strides[1 - o], a.v_sh = v.strides[2 - o];
  a.o_ss = out.strides[1 - o], a.o_sh = out.strides[2 - o];
  a.lse_sb = varlen ? 0 : hq * sq;
  a.lse_sh = sq;
  a.batches = static_cast<int>(batches), a.hq = static_cast<int>(hq), a.hkv = static_cast<int>(hkv);
  a.d = static_cast<int>(d), a.sq = static_cast<int>(sq), a.skv = static_cast<int>(skv);
  a.scale = params.scale > 0.f ? params.scale : 1.0f / std::sqrt(static_cast<float>(d));
  a.softcap = params.softcap;
  a.window_left = params.window_left;
  a.window_right = params.causal ? 0 : params.window_right;
  // No key is sq + skv or more away from a query's diagonal: such windows are unlimited (and
  // would overflow the kernels' int arithmetic near INT_MAX).
  if (a.window_left >= sq + skv) a.window_left = -1;
  if (a.window_right >= sq + skv) a.window_right = -1;

  a.sms = detail::current_sm_count();
  const bool bf16 = q.dtype == DType::bf16;
  if (!force_simt() && attention_detail::wgmma_supported(a, bf16)) {
    if (bf16)
      attention_detail::launch_wgmma_bf16(a, stream);
    else
      attention_detail::launch_wgmma_f16(a, stream);
  } else {
    if (bf16)
      attention_detail::launch_simt<__nv_bfloat16>(a, stream);
    else
      attention_detail::launch_simt<__half>(a, stream);
  }
  detail::check_launch("attention_forward");
}

}  // namespace tessel
