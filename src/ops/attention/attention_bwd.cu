// tessel::attention_backward: validation, the workspaces, and the small kernels around the
// tensor-core ones (attention_bwd_kernel.cuh):
//   1. delta_i = rowsum(dout_i * out_i)        (f32, laid out like lse)
//   2. dk/dv kernel (+ dq atomics into an f32 workspace; deterministic: a dq kernel instead):
//      the TMA + WGMMA kernel (attention_bwd_wgmma_kernel.cuh) where bwd_wgmma_supported(),
//      else the mma.sync kernels (attention_bwd_kernel.cuh)
//   3. dq workspace -> dq in the input dtype   (not in deterministic mode; the D = 64 / 128
//      WGMMA kernel's workspace is blocked by 64-row tiles, attention_bwd.cuh, and its convert
//      is a programmatic dependent launch that waits per (sequence, kv head) on
//      BwdArgs::kv_done instead of on the whole kernel)
//   4. d_sinks (optional): one CTA per head, a fixed-order reduction
//   flops (reported by the bench): 2.5 x the forward's 4 * B * Hq * Sq * Skv * D, halved for
//   causal (the FlashAttention convention)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/attention/attention_bwd.cuh"
#include "ops/attention/attention_check.hpp"
#include "ops/rows.cuh"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "runtime/workspace.hpp"
#include "tessel/attention_backward.hpp"
#include "tile/tile.cuh"

namespace tessel {

namespace {

using attention_detail::BwdArgs;

__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void store_f(__half* p, float x) { *p = __float2half(x); }

struct RowsView {  // a (batch, row, head, D) view with a contiguous last axis
  const void* p = nullptr;
  int64_t sb = 0, ss = 0, sh = 0;
};

constexpr int kDeltaWarps = 4;

// One warp per (query row, head): delta = dout . out in f32.
template <class T>
__global__ void __launch_bounds__(kDeltaWarps * 32)
    attention_bwd_delta(RowsView out, RowsView dout, float* delta, int rows, int d, int64_t lse_sb,
                        int64_t lse_sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * kDeltaWarps + warp;
  if (r >= rows) return;
  const int h = blockIdx.y, b = blockIdx.z;
  const T* o = static_cast<const T*>(out.p) + b * out.sb + r * out.ss + h * out.sh;
  const T* g = static_cast<const T*>(dout.p) + b * dout.sb + r * dout.ss + h * dout.sh;
  float s = 0.f;
  for (int c = lane; c < d; c += 32) s += to_f(o[c]) * to_f(g[c]);
  for (int w = 16; w > 0; w /= 2) s += __shfl_xor_sync(0xffffffffu, s, w);
  if (lane == 0) delta[b * lse_sb + h * lse_sh + r] = s;
}

// The same with 16-byte loads (out, dout 16-byte aligned, strides multiples of 8): d / 8
// threads per (row, head), heads fastest across the block so that a row's heads are read
// contiguously; one block covers kDeltaVecThreads * 8 / d (row, head) pairs of one batch.
constexpr int kDeltaVecThreads = 256;
template <class T, int D>
__global__ void __launch_bounds__(kDeltaVecThreads)
    attention_bwd_delta_vec(RowsView out, RowsView dout, float* delta, int rows, int hq,
                            int64_t lse_sb, int64_t lse_sh) {
  constexpr int kLanes = D / 8;  // threads per (row, head): 8, 16 or 32, within a warp
  const int64_t pair = int64_t{blockIdx.x} * (kDeltaVecThreads / kLanes) + threadIdx.x / kLanes;
  const int sub = threadIdx.x % kLanes, b = blockIdx.z;
  const bool live = pair < int64_t{rows} * hq;
  const int r = static_cast<int>(pair / hq), h = static_cast<int>(pair % hq);
  float s = 0.f;
  if (live) {
    const T* o = static_cast<const T*>(out.p) + b * out.sb + r * out.ss + h * out.sh + 8 * sub;
    const T* g = static_cast<const T*>(dout.p) + b * dout.sb + r * dout.ss + h * dout.sh + 8 * sub;
    const uint4 ov = *reinterpret_cast<const uint4*>(o), gv = *reinterpret_cast<const uint4*>(g);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
    for (int i = 0; i < 8; ++i) s += to_f(oe[i]) * to_f(ge[i]);
  }
#pragma unroll
  for (int w = kLanes / 2; w > 0; w /= 2) s += __shfl_xor_sync(0xffffffffu, s, w);
  if (live && sub == 0) delta[b * lse_sb + h * lse_sh + r] = s;
}

// dq (strided, T) = the f32 workspace (rows, Hq, D); padded rows are (batch, sq) flattened.
template <class T>
__global__ void attention_bwd_dq_convert(const float* acc, T* dq, int64_t n, int hq, int d, int sq,
                                         bool padded, int64_t sb, int64_t ss, int64_t sh) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(idx % d);
    const int64_t rh = idx / d;
    const int h = static_cast<int>(rh % hq);
    const int64_t rg = rh / hq;
    const int64_t b = padded ? rg / sq : 0, r = padded ? rg % sq : rg;
    store_f(dq + b * sb + r * ss + h * sh + c, acc[idx]);
  }
}

