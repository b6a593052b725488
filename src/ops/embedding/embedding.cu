// Embedding lookup and its gradient (see include/tessel/embedding.hpp for the contract).
//   forward : thread = one 16-byte column vector, kTokUnroll tokens per step; out-of-range ids
//             give zero rows. Bytes: ids + N·D·s (rows read) + N·D·s (written).
//   backward, deterministic (sort-free counting): count[id]++ → exclusive scan → bucket fill
//             (token indices, unordered) → one block per dweight row: its bucket's tokens are
//             put in ascending order in shared memory (rank sort; buckets > kSortCap scan the
//             ids in order instead), summed in fp32 in that order, the row written once (zero
//             rows included). Bytes: ids + N·D·s (dout) + V·D·s_w (dweight).
//   backward, atomic: the same count → scan → fill, then the same owner pass without the sort
//             (tokens summed in bucket order) for every row of at most kHotThreshold tokens;
//             a hot row (larger bucket) is written as zeros and its bucket, cut into chunks of
//             kHotChunk tokens, appended to a chunk list (atomic counter); hot_rows_kernel
//             then sums each chunk in fp32 and adds it with one vector atomic per column
//             vector, the chunks spread over the grid. Every dweight row is stored once (hot
//             rows: + read-modify-write), where a memset followed by per-token atomics wrote
//             the whole dweight and then read the touched rows back. Under graph capture with
//             too small a stream workspace: memset + per-token atomics (no allocation).
//   backward workspace (both modes): the stream workspace, laid out per call (offsets depend
//             on V, N and the mode) and left all zero, cub's scan scratch included.
//   check_ids: a range-check kernel records the first bad position in the stream workspace;
//             the host copies it back after a stream sync and throws before anything is written.
#include <algorithm>
#include <cub/device/device_scan.cuh>
#include <string>

#include "ops/rows.cuh"
#include "runtime/launch.cuh"
#include "runtime/workspace.hpp"
#include "tessel/embedding.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kBlock = 256;
constexpr int kTokUnroll = 4;
// Forward: 8 tokens per step, 128 bytes of weight rows in flight per thread (4 tokens, 64
// bytes, measured 0.90 of copy bandwidth: each step waits on the ids load, then the rows).
constexpr int kFwdTokUnroll = 8;
constexpr int kSortCap = 1024;
// Atomic mode: a row with more tokens than this is hot (zeros from the owner pass, then
// hot_rows_kernel). 32, not kSortCap or 64: the owner block of a row reads its tokens' dout rows
// one block-wide column chunk at a time with 4 loads in flight per thread (~8 KiB per block,
// latency-bound at a few GB/s), so a row of T tokens costs about T·D·s / (a few GB/s) on one
// block, a tail when the row is among the last scheduled (rows are taken in vocab order, and
// special tokens such as a BOS id, repeated once per sequence, sit at the end of the vocab):
// T = 32 at D = 4096 bf16 (256 KiB) is ~50 µs against a ~0.8 ms pass at (128256, 4096) f32,
// T = 1024 (8 MiB) longer than the whole pass. A hot row costs about two extra dweight row
// transfers instead (its zero store is read back by the atomics, then written again) against
// more than T dout rows read: at most 2·4 / (33·2) ≈ 12 % more bytes on those rows alone (f32
// dweight, 16-bit dout), and there are at most N / 33 of them. Uniform ids (16384 over 128256
// rows) never get there.
constexpr int kHotThreshold = 32;
// Tokens per hot chunk (one work item of hot_rows_kernel: summed in registers, one atomic).
constexpr int kHotChunk = 64;
constexpr int kHotUnroll = 8;  // dout rows in flight per thread in hot_rows_kernel

template <class I>
__device__ __forceinline__ bool in_range(I id, int64_t vocab) {
  return id >= 0 && static_cast<int64_t>(id) < vocab;
}

