// TMA (bulk tensor copy) loads of GEMM-style operand tiles into 128B-swizzled shared memory.
//
//   Major                         which axis of an operand is contiguous in memory
//   SmemLayout<T, M, R, BK, S>    S stages of an (R x BK) tile, 128B swizzle (CuTe GMMA atoms),
//                                 the layout WGMMA descriptors read directly
//   gmem_operand(p, rows, k, ld)  an operand viewed as (rows, K): K-major or MN-major
//   make_tma_load(g, layout)      host: the TMA descriptor (cute::make_tma_copy, SM90_TMA_LOAD)
//   tma_tiles(tma, s, rows, k)    device: (src(TMA, row_tile, k_tile), dst(TMA, stage)) views
//
// Out-of-bounds boxes are zero-filled by the copy engine: ragged M, N and K need no code.
// TMA needs 16-byte aligned base pointers and row strides (multiples of 8 bf16/fp16 elements).
#pragma once

#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

namespace tessel::tile::sm90 {

// K: consecutive elements run along K (A in (M,K) row-major, B in (N,K) row-major).
// MN: consecutive elements run along M or N (B in (K,N) row-major).
enum class Major { K, MN };

template <Major M>
constexpr cute::GMMA::Major gmma_major = M == Major::K ? cute::GMMA::Major::K : cute::GMMA::Major::MN;

template <class T, Major M>
using SwizzleAtom = std::conditional_t<M == Major::K, cute::GMMA::Layout_K_SW128_Atom<T>,
                                       cute::GMMA::Layout_MN_SW128_Atom<T>>;

template <class T, Major M, int Rows, int BK, int Stages>
using SmemLayout = decltype(cute::tile_to_shape(
    SwizzleAtom<T, M>{}, cute::Shape<cute::Int<Rows>, cute::Int<BK>, cute::Int<Stages>>{}));

// Bytes one stage of a layout holds.
template <class T, class Layout>
constexpr uint32_t stage_bytes =
    static_cast<uint32_t>(cute::size(cute::take<0, 2>(Layout{})) * sizeof(T));

template <Major M, class T>
auto gmem_operand(const T* p, int rows, int k, int64_t ld) {
  using namespace cute;
  if constexpr (M == Major::K)
    return make_tensor(make_gmem_ptr(p), make_shape(rows, k), make_stride(ld, Int<1>{}));
  else
    return make_tensor(make_gmem_ptr(p), make_shape(rows, k), make_stride(Int<1>{}, ld));
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
                                          int rank = 0) {
  using namespace cute;
  Tensor m = tma.get_tma_tensor(make_shape(rows, k));
  Tensor g = local_tile(m, product_each(select<0, 1>(shape(s))), make_coord(_, _));  // (R, BK, rt, kt)
  return tma_partition(tma, rank, Layout<Int<Multicast>>{}, group_modes<0, 2>(s),
                       group_modes<0, 2>(g));
}

}  // namespace tessel::tile::sm90