// The blocked dq workspace (attention_bwd.cuh) -> dq in T: one CTA per (tile, head) reads the
// tile in its storage order (16-byte loads), reorders it through shared memory and writes whole
// rows; rows past the sequence (and varlen tiles between sequences) are skipped.
constexpr int kConvertThreads = 256;
template <class T>
__global__ void __launch_bounds__(kConvertThreads)
    attention_bwd_dq_convert_blocked(const attention_detail::BwdArgs a, T* dq, bool vec) {
  using attention_detail::kDqTileRows;
  __shared__ float tile[kDqTileRows][128 + 1];  // d <= 128
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y), d = a.d;
  int b = 0;
  if (a.cu_q != nullptr) {  // the last sequence whose first tile is <= t
    int lo = 0, hi = a.batches - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (attention_detail::dq_tile0(a, mid, a.cu_q[mid]) <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    b = lo;
  } else {
    b = static_cast<int>(t / ((a.sq + kDqTileRows - 1) / kDqTileRows));
  }
  const int64_t q_row0 = a.cu_q != nullptr ? a.cu_q[b] : 0;
  const int len = a.cu_q != nullptr ? a.cu_q[b + 1] - a.cu_q[b] : a.sq;
  const int64_t i0 = (t - attention_detail::dq_tile0(a, b, q_row0)) * kDqTileRows;
  if (i0 >= len) return;
  if (a.kv_done != nullptr) {  // launched early (programmatic dependent): wait for the tile's
    // (sequence, kv head) to have all its key blocks done
    if (threadIdx.x == 0) {
      const int skv = a.cu_k != nullptr ? a.cu_k[b + 1] - a.cu_k[b] : a.skv;
      const int blocks = (skv + attention_detail::kDqKeyBlock - 1) / attention_detail::kDqKeyBlock;
      tile::wait_counter_at_least(a.kv_done + b * a.hkv + h / (a.hq / a.hkv), blocks);
    }
    __syncthreads();
  }
  // Without the memset (BwdArgs::dq_tickets), a tile no key block touched holds no sum: zeros.
  const bool touched = a.dq_tickets == nullptr || __ldcg(a.dq_tickets + t * a.hq + h) != 0;
  const float4* src =
      reinterpret_cast<const float4*>(a.dq_accum + (t * a.hq + h) * int64_t{kDqTileRows * d});
  for (int u = threadIdx.x; u < kDqTileRows * d / 4; u += kConvertThreads) {
    const int w = u / 1024, g = u % 1024 / 128, th = u % 128;
    // written through L2 by other SMs' bulk copies
    const float4 v = touched ? __ldcg(src + u) : make_float4(0.f, 0.f, 0.f, 0.f);
    const int r = 16 * (th / 32) + (th % 32) / 4, c = 64 * w + 8 * g + 2 * (th % 4);
    tile[r][c] = v.x, tile[r][c + 1] = v.y, tile[r + 8][c] = v.z, tile[r + 8][c + 1] = v.w;
  }
  __syncthreads();
  const int rows = static_cast<int>(min(int64_t{kDqTileRows}, len - i0));
  T* out = dq + (a.cu_q != nullptr ? 0 : b * a.dq_sb) + h * a.dq_sh;
  if (vec) {  // 8 elements (16 bytes) per store
    for (int u = threadIdx.x; u < rows * d / 8; u += kConvertThreads) {
      const int r = u / (d / 8), c = 8 * (u % (d / 8));
      uint4 v;
      T* e = reinterpret_cast<T*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) store_f(e + i, tile[r][c + i]);
      *reinterpret_cast<uint4*>(out + (q_row0 + i0 + r) * a.dq_ss + c) = v;
    }
  } else {
    for (int u = threadIdx.x; u < rows * d; u += kConvertThreads) {
      const int r = u / d, c = u % d;
      store_f(out + (q_row0 + i0 + r) * a.dq_ss + c, tile[r][c]);
    }
  }
}

