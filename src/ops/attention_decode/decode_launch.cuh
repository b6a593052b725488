// Host side shared by decode_attention.cu and mla_decode.cu: argument checks of the common
// pieces (seqlens, block table, lse, strides), the split-KV heuristic, the partials scratch and
// the launch of decode_kernel (+ combine_kernel, or the merge in decode_kernel's last split CTA).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "ops/attention_decode/decode_kernel.cuh"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "runtime/workspace.hpp"
#include "tessel/decode_attention.hpp"

namespace tessel::decode {

// Split partials: a per-(device, stream) buffer that only grows (not zeroed: every element the
// combine reads is written first by the same call).
inline float* partials_scratch(cudaStream_t stream, size_t bytes) {
  struct Slot {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Slot> slots;
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Slot& s = slots[{dev, stream}];
  if (s.bytes < bytes) {
    if (s.ptr) {
      TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
      TESSEL_CUDA_CHECK(cudaFree(s.ptr));
      s = Slot{};
    }
    const size_t want = std::max<size_t>(bytes, size_t{1} << 20);
    TESSEL_CUDA_CHECK(cudaMalloc(&s.ptr, want));
    s.bytes = want;
  }
  return static_cast<float*>(s.ptr);
}

// Non-negative strides, unit last stride, other strides multiples of 8 elements and a 16-byte
// aligned pointer (every kernel access is a 16-byte vector).
inline void check_vector_layout(const detail::OpCheck& chk, const char* arg, const Tensor& t) {
  if (t.numel() == 0) return;
  for (int d = 0; d < t.ndim; ++d)
    if (t.strides[d] < 0)
      chk.fail(arg, "non-negative strides", "a negative stride on axis " + std::to_string(d));
  if (t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1)
    chk.fail(arg, "unit stride on the last axis",
             "last stride " + std::to_string(t.strides[t.ndim - 1]));
  for (int d = 0; d < t.ndim - 1; ++d)
    if (t.shape[d] > 1 && t.strides[d] % 8 != 0)
      chk.fail(arg, "strides that are multiples of 8 elements (16-byte vectors)",
               "stride " + std::to_string(t.strides[d]) + " on axis " + std::to_string(d));
  if (!detail::aligned(t.data, 16))
    chk.fail(arg, "a 16-byte aligned data pointer", "a misaligned pointer");
}

inline std::string dims(const Tensor& t) { return detail::dims_string(t); }

struct CacheGeometry {
  bool paged = false;
  int64_t capacity = 0;  // tokens per sequence
  int64_t page_size = 0, num_pages = 0, max_pages = 0;
};

// The sequence / cache / output part of the kernel arguments, the same for GQA and MLA decode:
// paging, lengths, output and lse, and the (Sq, query heads per KV head) row layout.
inline void fill_sequence_args(KernelArgs& a, const DecodeParams& p, const CacheGeometry& g,
                               bool paged, const Tensor& seqlens, Tensor& out, Tensor* lse,
                               int64_t batch, int64_t sq, int64_t hq, int64_t hkv) {
  if (paged) {
    a.block_table = static_cast<const int32_t*>(p.block_table->data);
    a.bt_stride = p.block_table->strides[0];
    a.page_size = static_cast<int>(g.page_size);
    a.num_pages = static_cast<int>(g.num_pages);
  }
  a.seqlens = static_cast<const int32_t*>(seqlens.data);
  a.capacity = g.capacity;
  a.out = out.data;
  a.o_sb = out.strides[0];
  a.o_ss = out.strides[1];
  a.o_sh = out.strides[2];
  a.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  a.batch = static_cast<int>(batch);
  a.sq = static_cast<int>(sq);
  a.hq = static_cast<int>(hq);
  a.hkv = static_cast<int>(hkv);
  a.group = static_cast<int>(hq / hkv);
  a.rows_total = static_cast<int>(sq * (hq / hkv));
}

// seqlens (B) i32 dense; block table (B, max_pages) i32, last axis contiguous.
inline void check_seqlens_table(const detail::OpCheck& chk, int64_t batch, const Tensor& seqlens,
                                const Tensor* block_table) {
  chk.dtype_in("seqlens", seqlens, {DType::i32});
  chk.rank_in("seqlens", seqlens, 1, 1);
  if (seqlens.shape[0] != batch)
    chk.fail("seqlens", "shape (" + std::to_string(batch) + ",) (one length per sequence)",
             "shape " + dims(seqlens));
  chk.contiguous("seqlens", seqlens);
  if (block_table != nullptr) {
    chk.dtype_in("block_table", *block_table, {DType::i32});
    chk.rank_in("block_table", *block_table, 2, 2);
    if (block_table->shape[0] != batch || block_table->shape[1] < 1)
      chk.fail("block_table", "shape (" + std::to_string(batch) + ", max_pages >= 1)",
               "shape " + dims(*block_table));
    if (block_table->shape[1] > 1 && block_table->strides[1] != 1)
      chk.fail("block_table", "unit stride on the last axis",
               "stride " + std::to_string(block_table->strides[1]));
    if (block_table->strides[0] < 0)
      chk.fail("block_table", "non-negative strides",
               "row stride " + std::to_string(block_table->strides[0]));
  }
}

inline void check_lse(const detail::OpCheck& chk, const Tensor* lse, int64_t b, int64_t sq,
                      int64_t h) {
  if (lse == nullptr) return;
  chk.dtype_in("lse", *lse, {DType::f32});
  if (lse->ndim != 3 || lse->shape[0] != b || lse->shape[1] != sq || lse->shape[2] != h)
    chk.fail(
        "lse",
        "shape (" + std::to_string(b) + ", " + std::to_string(sq) + ", " + std::to_string(h) + ")",
        "shape " + dims(*lse));
  chk.contiguous("lse", *lse);
}

// Synchronous range check (params.check_inputs): throws naming the first bad input.
inline void check_inputs_now(const detail::OpCheck& chk, const Tensor& seqlens, const Tensor* bt,
                             const CacheGeometry& g, int64_t batch, int64_t sq,
                             cudaStream_t stream) {
  auto* flag = static_cast<unsigned long long*>(detail::stream_workspace(stream, 16));
  const int32_t* bp = bt ? static_cast<const int32_t*>(bt->data) : nullptr;
  check_inputs_kernel<><<<static_cast<unsigned>(batch), 128, 0, stream>>>(
      static_cast<const int32_t*>(seqlens.data), bp, bt ? bt->strides[0] : 0,
      static_cast<int>(batch), static_cast<int>(g.max_pages),
      static_cast<int>(std::max<int64_t>(g.page_size, 1)), static_cast<int>(g.num_pages),
      static_cast<int>(sq), g.capacity, flag);
  detail::check_launch(chk.op());
  unsigned long long v[2] = {0, 0};
  TESSEL_CUDA_CHECK(cudaMemcpyAsync(v, flag, sizeof v, cudaMemcpyDeviceToHost, stream));
  TESSEL_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof v, stream));  // leave the workspace zeroed
  TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (v[0] != 0) {
    const int64_t b = batch - static_cast<int64_t>(v[0]);
    int32_t len = 0;
    TESSEL_CUDA_CHECK(
        cudaMemcpy(&len, static_cast<const int32_t*>(seqlens.data) + b, 4, cudaMemcpyDeviceToHost));
    chk.fail("seqlens",
             "lengths in [Sq = " + std::to_string(sq) + ", " + std::to_string(g.capacity) +
                 "] (the new tokens fit in the cache)",
             "length " + std::to_string(len) + " for sequence " + std::to_string(b));
  }
  if (v[1] != 0) {
    const int64_t flat = batch * g.max_pages - static_cast<int64_t>(v[1]);
    const int64_t b = flat / g.max_pages, j = flat % g.max_pages;
    int32_t pg = 0;
    TESSEL_CUDA_CHECK(cudaMemcpy(&pg,
                                 static_cast<const int32_t*>(bt->data) + b * bt->strides[0] + j, 4,
                                 cudaMemcpyDeviceToHost));
    chk.fail("block_table", "page ids in [0, " + std::to_string(g.num_pages) + ") (num_pages)",
             "page " + std::to_string(pg) + " at block_table[" + std::to_string(b) + ", " +
                 std::to_string(j) + "]");
  }
}

