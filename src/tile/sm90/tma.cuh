// TMA (bulk tensor copy) loads of GEMM-style operand tiles into 128B-swizzled shared memory.
//
//   Major                         which axis of an operand is contiguous in memory
//   SmemLayout<T, M, R, BK, S>    S stages of an (R x BK) tile, 128B swizzle (CuTe GMMA atoms),
//                                 the layout WGMMA descriptors read directly
//   gmem_operand(p, rows, k, ld, l, bs)  an operand viewed as (rows, K, L): K-major or MN-major,
//                                 L batches bs elements apart
//   make_tma_load(g, layout)      host: the TMA descriptor (cute::make_tma_copy, SM90_TMA_LOAD)
//   tma_tiles(tma, s, rows, k, l) device: (src(TMA, row_tile, k_tile, batch), dst(TMA, stage))
//   make_tma_store_desc(...)      host: a raw CUtensorMap for (64 x 128-byte) 128B-swizzled
//                                 output boxes of a (rows, cols, L) row-major tensor
//   tma_store_box(desc, s, c, r, l) device: one bulk tensor store from shared memory
//
// Out-of-bounds boxes are zero-filled by the copy engine: ragged M, N and K need no code.
// TMA needs 16-byte aligned base pointers and row strides (multiples of 8 bf16/fp16 elements).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/cuda_host_adapter.hpp>
#include <type_traits>

namespace tessel::tile::sm90 {

// K: consecutive elements run along K (A in (M,K) row-major, B in (N,K) row-major).
// MN: consecutive elements run along M or N (B in (K,N) row-major).
enum class Major { K, MN };

template <Major M>
constexpr cute::GMMA::Major gmma_major =
    M == Major::K ? cute::GMMA::Major::K : cute::GMMA::Major::MN;

template <class T, Major M>
using SwizzleAtom = std::conditional_t<M == Major::K, cute::GMMA::Layout_K_SW128_Atom<T>,
                                       cute::GMMA::Layout_MN_SW128_Atom<T>>;

// MN-major atoms (64 rows x 8 k for 16-bit types) are stacked along K first, so that one
// 64-row column of the tile (64 x BK, contiguous in shared memory) is one TMA box; stacked
// along the rows first, every atom was a box of its own (64 x 8: 32 TMA copies per 256 x 64
// stage instead of 4).
template <Major M>
using AtomOrder = std::conditional_t<M == Major::K, cute::Step<cute::_1, cute::_2, cute::_3>,
                                     cute::Step<cute::_2, cute::_1, cute::_3>>;

template <class T, Major M, int Rows, int BK, int Stages>
using SmemLayout = decltype(cute::tile_to_shape(
    SwizzleAtom<T, M>{}, cute::Shape<cute::Int<Rows>, cute::Int<BK>, cute::Int<Stages>>{},
    AtomOrder<M>{}));

// Bytes one stage of a layout holds.
template <class T, class Layout>
constexpr uint32_t stage_bytes = static_cast<uint32_t>(cute::size(cute::take<0, 2>(Layout{})) *
                                                       sizeof(T));

// L batches `batch_stride` elements apart (a multiple of 8; pass any such value when L == 1).
template <Major M, class T>
auto gmem_operand(const T* p, int rows, int k, int64_t ld, int batches, int64_t batch_stride) {
  using namespace cute;
  if constexpr (M == Major::K)
    return make_tensor(make_gmem_ptr(p), make_shape(rows, k, batches),
                       make_stride(ld, Int<1>{}, batch_stride));
  else
    return make_tensor(make_gmem_ptr(p), make_shape(rows, k, batches),
                       make_stride(Int<1>{}, ld, batch_stride));
}

// Host: a TMA load descriptor moving one stage (R x BK) of `Layout` per copy. Multicast > 1:
// each of `Multicast` CTAs of a cluster loads 1/Multicast of the box and multicasts it to all
// (cute::SM90_TMA_LOAD_MULTICAST); copies then take the CTA mask: tma.with(bar, mask).
template <int Multicast = 1, class Layout, class GTensor>
auto make_tma_load(const GTensor& g, Layout) {
  if constexpr (Multicast == 1)
    return cute::make_tma_copy(cute::SM90_TMA_LOAD{}, g, cute::take<0, 2>(Layout{}));
  else
    return cute::make_tma_copy(cute::SM90_TMA_LOAD_MULTICAST{}, g, cute::take<0, 2>(Layout{}),
                               cute::Int<Multicast>{});
}

// Device: views for the producer loop. src(_, row_tile, k_tile) -> dst(_, stage); with
// Multicast > 1, this CTA's slice (rank in the multicast group).
template <int Multicast = 1, class Tma, class STensor>
__device__ __forceinline__ auto tma_tiles(const Tma& tma, const STensor& s, int rows, int k,
                                          int batches, int rank = 0) {
  using namespace cute;
  cute::Tensor m = tma.get_tma_tensor(make_shape(rows, k, batches));
  cute::Tensor g = local_tile(m, product_each(select<0, 1>(shape(s))),
                              make_coord(_, _, _));  // (R, BK, rt, kt, L)
  return tma_partition(tma, rank, Layout<Int<Multicast>>{}, group_modes<0, 2>(s),
                       group_modes<0, 2>(g));
}

// ---- TMA stores -----------------------------------------------------------------------------
// Output staging boxes: 64 rows x 128 bytes (64 bf16/f16 or 32 f32 columns), 128B swizzle:
// the 16-byte chunk q of row r lives at chunk q ^ (r % 8) of that row (buffer 1024-aligned).
constexpr int kStoreBoxRows = 64;
constexpr int kStoreBoxBytes = kStoreBoxRows * 128;

// Host: descriptor for a (L, rows, cols) tensor, rows `ld` elements apart, batches
// `batch_stride` apart (multiples of 16 bytes). elem_bytes 2 (f16/bf16) or 4 (f32).
inline CUresult make_tma_store_desc(CUtensorMap* map, void* p, CUtensorMapDataType type,
                                    int elem_bytes, int64_t rows, int64_t cols, int64_t ld,
                                    int64_t batches, int64_t batch_stride) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * elem_bytes),
                                 static_cast<cuuint64_t>(batch_stride * elem_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / elem_bytes), kStoreBoxRows, 1};
  const cuuint32_t estr[3] = {1, 1, 1};
  return CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, type, 3, p, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Device: store the box at smem `src` to (col, row, batch); the copy engine clips what lies
// outside the tensor. The caller fences (tma_store_fence) and syncs the writers first, and
// commits (cute::tma_store_arrive) / waits (cute::tma_store_wait<N>) from the same thread.
__device__ __forceinline__ void tma_store_box(const CUtensorMap* desc, const void* src, int col,
                                              int row, int batch) {
  cute::SM90_TMA_STORE_3D::copy(desc, src, col, row, batch);
}

}  // namespace tessel::tile::sm90