// ---- range check -------------------------------------------------------------------------
template <class I>
__global__ void check_ids_kernel(const I* ids, int64_t n, int64_t vocab,
                                 unsigned long long* first_bad) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!in_range(ids[i], vocab)) atomicMax(first_bad, static_cast<unsigned long long>(n - i));
}

template <class I>
void check_ids_now(const detail::OpCheck& chk, const I* ids, int64_t n, int64_t vocab,
                   cudaStream_t stream) {
  auto* flag = static_cast<unsigned long long*>(detail::stream_workspace(stream, 16));
  const unsigned grid =
      static_cast<unsigned>(std::clamp<int64_t>(tile::ceil_div(n, kBlock), 1, 4096));
  check_ids_kernel<I><<<grid, kBlock, 0, stream>>>(ids, n, vocab, flag);
  detail::check_launch(chk.op());
  unsigned long long v = 0;
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(&v, flag, sizeof v, cudaMemcpyDeviceToHost, stream));
  TESSEL_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof v, stream));  // leave the workspace zeroed
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (v == 0) return;
  const int64_t pos = n - static_cast<int64_t>(v);
  I bad{};
  TESSEL_CUDA_CHECK(cudaMemcpy(&bad, ids + pos, sizeof bad, cudaMemcpyDeviceToHost));
  chk.fail("ids", "ids in [0, " + std::to_string(vocab) + ")",
           "id " + std::to_string(static_cast<int64_t>(bad)) + " at flat position " +
               std::to_string(pos));
}

// ---- forward ---------------------------------------------------------------------------------
template <class T, int VEC, class I>
__global__ void __launch_bounds__(kBlock)
    embedding_kernel(const I* __restrict__ ids, const T* __restrict__ w, T* __restrict__ out,
                     int64_t n, int64_t vocab, int64_t dim, int64_t w_pitch, int64_t o_pitch) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * VEC;
  if (c >= dim) return;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kFwdTokUnroll; t0 < n;
       t0 += static_cast<int64_t>(gridDim.y) * kFwdTokUnroll) {
    Frag<T, VEC> f[kFwdTokUnroll];
#pragma unroll
    for (int u = 0; u < kFwdTokUnroll; ++u) {
      if (t0 + u >= n) continue;
      const I id = ids[t0 + u];
      if (in_range(id, vocab))
        f[u] = load_frag<VEC>(w + static_cast<int64_t>(id) * w_pitch + c);
      else
#pragma unroll
        for (int j = 0; j < VEC; ++j) f[u].v[j] = from_f32<T>(0.f);
    }
#pragma unroll
    for (int u = 0; u < kFwdTokUnroll; ++u)
      if (t0 + u < n) store_frag_global<VEC>(out + (t0 + u) * o_pitch + c, f[u]);
  }
}

// ---- backward: atomic ------------------------------------------------------------------------
template <class W>
__device__ __forceinline__ void atomic_add_vec(W* p, const float* v, int n);

