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

void check_split(int64_t slabs, int ksn, int grid, int unit = 1) {
  SCOPED_TRACE("slabs=" + std::to_string(slabs) + " ksn=" + std::to_string(ksn) +
               " grid=" + std::to_string(grid) + " unit=" + std::to_string(unit));
  const SmallMRingSplit sp{slabs * ksn, ksn, grid, unit};
  ASSERT_EQ(sp.start(0), 0);
  ASSERT_EQ(sp.start(grid), sp.total);
  const int64_t lo = sp.total / unit / grid * unit;
  for (int c = 0; c < grid; ++c) {
    const int64_t len = sp.start(c + 1) - sp.start(c);
    EXPECT_TRUE(len == lo || len == lo + unit) << "CTA " << c << " run of " << len;
    EXPECT_EQ(sp.start(c) % unit, 0) << "CTA " << c;
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
    EXPECT_NE(unit, ksn) << "slab " << slab << " cut between CTAs " << first << " and " << last;
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

// Whole-slab runs (SmallMRingSplit::unit = ksn; the host's grid <= slabs then): no slab is cut,
// runs differ by at most one slab.
TEST(GemmSmallMSplit, WholeSlabRuns) {
  const int grids[] = {1, 2, 7, 114, 132};
  const int ksns[] = {1, 2, 3, 4, 14, 56};
  const int64_t slab_counts[] = {1, 2, 9, 64, 131, 132, 133, 256, 1792, 8016};
  for (int grid : grids)
    for (int ksn : ksns)
      for (int64_t slabs : slab_counts)
        if (slabs >= grid) check_split(slabs, ksn, grid, ksn);
}

// The host's choice: whole slabs where the busiest CTA has at most ~10 % more stages than an
// even split would give it (Llama decode weights on 132 SMs), or on the fewest CTAs with the
// same busiest count if >= 60 % of the SMs stay busy; else the even stage split.
TEST(GemmSmallMSplit, WholeSlabRunsChoice) {
  using detail::small_m_ring_grid;
  using detail::small_m_ring_slab_runs;
  for (int n : {2048, 4096, 6144, 16384, 28672, 128256}) {
    EXPECT_TRUE(small_m_ring_slab_runs(n, 132)) << n;
    EXPECT_EQ(small_m_ring_grid(n, 4096, 1024, 132), std::min(132, (n + 15) / 16)) << n;
  }
  EXPECT_EQ(small_m_ring_grid(3072, 2048, 1024, 132), 96);    // 192 slabs: 2 on each of 96
  EXPECT_EQ(small_m_ring_grid(3200, 14336, 1024, 132), 100);  // 200 slabs
  // 40 slabs (30 % of the SMs), 133 slabs (67 CTAs of 2): the even stage split on every SM.
  EXPECT_FALSE(small_m_ring_slab_runs(640, 132));
  EXPECT_EQ(small_m_ring_grid(640, 14336, 1024, 132), 132);
  EXPECT_FALSE(small_m_ring_slab_runs(133 * 16, 132));
  EXPECT_EQ(small_m_ring_grid(133 * 16, 4096, 1024, 132), 132);
}

// Taller stages (32 or 64 rows: row_groups 2, 4) count slabs of that many rows; the same rule
// picks the grid.
TEST(GemmSmallMSplit, RowGroups) {
  using detail::small_m_ring_grid;
  using detail::small_m_ring_slabs;
  EXPECT_EQ(small_m_ring_slabs(8200, 1), 513);
  EXPECT_EQ(small_m_ring_slabs(8200, 2), 257);
  EXPECT_EQ(small_m_ring_slabs(8200, 4), 129);
  EXPECT_EQ(small_m_ring_grid(28672, 4096, 1024, 132, 2), 132);  // 896 slabs: 6-7 each
  EXPECT_EQ(small_m_ring_grid(4096, 4096, 1024, 132, 2), 128);   // 128 slabs: one each
  EXPECT_EQ(small_m_ring_grid(2880, 4096, 1024, 132, 2), 90);    // 90 slabs (68 % of the SMs)
  // 64 slabs (48 % of the SMs): the even stage split over every SM.
  EXPECT_FALSE(detail::small_m_ring_slab_runs(2048, 132, 2));
  EXPECT_EQ(small_m_ring_grid(2048, 4096, 1024, 132, 2), 132);
  // Shared memory: M = 16 with 32-row stages fits two stages, M = 32 only one (the config is
  // then not offered), M = 32 with 16-row stages two.
  EXPECT_EQ(detail::small_m_ring_max_stages(16, 1024, 2), 2);
  EXPECT_EQ(detail::small_m_ring_max_stages(32, 1024, 2), 1);
  EXPECT_EQ(detail::small_m_ring_max_stages(32, 1024, 1), 2);
  EXPECT_EQ(detail::small_m_ring_max_stages(1, 1024, 1), 6);
  EXPECT_TRUE(detail::small_m_ring_shape_supported(32, 1024, 2));
  EXPECT_FALSE(detail::small_m_ring_shape_supported(9, 2048, 1));
  EXPECT_FALSE(detail::small_m_ring_shape_supported(1, 512, 1));
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
