// Host side of the WGMMA MLA decode kernels: the latent cache's TMA descriptor, the split
// heuristic (one CTA per SM), the launch and the combine launch.
//   mla_wgmma_kernel  blocks of 64 query rows (H = 128: compute-bound)
//   mla_swap_kernel   blocks of <= 16 rows (H <= 16: Sᵀ = K·Qᵀ, the cache as WGMMA's M)
#pragma once

#include "ops/attention_decode/mla_swap_kernel.cuh"
#include "ops/attention_decode/mla_wgmma_kernel.cuh"

namespace tessel::decode::mla {

// The cache geometries whose 64-token tiles are whole TMA boxes: contiguous caches, and pages of
// 8..64 tokens dividing 64 or of a multiple of 64 tokens (others take decode_kernel).
inline bool wgmma_supported(bool paged, int64_t page_size) {
  return !paged || (page_size >= 8 && 64 % page_size == 0) || page_size % 64 == 0;
}

// TMA L2 promotion and cache hint of the latent loads (TESSEL_MLA_L2_PROMOTION = 0 / 64 / 128 /
// 256, TESSEL_MLA_EVICT_FIRST = 1: for A/B runs).
inline CUtensorMapL2promotion l2_promotion() {
  static const CUtensorMapL2promotion p = [] {
    const char* e = std::getenv("TESSEL_MLA_L2_PROMOTION");
    const int v = e ? std::atoi(e) : 128;
    return v == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
           : v == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
           : v == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                      : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  }();
  return p;
}
inline uint64_t cache_hint() {
  static const uint64_t h = [] {
    const char* e = std::getenv("TESSEL_MLA_EVICT_FIRST");
    return static_cast<uint64_t>(e && e[0] == '1' ? cute::TMA::CacheHintSm90::EVICT_FIRST
                                                  : cute::TMA::CacheHintSm90::EVICT_NORMAL);
  }();
  return h;
}

// The tokens the splits are sized for (the caller's max_seqlen, else the capacity), and the
// splits of `base` CTAs (sequences x row blocks): requested, or launch_decode's heuristic with
// one CTA per SM.
inline int64_t plan_tokens(const KernelArgs& a) {
  return a.plan_len > 0 ? std::min(a.plan_len, a.capacity) : a.capacity;
}
inline int latent_splits(int64_t base, int64_t plan, int64_t requested_splits) {
  return requested_splits > 0 ? static_cast<int>(requested_splits)
                              : choose_splits(base, plan, kTile, detail::current_sm_count());
}

// Tiles (64 tokens) of the longest split mla_swap_kernel would run for this call (its one row
// block per sequence). With 1-2 tiles per CTA its prologue, pipeline fill and two-warpgroup
// merge cost more than decode_kernel's short cp.async path: one H200
// (bench/dev/mla_batch_probe.cu, session 29) measured B = 1 x 8192 tokens (2 tiles per split)
// 0.91x and B = 16 x 1024 (2 tiles) 0.87x decode_kernel, but 1.05-1.32x from 3-4 tiles on.
inline int64_t swap_tiles_per_split(const KernelArgs& a, int64_t requested_splits) {
  const int64_t plan = plan_tokens(a);
  const int64_t splits = latent_splits(a.batch, plan, requested_splits);
  return ((plan + splits - 1) / splits + kTile - 1) / kTile;
}

// Host: descriptor, splits, launch, and the combine launch when the splits are not merged in
// the kernel. SWAP: blocks of <= 16 rows on mla_swap_kernel (mla_swap_kernel.cuh); otherwise
// blocks of 64 rows on mla_wgmma_kernel.
template <class T, bool PAGED, bool SWAP>
void launch(KernelArgs a, const void* cache, int64_t tok_stride, int64_t unit_stride,
            const CacheGeometry& g, int64_t requested_splits, cudaStream_t stream, const char* op) {
  constexpr int kBlockRows = SWAP ? swap::kRows : kRows;
  constexpr int kBlockThreads = SWAP ? swap::kThreads : kThreads;
  constexpr size_t kBlockSmem =
      SWAP ? swap::kSmemBytes : WgCfg<typename CuteType<T>::type>::kSmemBytes;
  auto kernel = SWAP ? swap::mla_swap_kernel<T, PAGED> : mla_wgmma_kernel<T, PAGED>;
  static const bool configured = [&] {
    TESSEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kBlockSmem)));
    return true;
  }();
  (void)configured;
  WgArgs args{};
  const int64_t rows = PAGED ? g.page_size : g.capacity;
  const int64_t units = PAGED ? g.num_pages : a.batch;
  const int64_t s_tok = rows > 1 ? tok_stride : kRow,
                s_unit = units > 1 ? unit_stride : rows * s_tok;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kRow), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(units)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(s_tok * sizeof(T)),
                                 static_cast<cuuint64_t>(s_unit * sizeof(T))};
  args.hint = cache_hint();
  {
    static const int prefetch = [] {
      const char* e = std::getenv("TESSEL_MLA_PREFETCH");
      return e ? std::atoi(e) : 2;
    }();
    // Whole-tile prefetches need a tile's 64 rows to be one run of bytes.
    const bool rows_contiguous = s_tok == kRow && (!PAGED || g.page_size % kTile == 0);
    args.prefetch = rows_contiguous ? prefetch : 0;
    args.base = static_cast<const char*>(cache);
    args.tok_bytes = s_tok * static_cast<int64_t>(sizeof(T));
    args.unit_bytes = s_unit * static_cast<int64_t>(sizeof(T));
  }
  args.box_rows = PAGED ? static_cast<int>(std::min<int64_t>(g.page_size, kTile)) : kTile;
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(args.box_rows), 1};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult cr = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &args.cache,
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      3, const_cast<void*>(cache), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, l2_promotion(), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (cr != CUDA_SUCCESS)
    throw Error(TESSEL_ERROR_CUDA, std::string("tessel::") + op +
                                       ": cuTensorMapEncodeTiled failed (CUresult " +
                                       std::to_string(static_cast<int>(cr)) + ")");

  a.row_blocks = (a.rows_total + kBlockRows - 1) / kBlockRows;
  const int64_t base = static_cast<int64_t>(a.batch) * a.row_blocks;
  const int64_t plan = plan_tokens(a);
  const int sms = detail::current_sm_count();
  const int splits = latent_splits(base, plan, requested_splits);
  a.num_splits = splits;
  const int64_t rows_global = static_cast<int64_t>(a.batch) * a.sq * a.hq;
  a.part_o = nullptr;
  a.part_lse = nullptr;
  a.tickets = nullptr;
  if (splits > 1) {
    float* p = partials_scratch(
        stream, sizeof(float) * static_cast<size_t>(splits * rows_global * (kLatent + 1)));
    a.part_o = p;
    a.part_lse = p + splits * rows_global * kLatent;
    // In-kernel merge under launch_decode's rule (one wave, splits of >= 8 tiles).
    static const bool merge_allowed = [] {
      const char* e = std::getenv("TESSEL_DECODE_MERGE");
      return !(e && e[0] == '0');
    }();
    if (merge_allowed && static_cast<int64_t>(splits) * base <= sms && plan / splits >= 8 * kTile)
      a.tickets = static_cast<unsigned*>(
          detail::stream_workspace(stream, static_cast<size_t>(base) * sizeof(unsigned)));
  }
  args.a = a;
  const dim3 grid(static_cast<unsigned>(splits * a.row_blocks), 1, static_cast<unsigned>(a.batch));
  TESSEL_CUDA_CHECK(
      detail::launch_dependent(kernel, grid, dim3(kBlockThreads), kBlockSmem, stream, args));
  detail::check_launch(op);
  if (splits > 1 && a.tickets == nullptr) {
    TESSEL_CUDA_CHECK(detail::launch_dependent(combine_kernel<T, kLatent>,
                                               dim3(static_cast<unsigned>((rows_global + 7) / 8)),
                                               dim3(256), 0, stream, a));
    detail::check_launch(op);
  }
}

}  // namespace tessel::decode::mla