template <>
__device__ __forceinline__ void atomic_add_vec<float>(float* p, const float* v, int n) {
  if (n == 4) {
    atomicAdd(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
  } else {
    for (int j = 0; j < n; ++j) atomicAdd(p + j, v[j]);
  }
}
template <>
__device__ __forceinline__ void atomic_add_vec<__nv_bfloat16>(__nv_bfloat16* p, const float* v,
                                                              int n) {
  if (n % 2 == 0) {
    for (int j = 0; j < n; j += 2)
      atomicAdd(reinterpret_cast<__nv_bfloat162*>(p + j), __floats2bfloat162_rn(v[j], v[j + 1]));
  } else {
    for (int j = 0; j < n; ++j) atomicAdd(p + j, __float2bfloat16_rn(v[j]));
  }
}
template <>
__device__ __forceinline__ void atomic_add_vec<__half>(__half* p, const float* v, int n) {
  if (n % 2 == 0) {
    for (int j = 0; j < n; j += 2)
      atomicAdd(reinterpret_cast<__half2*>(p + j), __floats2half2_rn(v[j], v[j + 1]));
  } else {
    for (int j = 0; j < n; ++j) atomicAdd(p + j, __float2half_rn(v[j]));
  }
}

// dw[p .. p+VEC) += v: vector atomics of kPer elements, or VEC scalar/vector ones when VEC is
// smaller than a vector atomic.
template <class W, int VEC>
__device__ __forceinline__ void atomic_add_frag(W* p, const float* v) {
  constexpr int kPer = sizeof(W) == 4 ? 4 : 2;  // elements per vector atomic
  if constexpr (VEC >= kPer) {
#pragma unroll
    for (int j = 0; j < VEC; j += kPer) atomic_add_vec<W>(p + j, v + j, kPer);
  } else {
    atomic_add_vec<W>(p, v, VEC);
  }
}

// VEC: dout elements per thread (16 bytes of the wider of dout and dweight, or 1).
// Atomic mode's fallback (graph capture without a large enough workspace): dweight memset
// first, then every token's row added.
template <class T, class W, int VEC, class I>
__global__ void __launch_bounds__(kBlock)
    embedding_bwd_atomic_kernel(const I* __restrict__ ids, const T* __restrict__ g, W* dw,
                                int64_t n, int64_t vocab, int64_t dim, int64_t g_pitch,
                                int64_t w_pitch) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * VEC;
  if (c >= dim) return;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokUnroll; t0 < n;
       t0 += static_cast<int64_t>(gridDim.y) * kTokUnroll) {
    Frag<T, VEC> f[kTokUnroll];
    I id[kTokUnroll];
#pragma unroll
    for (int u = 0; u < kTokUnroll; ++u) {
      id[u] = t0 + u < n ? ids[t0 + u] : I(-1);
      if (in_range(id[u], vocab)) f[u] = load_frag<VEC>(g + (t0 + u) * g_pitch + c);
    }
#pragma unroll
    for (int u = 0; u < kTokUnroll; ++u) {
      if (!in_range(id[u], vocab)) continue;
      float v[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = to_f32(f[u].v[j]);
      atomic_add_frag<W, VEC>(dw + static_cast<int64_t>(id[u]) * w_pitch + c, v);
    }
  }
}

// ---- backward: deterministic -----------------------------------------------------------------
template <class I>
__global__ void count_kernel(const I* ids, int64_t n, int64_t vocab, int* count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (in_range(ids[i], vocab)) atomicAdd(count + ids[i], 1);
}

template <class I>
__global__ void fill_kernel(const I* ids, int64_t n, int64_t vocab, const int* start, int* cursor,
                            int* perm) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (in_range(ids[i], vocab)) {
      const int64_t v = ids[i];
      perm[start[v] + atomicAdd(cursor + v, 1)] = static_cast<int>(i);
    }
}

// One block per dweight row (grid-stride). Each thread owns one vector of VEC columns per
// column chunk.
// acc += one dout row's fragment, in fp32 (the sums of owner_kernel and hot_rows_kernel).
template <class T, int VEC>
__device__ __forceinline__ void add_frag(float (&acc)[VEC], const Frag<T, VEC>& f) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] += to_f32(f.v[j]);
}

