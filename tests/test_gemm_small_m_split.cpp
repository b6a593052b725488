// The small-M ring kernel's work split (tessel::detail::SmallMRingSplit, gemm_small_m_ring.hpp):
// every stage in exactly one CTA's run, runs of equal length within one, cta_of the inverse of
// start, and a CTA's partial slabs (pieces it shares with other CTAs) on distinct slots — the
// kernel's deterministic cross-CTA reduction relies on all four. CPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "ops/gemm/gemm_small_m_ring.hpp"

namespace tessel {
namespace {

using detail::SmallMRingSplit;

void check_split(int64_t slabs, int ksn, int grid) {
  SCOPED_TRACE("slabs=" + std::to_string(slabs) + " ksn=" + std::to_string(ksn) +
               " grid=" + std::to_string(grid));
  const SmallMRingSplit sp{slabs * ksn, ksn, grid};
  ASSERT_EQ(sp.start(0), 0);
  ASSERT_EQ(sp.start(grid), sp.total);
  const int64_t lo = sp.total / grid;
  for (int c = 0; c < grid; ++c) {
    const int64_t len = sp.start(c + 1) - sp.start(c);
    EXPECT_TRUE(len == lo || len == lo + 1) << "CTA " << c << " run of " << len;
  }
  // cta_of inverts start; consecutive stages never go back to an earlier CTA.
  int prev = 0;
  for (int64_t L = 0; L < sp.total; ++L) {
    const int c = sp.cta_of(L);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, grid);
    ASSERT_LE(sp.start(c), L);
    ASSERT_LT(L, sp.start(c + 1));
    ASSERT_GE(c, prev);
    prev = c;
  }
  // Pieces: (CTA, slab) pairs where the CTA holds part of a slab. The kernel's finisher sums
  // CTAs cta_of(first stage) … cta_of(last stage) at slot(c, slab): each must be a piece of
  // that CTA, and no CTA may keep two pieces in one slot.
  std::map<std::pair<int, int>, int64_t> slot_owner;  // (CTA, slot) -> slab
  for (int64_t slab = 0; slab < slabs; ++slab) {
    const int first = sp.cta_of(slab * ksn), last = sp.cta_of(slab * ksn + ksn - 1);
    if (first == last) continue;  // whole in one CTA: written directly
    for (int c = first; c <= last; ++c) {
      const int64_t a = std::max(sp.start(c), slab * ksn);
      const int64_t b = std::min(sp.start(c + 1), (slab + 1) * ksn);
      if (a >= b) continue;  // an empty run (only when total < grid, which the host avoids)
      const int s = sp.slot(c, slab);
      ASSERT_TRUE(s == 0 || s == 1);
      const auto [it, fresh] = slot_owner.emplace(std::make_pair(c, s), slab);
      EXPECT_TRUE(fresh) << "CTA " << c << " slot " << s << " holds slabs " << it->second << " and "
                         << slab;
    }
  }
}

TEST(GemmSmallMSplit, EveryStageOnceSlotsDistinct) {
  const int grids[] = {1, 2, 7, 114, 132};
  const int ksns[] = {1, 2, 3, 4, 14, 56, 129};
  const int64_t slab_counts[] = {1, 2, 9, 64, 131, 133, 1792};
  for (int grid : grids)
    for (int ksn : ksns)
      for (int64_t slabs : slab_counts)
        if (slabs * ksn >= grid) check_split(slabs, ksn, grid);  // the host's grid <= total
}

// A CTA whose run lies inside one slab keeps that piece in slot 0; a slab cut in three is
// summed from three CTAs.
TEST(GemmSmallMSplit, SmallCases) {
  const SmallMRingSplit sp{1 * 6, 6, 3};  // one slab of 6 stages over 3 CTAs
  EXPECT_EQ(sp.start(1), 2);
  EXPECT_EQ(sp.cta_of(0), 0);
  EXPECT_EQ(sp.cta_of(5), 2);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(sp.slot(c, 0), 0);
  const SmallMRingSplit two{2 * 4, 4, 3};  // 8 stages: runs [0,2) [2,5) [5,8)
  EXPECT_EQ(two.start(1), 2);
  EXPECT_EQ(two.start(2), 5);
  EXPECT_EQ(two.slot(1, 0), 0);  // CTA 1 starts in slab 0 ...
  EXPECT_EQ(two.slot(1, 1), 1);  // ... and ends in slab 1
  EXPECT_EQ(two.slot(2, 1), 0);
}

}  // namespace
}  // namespace tessel
