// WGMMA (warpgroup MMA, fp32 accumulate) from CuTe's SM90 GMMA atoms, operands in shared memory.
//
//   WgmmaTiled<T, MajorB, BM, BN, BK, C, MajorA = K>
//                                          C consumer warpgroups stacked along M, each issuing
//                                          64 x BN x 16 atoms (SS: both operands via descriptors;
//                                          A K-major, or MN-major for a transposed A)
//   mma_stage(mma, a, b, acc)              one K-stage: arrive, BK/16 wgmma, commit (async);
//                                          the caller waits with cute::warpgroup_wait<N>()
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "tile/sm90/tma.cuh"

namespace tessel::tile::sm90 {

template <class T, Major MB, int BM, int BN, int BK, int Consumers, Major MA = Major::K>
struct WgmmaTiled {
  static_assert(BM == 64 * Consumers, "each consumer warpgroup owns 64 rows");
  using Atom = decltype(cute::SM90::GMMA::ss_op_selector<
                        T, T, float, cute::Shape<cute::_64, cute::Int<BN>, cute::Int<BK>>,
                        gmma_major<MA>, gmma_major<MB>>());
  using TiledMma = decltype(cute::make_tiled_mma(
      Atom{}, cute::Layout<cute::Shape<cute::Int<Consumers>, cute::_1, cute::_1>>{}));
};

// Issues one pipeline stage of MMAs into acc. The first call of a tile must have
// mma.accumulate_ = GMMA::ScaleOut::Zero; afterwards it accumulates.
template <class TiledMma, class FragA, class FragB, class Acc>
__device__ __forceinline__ void mma_stage(TiledMma& mma, const FragA& a, const FragB& b, Acc& acc) {
  using namespace cute;
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
}

}  // namespace tessel::tile::sm90