// ATOMIC = false (deterministic mode): the bucket is summed in ascending token order (rank
// sort in shared memory, or an in-order scan of the ids past kSortCap).
// ATOMIC = true (atomic mode): a bucket of at most kHotThreshold tokens is summed in bucket
// order, straight from perm; a larger one stores zeros and appends its chunks of kHotChunk
// tokens, {row, first perm position}, to hot_chunks (count in *hot_count) for hot_rows_kernel.
template <class T, class W, int VEC, class I, bool ATOMIC>
__global__ void __launch_bounds__(kBlock)
    owner_kernel(const I* __restrict__ ids, const T* __restrict__ g, W* __restrict__ dw,
                 const int* __restrict__ start, const int* __restrict__ perm, int64_t n,
                 int64_t vocab, int64_t dim, int64_t g_pitch, int64_t w_pitch,
                 int2* __restrict__ hot_chunks, int* __restrict__ hot_count) {
  __shared__ int unsorted[ATOMIC ? 1 : kSortCap];
  __shared__ int sorted[ATOMIC ? 1 : kSortCap];
  __shared__ int warp_count[kBlock / 32];
  __shared__ int hot_base;
  // A block's rows are a chain of dependent loads (start -> perm -> dout -> store): the next
  // row's bucket bounds are loaded when a row begins and, in deterministic mode, its first
  // kBlock token indices once its bounds are in (one per thread, `pn`), so a row starts at
  // its dout loads.
  int nb = 0, ne = 0, pn = 0;
  int64_t pn_row = -1;  // the row whose token index `pn` holds (this thread's, i = threadIdx.x)
  if (blockIdx.x < vocab) {
    nb = start[blockIdx.x];
    ne = start[blockIdx.x + 1];
  }
  for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
    const int b = nb, cnt = ne - nb;
    const int64_t next = v + gridDim.x;
    if (next < vocab) {
      nb = start[next];
      ne = start[next + 1];
    }
    const bool small = ATOMIC || cnt <= kSortCap;
    int ntok = cnt;  // tokens this block sums (a hot row's: none, it is stored as zeros)
    if constexpr (ATOMIC) {
      if (cnt > kHotThreshold) {  // block-uniform
        const int chunks = (cnt + kHotChunk - 1) / kHotChunk;
        if (threadIdx.x == 0) hot_base = atomicAdd(hot_count, chunks);
        __syncthreads();
        const int base = hot_base;
        for (int i = threadIdx.x; i < chunks; i += kBlock)
          hot_chunks[base + i] = make_int2(static_cast<int>(v), b + i * kHotChunk);
        __syncthreads();  // hot_base has been read by all before the next hot row rewrites it
        ntok = 0;
      }
    } else if (small) {
      for (int i = threadIdx.x; i < cnt; i += kBlock)
        unsorted[i] = i == threadIdx.x && pn_row == v ? pn : perm[b + i];
      __syncthreads();
      for (int i = threadIdx.x; i < cnt; i += kBlock) {  // rank sort (token indices distinct)
        const int key = unsorted[i];
        int rank = 0;
        for (int j = 0; j < cnt; ++j) rank += unsorted[j] < key;
        sorted[rank] = key;
      }
      __syncthreads();
    }
    if constexpr (!ATOMIC) {
      if (next < vocab && threadIdx.x < ne - nb && ne - nb <= kSortCap) {
        pn = perm[nb + threadIdx.x];
        pn_row = next;
      }
    }
    auto token = [&](int i) -> int64_t {  // i-th token of the row, in summation order
      if constexpr (ATOMIC)
        return perm[b + i];
      else
        return sorted[i];
    };
    for (int64_t c0 = 0; c0 < dim; c0 += int64_t{kBlock} * VEC) {
      const int64_t c = c0 + static_cast<int64_t>(threadIdx.x) * VEC;
      const bool col_ok = c < dim;
      float acc[VEC] = {};
      if (small) {
        int i = 0;
        for (; i + 4 <= ntok; i += 4) {
          Frag<T, VEC> f[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (col_ok) f[u] = load_frag<VEC>(g + token(i + u) * g_pitch + c);
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (col_ok) add_frag(acc, f[u]);
        }
        for (; i < ntok; ++i)
          if (col_ok) add_frag(acc, load_frag<VEC>(g + token(i) * g_pitch + c));
      } else {
        // Large bucket: scan the ids in token order, compacting matches through shared memory.
        for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
          const int64_t t = t0 + threadIdx.x;
          const bool hit = t < n && static_cast<int64_t>(ids[t]) == v;
          const unsigned ballot = __ballot_sync(0xffffffffu, hit);
          const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
          if (lane == 0) warp_count[warp] = __popc(ballot);
          __syncthreads();
          int before = 0, total = 0;
          for (int w = 0; w < kBlock / 32; ++w) {
            before += w < warp ? warp_count[w] : 0;
            total += warp_count[w];
          }
          if (hit) unsorted[before + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int>(t);
          __syncthreads();
          for (int i = 0; i < total; ++i)
            if (col_ok)
              add_frag(acc, load_frag<VEC>(g + static_cast<int64_t>(unsorted[i]) * g_pitch + c));
          __syncthreads();
        }
      }
      if (col_ok) {
        // 16 bytes per store (an f32 dweight with 16-bit dout takes two).
        constexpr int kW = VEC * sizeof(W) > 16 ? 16 / static_cast<int>(sizeof(W)) : VEC;
#pragma unroll
        for (int j0 = 0; j0 < VEC; j0 += kW) {
          Frag<W, kW> o;
#pragma unroll
          for (int j = 0; j < kW; ++j) o.v[j] = from_f32<W>(acc[j0 + j]);
          store_frag_global<kW>(dw + v * w_pitch + c + j0, o);
        }
      }
    }
    if constexpr (!ATOMIC) __syncthreads();  // shared lists are rebuilt for the next row
  }
}