constexpr int kSinkThreads = 256;

// d_sinks[h] = -sum over every (batch, row) of exp(sink_h - lse) * delta, in a fixed order.
__global__ void __launch_bounds__(kSinkThreads)
    attention_bwd_dsinks(const float* sinks, const float* lse, const float* delta, float* d_sinks,
                         int64_t n, int sq, bool padded, int64_t lse_sb, int64_t lse_sh) {
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x;
  const float sink = sinks[h];
  float s = 0.f;
  for (int64_t idx = threadIdx.x; idx < n; idx += kSinkThreads) {
    const int64_t b = padded ? idx / sq : 0, r = padded ? idx % sq : idx;
    const int64_t at = b * lse_sb + h * lse_sh + r;
    const float l = lse[at];
    if (l != -INFINITY) s -= expf(sink - l) * delta[at];
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kSinkThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) d_sinks[h] = part[0];
}

using detail::AsyncBuffer;  // stream-ordered scratch (runtime/workspace.hpp)

bool vec_ok(const Tensor& t, int o) {
  if (!detail::aligned(t.data, 16)) return false;
  for (int ax = 0; ax < 3 - o; ++ax)
    if (t.shape[ax] > 1 && t.strides[ax] % 8 != 0) return false;
  return true;
}

bool tma_stride_ok(int64_t size, int64_t s) {
  return size <= 1 || (s % 8 == 0 && s > 0 && s < (int64_t{1} << 38));
}

// TESSEL_ATTENTION_BWD_PATH=mma forces the mma.sync kernels (tests run both paths).
bool force_mma() {
  const char* e = std::getenv("TESSEL_ATTENTION_BWD_PATH");
  return e != nullptr && std::strcmp(e, "mma") == 0;
}

// TESSEL_ATTENTION_BWD_ORDER=0: the WGMMA kernels keep the grid's own key-block order under
// causal masks (A/B; see BwdArgs::order_pairs). attention_detail::set_bwd_order_pairs forces a
// section size (tests).
std::atomic<int> g_order_pairs{-1};
bool key_block_order_allowed() {
  static const bool allowed = [] {
    const char* e = std::getenv("TESSEL_ATTENTION_BWD_ORDER");
    return !(e && e[0] == '0');
  }();
  return allowed;
}

// TESSEL_ATTENTION_BWD_OVERLAP=0: the blocked convert kernel waits for the whole WGMMA kernel
// (an ordinary launch) instead of starting on the SMs its last key blocks leave idle (A/B).
bool convert_overlap_allowed() {
  const char* e = std::getenv("TESSEL_ATTENTION_BWD_OVERLAP");
  return !(e && e[0] == '0');
}