// Wave-quantization heuristic: the fewest splits whose CTA count fills >= 90 % of its last wave
// (waves of SMs × resident CTAs), each split keeping >= one tile of the planned length (the
// caller's max_seqlen, else the capacity). Short sequences (decode at batch 1) thus get one
// tile per CTA: their latency is a tile's, not the whole sequence's.
inline int choose_splits(int64_t base_ctas, int64_t plan_len, int64_t tile, int slots) {
  const int64_t max_s = std::clamp<int64_t>((plan_len + tile - 1) / tile, 1, 64);
  int best = 1;
  double best_eff = 0.0;
  for (int64_t s = 1; s <= max_s; ++s) {
    const double waves = static_cast<double>(base_ctas * s) / slots;
    const double eff = waves / std::ceil(waves);
    if (eff >= 0.9) return static_cast<int>(s);
    if (eff > best_eff + 1e-9) {
      best_eff = eff;
      best = static_cast<int>(s);
    }
  }
  return best;
}

// cuTensorMapEncodeTiled from the driver (no libcuda link); null where the driver lacks it.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// One cache (K or V) as a tensor map, strides in elements, 128B swizzle (decode_kernel's kv_idx
// layout). whole_rows = false: 4-d (dims, KV heads, tokens per unit, units), boxes of (64, 1,
// box_tokens, 1), one per 64-dim block. whole_rows = true: 5-d (64 dims, tokens per unit,
// dim / 64 blocks, KV heads, units), boxes of (64, box_tokens, dim / 64, 1, 1) holding whole rows
// and landing as [64-dim block][token] (Cfg::SUB's sub-block); the block stride (128 bytes) sits
// below the token stride, which the driver takes (bench/dev/tmap_stride_probe.cu, H200).
// False where the driver refuses (e.g. a zero stride): the kernel then loads with cp.async.
template <class T>
bool encode_kv_map(CUtensorMap* map, const void* base, int64_t dim, int64_t heads, int64_t rows,
                   int64_t units, int64_t s_head, int64_t s_row, int64_t s_unit, int box_tokens,
                   bool whole_rows = false) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr || (whole_rows && dim % 64 != 0)) return false;
  // A stride of an axis of extent 1 is never used: give it the packed value.
  const int64_t e = sizeof(T);
  if (heads <= 1) s_head = dim;
  if (rows <= 1) s_row = s_head * heads;
  if (units <= 1) s_unit = s_row * rows;
  auto u64 = [](int64_t v) { return static_cast<cuuint64_t>(v); };
  const cuuint32_t bt = static_cast<cuuint32_t>(box_tokens);
  const cuuint64_t dims4[4] = {u64(dim), u64(heads), u64(rows), u64(units)};
  const cuuint64_t strides4[3] = {u64(s_head * e), u64(s_row * e), u64(s_unit * e)};
  const cuuint32_t box4[4] = {64, 1, bt, 1};
  const cuuint64_t dims5[5] = {64, u64(rows), u64(dim / 64), u64(heads), u64(units)};
  const cuuint64_t strides5[4] = {u64(s_row * e), u64(64 * e), u64(s_head * e), u64(s_unit * e)};
  const cuuint32_t box5[5] = {64, bt, static_cast<cuuint32_t>(dim / 64), 1, 1};
  const cuuint32_t estr[5] = {1, 1, 1, 1, 1};
  return fn(map,
            std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            whole_rows ? 5 : 4, const_cast<void*>(base), whole_rows ? dims5 : dims4,
            whole_rows ? strides5 : strides4, whole_rows ? box5 : box4, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The TMA descriptors of decode_kernel's K / V loads (a.tma = 0 where they cannot be made, or
// with TESSEL_DECODE_TMA=0). Boxes of a whole tile (pages: the largest power of two dividing
// the page size and the tile), no L2 promotion: on one H200 (B = 64, 8192 tokens, D = 128)
// 4391 GB/s contiguous against 4163-4243 with 16-token boxes and ~4040 with 256-byte promotion.
template <class C>
void set_kv_maps(KernelArgs& a) {
  static const int mode = [] {  // 0: cp.async; 1: TMA except MLA; 2: TMA everywhere
    const char* e = std::getenv("TESSEL_DECODE_TMA");
    return e ? std::atoi(e) : 1;
  }();
  a.tma = 0;
  a.row_boxes = 0;
  // MLA's 1152-byte latent rows (the mma.sync kernel, H <= 16): cp.async rows measured faster
  // than 16-token boxes with 256-byte promotion (H200: 0.81 vs 0.67 of copy).
  if (mode == 0 || (C::KV_SHARED && mode != 2)) return;
  using T = typename C::T;
  const int64_t rows = C::PAGED ? a.page_size : a.capacity;
  const int64_t units = C::PAGED ? a.num_pages : a.batch;
  if (rows < 1 || units < 1) return;
  int bt = C::TILE;
  if (C::PAGED)
    while (a.page_size % bt != 0) bt /= 2;
  a.box_tokens = bt;
  if constexpr (C::SUB < C::TILE) {  // the dispatcher picks this configuration for bt == SUB only
    bool ok = bt == C::SUB &&
              encode_kv_map<T>(&a.tmap_k, a.k, C::DQK, a.hkv, rows, units, a.k_sh, a.k_st, a.k_sb,
                               bt, true) &&
              encode_kv_map<T>(&a.tmap_v, a.v, C::DV, a.hkv, rows, units, a.v_sh, a.v_st, a.v_sb,
                               bt, true);
    a.tma = ok ? 1 : 0;
    a.row_boxes = a.tma;
    return;
  }
  // Whole tiles in one box per cache (bt == TILE: contiguous, pages of >= TILE tokens), the
  // 64-dim blocks of a row included: half or a quarter of the boxes, the same layout.
  // TESSEL_DECODE_ROWBOX=0 keeps one box per 64-dim block (A/B).
  static const bool row_boxes_enabled = [] {
    const char* e = std::getenv("TESSEL_DECODE_ROWBOX");
    return !(e != nullptr && e[0] == '0');
  }();
  if (!C::KV_SHARED && bt == C::TILE && C::DQK > 64 && row_boxes_enabled &&
      encode_kv_map<T>(&a.tmap_k, a.k, C::DQK, a.hkv, rows, units, a.k_sh, a.k_st, a.k_sb, bt,
                       true) &&
      encode_kv_map<T>(&a.tmap_v, a.v, C::DV, a.hkv, rows, units, a.v_sh, a.v_st, a.v_sb, bt,
                       true)) {
    a.tma = 1;
    a.row_boxes = 1;
    return;
  }
  bool ok =
      encode_kv_map<T>(&a.tmap_k, a.k, C::DQK, a.hkv, rows, units, a.k_sh, a.k_st, a.k_sb, bt);
  if (ok && !C::KV_SHARED)
    ok = encode_kv_map<T>(&a.tmap_v, a.v, C::DV, a.hkv, rows, units, a.v_sh, a.v_st, a.v_sb, bt);
  a.tma = ok ? 1 : 0;
}

template <class C>
void launch_decode(KernelArgs a, int64_t requested_splits, cudaStream_t stream, const char* op) {
  static int ctas_per_sm = [] {
    TESSEL_CUDA_CHECK(cudaFuncSetAttribute(
        decode_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::SMEM)));
    int n = 0;
    TESSEL_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<C>, C::THREADS, C::SMEM));
    return std::max(n, 1);
  }();
  a.row_blocks = (a.rows_total + C::ROWS - 1) / C::ROWS;
  const int64_t base = static_cast<int64_t>(a.batch) * static_cast<int64_t>(a.hkv) * a.row_blocks;
  int splits =
      requested_splits > 0
          ? static_cast<int>(requested_splits)
          : choose_splits(base, a.plan_len > 0 ? std::min(a.plan_len, a.capacity) : a.capacity,
                          C::TILE, detail::current_sm_count() * ctas_per_sm);
  a.num_splits = splits;
  const int64_t rows_global = static_cast<int64_t>(a.batch) * a.sq * a.hq;
  if (splits > 1) {
    float* p = partials_scratch(
        stream, sizeof(float) * static_cast<size_t>(splits * rows_global * (C::DV + 1)));
    a.part_o = p;
    a.part_lse = p + splits * rows_global * C::DV;
    // The last split CTA of each row block merges when the grid is one wave and every split
    // is long (>= 8 tiles of the planned length): the merge tail is then small next to the
    // split's work and the combine launch is saved (MLA H = 16, B = 64, 8192 tokens: 0.834 ->
    // 0.886 of copy). Several waves, or short splits (engine decode: 1-5 tiles per split, where
    // the in-kernel merge measured 3% slower at batch 16 and no faster at batch 1): a separate
    // combine launch.
    // TESSEL_DECODE_MERGE=0: always the combine launch (A/B, debugging).
    static const bool merge_allowed = [] {
      const char* e = std::getenv("TESSEL_DECODE_MERGE");
      return !(e && e[0] == '0');
    }();
    const int64_t plan = a.plan_len > 0 ? std::min(a.plan_len, a.capacity) : a.capacity;
    const bool merge_in_kernel =
        merge_allowed &&
        static_cast<int64_t>(splits) * base <= int64_t{detail::current_sm_count()} * ctas_per_sm &&
        plan / splits >= 8 * C::TILE;
    a.tickets = merge_in_kernel ? static_cast<unsigned*>(detail::stream_workspace(
                                      stream, static_cast<size_t>(base) * sizeof(unsigned)))
                                : nullptr;
  } else {
    a.part_o = nullptr;
    a.part_lse = nullptr;
    a.tickets = nullptr;
  }
  set_kv_maps<C>(a);
  const dim3 grid(static_cast<unsigned>(splits * a.row_blocks), static_cast<unsigned>(a.hkv),
                  static_cast<unsigned>(a.batch));
  TESSEL_CUDA_CHECK(
      detail::launch_dependent(decode_kernel<C>, grid, dim3(C::THREADS), C::SMEM, stream, a));
  detail::check_launch(op);
  if (splits > 1 && a.tickets == nullptr) {
    TESSEL_CUDA_CHECK(detail::launch_dependent(combine_kernel<typename C::T, C::DV>,
                                               dim3(static_cast<unsigned>((rows_global + 7) / 8)),
                                               dim3(256), 0, stream, a));
    detail::check_launch(op);
  }
}

}  // namespace tessel::decode