// Atomic mode, after owner_kernel<..., true>: one work item = (column block, hot chunk); its
// up to kHotChunk dout rows (all of one dweight row) are summed in fp32 and added with one
// vector atomic per thread. With no hot row (*n_chunks == 0) every block exits at once.
template <class T, class W, int VEC>
__global__ void __launch_bounds__(kBlock)
    hot_rows_kernel(const T* __restrict__ g, W* dw, const int* __restrict__ start,
                    const int* __restrict__ perm, const int2* __restrict__ chunks,
                    const int* __restrict__ n_chunks, int64_t dim, int64_t g_pitch,
                    int64_t w_pitch) {
  const int total = *n_chunks;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * VEC;
  if (c >= dim) return;
  for (int k = blockIdx.y; k < total; k += gridDim.y) {
    const int2 e = chunks[k];  // {dweight row, first perm position}
    const int end = min(e.y + kHotChunk, start[e.x + 1]);
    float acc[VEC] = {};
    auto row = [&](int p) { return g + static_cast<int64_t>(perm[p]) * g_pitch + c; };
    int p = e.y;
    for (; p + kHotUnroll <= end; p += kHotUnroll) {
      Frag<T, VEC> f[kHotUnroll];
#pragma unroll
      for (int u = 0; u < kHotUnroll; ++u) f[u] = load_frag<VEC>(row(p + u));
#pragma unroll
      for (int u = 0; u < kHotUnroll; ++u) add_frag(acc, f[u]);
    }
    for (; p < end; ++p) add_frag(acc, load_frag<VEC>(row(p)));
    atomic_add_frag<W, VEC>(dw + static_cast<int64_t>(e.x) * w_pitch + c, acc);
  }
}

template <class F>
void dispatch_ids(DType d, F&& f) {
  if (d == DType::i32)
    f(int32_t{});
  else
    f(int64_t{});
}

constexpr std::initializer_list<DType> kFloat = {DType::f32, DType::f16, DType::bf16};