// TESSEL_ATTENTION_BWD_TICKETS=0 / 1: the blocked workspace zeroed by a memset / by each tile's
// first dQ, stored instead of added (BwdArgs::dq_tickets), for every mask; unset: tickets under
// causal-like masks, where a key block's first query blocks are ones that no other key block has
// reached yet, so the others rarely wait for the store.
int tickets_mode() {
  const char* e = std::getenv("TESSEL_ATTENTION_BWD_TICKETS");
  return e == nullptr ? -1 : e[0] == '0' ? 0 : 1;
}

}  // namespace

namespace attention_detail {
void set_bwd_order_pairs(int n) { g_order_pairs.store(n); }

bool bwd_wgmma_supported(const BwdArgs& a) {
  if (a.d != 64 && a.d != 128 && a.d != 256) return false;
  // hq: the grid of the blocked dq convert (gridDim.y).
  if (a.sq < 1 || a.skv < 1 || a.batches > 65535 || a.hkv > 65535 || a.hq > 65535) return false;
  for (const void* p : {a.q, a.k, a.v, a.dout})
    if (!detail::aligned(p, 16)) return false;
  // dk / dv are stored as element pairs.
  if (!detail::aligned(a.dk, 4) || !detail::aligned(a.dv, 4)) return false;
  for (int64_t s : {a.dk_sb, a.dk_ss, a.dk_sh, a.dv_sb, a.dv_ss, a.dv_sh})
    if (s % 2 != 0) return false;
  const int64_t b = a.cu_q != nullptr ? 1 : a.batches;
  return tma_stride_ok(b, a.q_sb) && tma_stride_ok(a.sq, a.q_ss) && tma_stride_ok(a.hq, a.q_sh) &&
         tma_stride_ok(b, a.do_sb) && tma_stride_ok(a.sq, a.do_ss) &&
         tma_stride_ok(a.hq, a.do_sh) && tma_stride_ok(b, a.k_sb) && tma_stride_ok(a.skv, a.k_ss) &&
         tma_stride_ok(a.hkv, a.k_sh) && tma_stride_ok(b, a.v_sb) && tma_stride_ok(a.skv, a.v_ss) &&
         tma_stride_ok(a.hkv, a.v_sh);
}

}  // namespace attention_detail

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& dout, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionBackwardParams& params, cudaStream_t stream) {
  detail::OpCheck chk("attention_backward");
  const attention_detail::AttnShape g = attention_detail::check_qkv(chk, q, k, v, &lse, params);
  chk.same_dtype("out", out, "q", q);
  chk.same_dtype("dout", dout, "q", q);
  chk.same_dtype("dq", dq, "q", q);
  chk.same_dtype("dk", dk, "q", q);
  chk.same_dtype("dv", dv, "q", q);
  if (params.d_sinks) {
    if (!params.sinks) chk.fail("d_sinks", "sinks given (d_sinks is their gradient)", "no sinks");
    chk.dtype_in("d_sinks", *params.d_sinks, {DType::f32});
  }
  chk.same_shape("out", out, "q", q);
  chk.same_shape("dout", dout, "q", q);
  chk.same_shape("dq", dq, "q", q);
  chk.same_shape("dk", dk, "k", k);
  chk.same_shape("dv", dv, "k", k);
  if (params.d_sinks) {
    attention_detail::check_dims(chk, "d_sinks", *params.d_sinks, {g.hq});
    chk.contiguous("d_sinks", *params.d_sinks);
  }
  for (const auto& [arg, t] : {std::pair<const char*, const Tensor*>{"out", &out},
                               {"dout", &dout},
                               {"dq", &dq},
                               {"dk", &dk},
                               {"dv", &dv}})
    attention_detail::check_last_contiguous(chk, arg, *t);
  const bool varlen = g.varlen;
  const int64_t batches = g.batches, sq = g.sq, skv = g.skv, d = g.d, hq = g.hq, hkv = g.hkv;
  // Nothing to write: no rows at all (dk/dv of keys that no query sees are still zeroed).
  const bool no_q = batches == 0 || sq == 0 || hq == 0;
  const bool no_k = batches == 0 || skv == 0;
  if (no_q && no_k && !params.d_sinks) return;
  chk.device_pointer("q", q);
  chk.device_pointer("k", k);
  chk.device_pointer("v", v);
  chk.device_pointer("out", out);
  chk.device_pointer("dout", dout);
  chk.device_pointer("lse", lse);
  chk.device_pointer("dq", dq);
  chk.device_pointer("dk", dk);
  chk.device_pointer("dv", dv);
  if (params.sinks) chk.device_pointer("sinks", *params.sinks);
  if (params.d_sinks) chk.device_pointer("d_sinks", *params.d_sinks);
  if (varlen) {
    chk.device_pointer("cu_seqlens_q", *params.cu_seqlens_q);
    chk.device_pointer("cu_seqlens_k", *params.cu_seqlens_k);
  }

  BwdArgs a;
  a.q = q.data, a.k = k.data, a.v = v.data, a.dout = dout.data;
  a.lse = static_cast<const float*>(lse.data);
  a.dq = dq.data, a.dk = dk.data, a.dv = dv.data;
  const int o = varlen ? 1 : 0;  // axis offset: varlen tensors have no batch axis
  if (varlen) {
    a.cu_q = static_cast<const int*>(params.cu_seqlens_q->data);
    a.cu_k = static_cast<const int*>(params.cu_seqlens_k->data);
  } else {
    a.q_sb = q.strides[0], a.k_sb = k.strides[0], a.v_sb = v.strides[0];
    a.do_sb = dout.strides[0], a.dq_sb = dq.strides[0], a.dk_sb = dk.strides[0];
    a.dv_sb = dv.strides[0];
  }
  a.q_ss = q.strides[1 - o], a.q_sh = q.strides[2 - o];
  a.k_ss = k.strides[1 - o], a.k_sh = k.strides[2 - o];
  a.v_ss = v.strides[1 - o], a.v_sh = v.strides[2 - o];
  a.do_ss = dout.strides[1 - o], a.do_sh = dout.strides[2 - o];
  a.dq_ss = dq.strides[1 - o], a.dq_sh = dq.strides[2 - o];
  a.dk_ss = dk.strides[1 - o], a.dk_sh = dk.strides[2 - o];
  a.dv_ss = dv.strides[1 - o], a.dv_sh = dv.strides[2 - o];
  a.lse_sb = varlen ? 0 : hq * sq;
  a.lse_sh = sq;
  a.batches = static_cast<int>(batches), a.hq = static_cast<int>(hq), a.hkv = static_cast<int>(hkv);
  a.d = static_cast<int>(d), a.sq = static_cast<int>(sq), a.skv = static_cast<int>(skv);
  a.scale = params.scale > 0.f ? params.scale : 1.0f / std::sqrt(static_cast<float>(d));
  a.softcap = params.softcap;
  a.window_left = params.window_left;
  a.window_right = params.causal ? 0 : params.window_right;
  if (a.window_left >= sq + skv) a.window_left = -1;
  if (a.window_right >= sq + skv) a.window_right = -1;
  a.vec = vec_ok(q, o) && vec_ok(k, o) && vec_ok(v, o) && vec_ok(dout, o);

  const bool bf16 = q.dtype == DType::bf16;
  const int64_t lse_elems = varlen ? hq * sq : batches * hq * sq;
  const int64_t q_rows = varlen ? sq : batches * sq;  // rows of the dq workspace
  AsyncBuffer delta_buf(static_cast<size_t>(lse_elems) * sizeof(float), stream);
  const bool atomics = !params.deterministic && !no_q;
  // The dk/dv (+ dq) kernel: WGMMA where it applies (atomic dq mode only), else mma.sync. The
  // D = 64 / 128 WGMMA kernel adds dq into the blocked workspace (attention_bwd.cuh).
  const bool wgmma = atomics && !force_mma() && attention_detail::bwd_wgmma_supported(a);
  a.dq_blocked = wgmma && d != 256;
  const int64_t dq_elems =
      a.dq_blocked ? attention_detail::dq_blocked_tiles(a) * attention_detail::kDqTileRows * hq * d
                   : q_rows * hq * d;
  // The blocked workspace's convert overlaps the WGMMA kernel's last key blocks (BwdArgs::kv_done);
  // its counters follow the workspace.
  const bool overlap = a.dq_blocked && convert_overlap_allowed();
  // The first dQ of each workspace tile stored instead of a memset (BwdArgs::dq_tickets).
  const int tmode = tickets_mode();
  const bool tickets = a.dq_blocked && (tmode == 1 || (tmode < 0 && a.window_right >= 0));
  const int64_t done_count = overlap ? batches * hkv : 0;
  const int64_t ticket_count = tickets ? dq_elems / (attention_detail::kDqTileRows * d) : 0;
  const size_t counter_bytes = static_cast<size_t>(done_count + ticket_count) * sizeof(int);
  const size_t ws_bytes = static_cast<size_t>(dq_elems) * sizeof(float) + counter_bytes;
  AsyncBuffer dq_buf(atomics ? ws_bytes : 0, stream);
  auto* delta = static_cast<float*>(delta_buf.p);
  a.delta = delta;
  if (atomics) {
    a.dq_accum = static_cast<float*>(dq_buf.p);
    int* counters = reinterpret_cast<int*>(a.dq_accum + dq_elems);
    if (overlap) a.kv_done = counters;
    if (tickets) a.dq_tickets = counters + done_count;
    if (tickets)  // only the counters: each tile's first dQ is stored
      TESSEL_CUDA_CHECK(cudaMemsetAsync(counters, 0, counter_bytes, stream));
    else
      TESSEL_CUDA_CHECK(cudaMemsetAsync(a.dq_accum, 0, ws_bytes, stream));
  }

  if (!no_q) {
    RowsView ov{out.data, varlen ? 0 : out.strides[0], out.strides[1 - o], out.strides[2 - o]};
    RowsView gv{dout.data, a.do_sb, a.do_ss, a.do_sh};
    const dim3 grid(static_cast<unsigned>((sq + kDeltaWarps - 1) / kDeltaWarps),
                    static_cast<unsigned>(hq), varlen ? 1u : static_cast<unsigned>(batches));
    const int64_t per_block = kDeltaVecThreads * 8 / std::max<int64_t>(d, 1);
    const dim3 vgrid(static_cast<unsigned>((sq * hq + per_block - 1) / per_block), 1,
                     varlen ? 1u : static_cast<unsigned>(batches));
    const bool vec = vec_ok(out, o) && vec_ok(dout, o) && (d == 64 || d == 128 || d == 256);
    auto run_vec = [&](auto tag) {
      using T = decltype(tag);
      if (d == 64)
        attention_bwd_delta_vec<T, 64>
            <<<vgrid, kDeltaVecThreads, 0, stream>>>(ov, gv, delta, a.sq, a.hq, a.lse_sb, a.lse_sh);
      else if (d == 128)
        attention_bwd_delta_vec<T, 128>
            <<<vgrid, kDeltaVecThreads, 0, stream>>>(ov, gv, delta, a.sq, a.hq, a.lse_sb, a.lse_sh);
      else
        attention_bwd_delta_vec<T, 256>
            <<<vgrid, kDeltaVecThreads, 0, stream>>>(ov, gv, delta, a.sq, a.hq, a.lse_sb, a.lse_sh);
    };
    if (vec && bf16)
      run_vec(__nv_bfloat16{});
    else if (vec)
      run_vec(__half{});
    else if (bf16)
      attention_bwd_delta<__nv_bfloat16>
          <<<grid, kDeltaWarps * 32, 0, stream>>>(ov, gv, delta, a.sq, a.d, a.lse_sb, a.lse_sh);
    else
      attention_bwd_delta<__half>
          <<<grid, kDeltaWarps * 32, 0, stream>>>(ov, gv, delta, a.sq, a.d, a.lse_sb, a.lse_sh);
  }
  if (!no_q || !no_k) {
    if (wgmma && !varlen && a.window_right >= 0 && key_block_order_allowed()) {
      // Causal-like masks give key blocks unequal work: longest first (BwdArgs::order_pairs),
      // in sections whose Q and dO (every q head of the group) take <= 16 MB of L2.
      const int64_t pair_bytes = (hq / hkv) * sq * d * 2 * int64_t{2};
      a.order_pairs = static_cast<int>(std::clamp<int64_t>(
          (int64_t{16} << 20) / std::max<int64_t>(pair_bytes, 1), 1, batches * hkv));
      const int forced = g_order_pairs.load();
      if (forced >= 0) a.order_pairs = forced;
    }
    if (wgmma && a.d == 256 && bf16)
      attention_detail::launch_bwd_wgmma_d256_bf16(a, stream);
    else if (wgmma && a.d == 256)
      attention_detail::launch_bwd_wgmma_d256_f16(a, stream);
    else if (wgmma && bf16)
      attention_detail::launch_bwd_wgmma_bf16(a, stream);
    else if (wgmma)
      attention_detail::launch_bwd_wgmma_f16(a, stream);
    else if (bf16)
      attention_detail::launch_bwd_bf16(a, stream);
    else
      attention_detail::launch_bwd_f16(a, stream);
  }
  if (atomics && a.dq_blocked) {
    const bool dq_vec = vec_ok(dq, o);
    const dim3 grid(static_cast<unsigned>(attention_detail::dq_blocked_tiles(a)),
                    static_cast<unsigned>(hq));
    // A programmatic dependent of the WGMMA kernel when it counts its key blocks (kv_done).
    const bool dependent = a.kv_done != nullptr;
    if (bf16)
      TESSEL_CUDA_CHECK(detail::launch_programmatic(
          dependent, attention_bwd_dq_convert_blocked<__nv_bfloat16>, grid, dim3(kConvertThreads),
          0, stream, a, static_cast<__nv_bfloat16*>(a.dq), dq_vec));
    else
      TESSEL_CUDA_CHECK(detail::launch_programmatic(
          dependent, attention_bwd_dq_convert_blocked<__half>, grid, dim3(kConvertThreads), 0,
          stream, a, static_cast<__half*>(a.dq), dq_vec));
  } else if (atomics) {
    const int64_t n = q_rows * hq * d;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
    if (bf16)
      attention_bwd_dq_convert<<<blocks, 256, 0, stream>>>(
          a.dq_accum, static_cast<__nv_bfloat16*>(a.dq), n, a.hq, a.d, a.sq, !varlen, a.dq_sb,
          a.dq_ss, a.dq_sh);
    else
      attention_bwd_dq_convert<<<blocks, 256, 0, stream>>>(a.dq_accum, static_cast<__half*>(a.dq),
                                                           n, a.hq, a.d, a.sq, !varlen, a.dq_sb,
                                                           a.dq_ss, a.dq_sh);
  }
  if (params.d_sinks && hq > 0) {
    attention_bwd_dsinks<<<static_cast<unsigned>(hq), kSinkThreads, 0, stream>>>(
        static_cast<const float*>(params.sinks->data), a.lse, delta,
        static_cast<float*>(params.d_sinks->data), no_q ? 0 : q_rows, a.sq, !varlen, a.lse_sb,
        a.lse_sh);
  }
  detail::check_launch("attention_backward");
}

}  // namespace tessel