// (ids.shape..., D)
void check_rows_shape(const detail::OpCheck& chk, const char* arg, const Tensor& t,
                      const Tensor& ids, int64_t dim) {
  bool ok = t.ndim == ids.ndim + 1;
  for (int d = 0; ok && d < ids.ndim; ++d) ok = t.shape[d] == ids.shape[d];
  if (ok) ok = t.shape[t.ndim - 1] == dim;
  if (!ok) {
    std::string want = "(";
    for (int d = 0; d < ids.ndim; ++d) want += std::to_string(ids.shape[d]) + ", ";
    want += std::to_string(dim) + ")";
    chk.fail(arg, "shape " + want + " (ids' shape + (D,))", "shape " + detail::dims_string(t));
  }
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& weight, Tensor& out, bool check_ids,
               cudaStream_t stream) {
  detail::OpCheck chk("embedding");
  chk.dtype_in("ids", ids, {DType::i32, DType::i64});
  chk.dtype_in("weight", weight, kFloat);
  chk.dtype_in("out", out, kFloat);
  chk.same_dtype("out", out, "weight", weight);
  chk.rank_in("weight", weight, 2, 2);
  chk.rank_in("ids", ids, 0, kMaxDims - 1);
  const int64_t vocab = weight.shape[0], dim = weight.shape[1];
  check_rows_shape(chk, "out", out, ids, dim);
  chk.contiguous("ids", ids);
  const detail::Rows wr = chk.rows("weight", weight), orr = chk.rows("out", out);
  const int64_t n = ids.numel();
  if (n == 0 || dim == 0) return;
  chk.device_pointer("ids", ids);
  chk.device_pointer("out", out);
  if (vocab > 0) chk.device_pointer("weight", weight);
  dispatch_ids(ids.dtype, [&](auto itag) {
    using I = decltype(itag);
    const I* ip = static_cast<const I*>(ids.data);
    if (check_ids) check_ids_now(chk, ip, n, vocab, stream);
    detail::dispatch_float_dtype(weight.dtype, [&](auto tag) {
      using T = decltype(tag);
      constexpr int V = kVec16<T>;
      const T* wp = static_cast<const T*>(weight.data);
      T* op_ = static_cast<T*>(out.data);
      const bool vec_ok = detail::rows_vectorizable<T>(dim, {{wp, wr.pitch}, {op_, orr.pitch}});
      const int vec = vec_ok ? V : 1;
      const dim3 grid(
          static_cast<unsigned>(tile::ceil_div(tile::ceil_div(dim, vec), kBlock)),
          static_cast<unsigned>(std::min<int64_t>(tile::ceil_div(n, kFwdTokUnroll), 65535)));
      if (vec_ok)
        TESSEL_CUDA_CHECK(detail::launch_dependent(embedding_kernel<T, V, I>, grid, dim3(kBlock), 0,
                                                   stream, ip, wp, op_, n, vocab, dim, wr.pitch,
                                                   orr.pitch));
      else
        TESSEL_CUDA_CHECK(detail::launch_dependent(embedding_kernel<T, 1, I>, grid, dim3(kBlock), 0,
                                                   stream, ip, wp, op_, n, vocab, dim, wr.pitch,
                                                   orr.pitch));
    });
  });
  detail::check_launch("embedding");
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        EmbeddingGradMode mode, bool check_ids, cudaStream_t stream) {
  detail::OpCheck chk("embedding_backward");
  if (mode != EmbeddingGradMode::deterministic && mode != EmbeddingGradMode::atomic)
    chk.fail("mode", "tessel::EmbeddingGradMode deterministic (0) or atomic (1)",
             "code " + std::to_string(static_cast<int>(mode)));
  chk.dtype_in("ids", ids, {DType::i32, DType::i64});
  chk.dtype_in("dout", dout, kFloat);
  chk.dtype_in("dweight", dweight, kFloat);
  if (dweight.dtype != DType::f32 && dweight.dtype != dout.dtype)
    chk.fail("dweight", std::string("dtype f32 or dout's dtype ") + dtype_name(dout.dtype),
             dtype_name(dweight.dtype));
  chk.rank_in("dweight", dweight, 2, 2);
  chk.rank_in("ids", ids, 0, kMaxDims - 1);
  const int64_t vocab = dweight.shape[0], dim = dweight.shape[1];
  check_rows_shape(chk, "dout", dout, ids, dim);
  chk.contiguous("ids", ids);
  const detail::Rows gr = chk.rows("dout", dout), wr = chk.rows("dweight", dweight);
  const int64_t n = ids.numel();
  if (n > int64_t{0x7fffffff}) chk.fail("ids", "fewer than 2^31 tokens", std::to_string(n));
  if (vocab > int64_t{0x3fffffff})
    chk.fail("dweight", "fewer than 2^30 rows", std::to_string(vocab));
  if (vocab == 0 || dim == 0) return;
  chk.device_pointer("dweight", dweight);
  if (n > 0) {
    chk.device_pointer("ids", ids);
    chk.device_pointer("dout", dout);
  }
  dispatch_ids(ids.dtype, [&](auto itag) {
    using I = decltype(itag);
    const I* ip = static_cast<const I*>(ids.data);
    if (check_ids && n > 0) check_ids_now(chk, ip, n, vocab, stream);
    detail::dispatch_float_dtype(dout.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* gp = static_cast<const T*>(dout.data);
      auto with_w = [&](auto wtag) {
        using W = decltype(wtag);
        // Columns per thread: 16 bytes of the wider of dout and dweight. A thread storing two
        // 16-byte vectors (16-bit dout, f32 dweight) left every warp store half a 32-byte
        // sector per lane: 0.61 of copy bandwidth at (128256, 4096) f32, deterministic.
        constexpr int V = 16 / static_cast<int>(sizeof(W) > sizeof(T) ? sizeof(W) : sizeof(T));
        W* wp = static_cast<W*>(dweight.data);
        const size_t wes = sizeof(W);
        const bool vec_ok = dim % V == 0 && detail::aligned(gp, V * sizeof(T)) &&
                            gr.pitch % V == 0 && detail::aligned(wp, V * wes) && wr.pitch % V == 0;
        const int vec = vec_ok ? V : 1;
        if (n == 0) {
          TESSEL_CUDA_CHECK(cudaMemset2DAsync(wp, wr.pitch * wes, 0, dim * wes, vocab, stream));
          return;
        }
        const bool atomic = mode == EmbeddingGradMode::atomic;
        const int64_t col_blocks = tile::ceil_div(tile::ceil_div(dim, vec), kBlock);
        // Workspace: count[V+1] | start[V+1] | cursor[V] | perm[n] | (atomic mode: hot chunks
        // | their count) | scan scratch, all zeroed again at the end (count, cursor and the
        // chunk counter must start at zero; offsets vary with V, N and the mode, so any byte
        // may be one of them in the next call).
        // Hot chunks: a hot row of c > kHotThreshold tokens has ceil(c / kHotChunk) <=
        // c / kHotChunk + 1 of them, and there are at most n / (kHotThreshold + 1) hot rows.
        const int64_t max_chunks = n / kHotChunk + n / (kHotThreshold + 1) + 1;
        size_t scan_bytes = 0;
        TESSEL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(
            nullptr, scan_bytes, static_cast<int*>(nullptr), static_cast<int*>(nullptr),
            static_cast<int>(vocab + 1), stream));
        auto up = [](size_t b) { return (b + 255) / 256 * 256; };
        const size_t cnt_b = up(sizeof(int) * (vocab + 1)), cur_b = up(sizeof(int) * vocab),
                     perm_b = up(sizeof(int) * n),
                     chunk_b = atomic ? up(sizeof(int2) * max_chunks) : 0,
                     hot_b = atomic ? chunk_b + 256 : 0;
        const size_t used = 2 * cnt_b + cur_b + perm_b + hot_b;  // everything but scan scratch
        const size_t total = used + up(scan_bytes);
        // Atomic mode stays capturable in a CUDA graph: under capture the workspace is not
        // grown, and where it is too small dweight is zeroed and every token added atomically.
        char* ws = static_cast<char*>(
            detail::stream_workspace(stream, total, !atomic || !detail::stream_capturing(stream)));
        if (ws == nullptr) {
          TESSEL_CUDA_CHECK(cudaMemset2DAsync(wp, wr.pitch * wes, 0, dim * wes, vocab, stream));
          const dim3 grid(
              static_cast<unsigned>(col_blocks),
              static_cast<unsigned>(std::min<int64_t>(tile::ceil_div(n, kTokUnroll), 65535)));
          if (vec_ok)
            embedding_bwd_atomic_kernel<T, W, V, I>
                <<<grid, kBlock, 0, stream>>>(ip, gp, wp, n, vocab, dim, gr.pitch, wr.pitch);
          else
            embedding_bwd_atomic_kernel<T, W, 1, I>
                <<<grid, kBlock, 0, stream>>>(ip, gp, wp, n, vocab, dim, gr.pitch, wr.pitch);
          return;
        }
        int* count = reinterpret_cast<int*>(ws);
        int* start = reinterpret_cast<int*>(ws + cnt_b);
        int* cursor = reinterpret_cast<int*>(ws + 2 * cnt_b);
        int* perm = reinterpret_cast<int*>(ws + 2 * cnt_b + cur_b);
        int2* hot_chunks =
            atomic ? reinterpret_cast<int2*>(ws + 2 * cnt_b + cur_b + perm_b) : nullptr;
        int* hot_count =
            atomic ? reinterpret_cast<int*>(ws + 2 * cnt_b + cur_b + perm_b + chunk_b) : nullptr;
        void* scan_tmp = ws + used;
        const unsigned g1 =
            static_cast<unsigned>(std::clamp<int64_t>(tile::ceil_div(n, kBlock), 1, 8192));
        count_kernel<I><<<g1, kBlock, 0, stream>>>(ip, n, vocab, count);
        TESSEL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scan_tmp, scan_bytes, count, start,
                                                        static_cast<int>(vocab + 1), stream));
        fill_kernel<I><<<g1, kBlock, 0, stream>>>(ip, n, vocab, start, cursor, perm);
        const unsigned g2 = static_cast<unsigned>(std::min<int64_t>(vocab, int64_t{1} << 20));
        auto owner = [&](auto kernel) {
          kernel<<<g2, kBlock, 0, stream>>>(ip, gp, wp, start, perm, n, vocab, dim, gr.pitch,
                                            wr.pitch, hot_chunks, hot_count);
        };
        if (!atomic) {
          if (vec_ok)
            owner(owner_kernel<T, W, V, I, false>);
          else
            owner(owner_kernel<T, W, 1, I, false>);
        } else {
          if (vec_ok)
            owner(owner_kernel<T, W, V, I, true>);
          else
            owner(owner_kernel<T, W, 1, I, true>);
          // One full wave: ptxas keeps hot_rows_kernel at 32 registers (8 blocks of 256 per
          // SM; its SASS has 3-5 of a chunk's dout loads in flight per thread with bf16 dout
          // and an f32 dweight), so occupancy supplies the loads in flight for hot rows; with
          // none, one wave of blocks exits at once.
          const dim3 grid(
              static_cast<unsigned>(col_blocks),
              static_cast<unsigned>(std::clamp<int64_t>(
                  tile::ceil_div(int64_t{2048 / kBlock} * detail::current_sm_count(), col_blocks),
                  1, std::min<int64_t>(max_chunks, 65535))));
          if (vec_ok)
            hot_rows_kernel<T, W, V><<<grid, kBlock, 0, stream>>>(
                gp, wp, start, perm, hot_chunks, hot_count, dim, gr.pitch, wr.pitch);
          else
            hot_rows_kernel<T, W, 1><<<grid, kBlock, 0, stream>>>(
                gp, wp, start, perm, hot_chunks, hot_count, dim, gr.pitch, wr.pitch);
        }
        detail::check_launch("embedding_backward");
        // Leave the workspace zeroed (its contract), cub's scan scratch included: the layout
        // depends on V, N and the mode, so the next call (or another op) on this stream may
        // place a region that must start at zero (count, cursor, the hot-chunk counter) where
        // this call's scan scratch was. cub's tile states are not zero after a scan (32 padding
        // words, then one status word per tile; a lone tile's stays SCAN_TILE_INVALID = 99):
        // zeroing only `used` let an atomic call after a deterministic one with the same V and
        // N < 704 (a 256-byte chunk list) start its chunk counter at 99, and a call with a
        // larger V count 99 phantom tokens (perm slots never filled: token 0) for one row.
        TESSEL_CUDA_CHECK(cudaMemsetAsync(ws, 0, total, stream));
      };
      if (dweight.dtype == DType::f32)
        with_w(float{});
      else
        with_w(T{});
    });
  });
  detail::check_launch("embedding_backward");
}

}  // namespace tessel
