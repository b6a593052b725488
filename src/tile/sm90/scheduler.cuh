// Persistent tile scheduler: a grid of at most #SMs CTAs (or clusters) walks work units with
// a stride of the grid size. A unit is (batch, tile row, tile column, K split): batches one
// after another; inside a batch, tiles in grouped order (`group` tile-rows at a time, column
// by column inside a group, so the CTAs in flight share A row-panels and B column-panels in
// L2); the `splits` K-slices of one tile are adjacent units, so they run at the same time and
// their partial sums meet in L2.
#pragma once

#include <cstdint>

namespace tessel::tile::sm90 {

struct TileCoord {
  int m;      // tile row
  int n;      // tile column
  int batch;  // batch index
  int split;  // K slice (0 .. splits-1)
  int64_t tile;  // linear tile index (batch-major), the split-K reduction slot
};

struct TileScheduler {
  int tiles_m = 0;
  int tiles_n = 0;
  int group = 8;
  int batches = 1;
  int splits = 1;

  __host__ __device__ TileScheduler(int M, int N, int bm, int bn, int group_rows, int batch = 1,
                                    int split = 1)
      : tiles_m((M + bm - 1) / bm), tiles_n((N + bn - 1) / bn), group(group_rows),
        batches(batch), splits(split) {}

  __host__ __device__ int64_t tiles() const { return int64_t{tiles_m} * tiles_n * batches; }
  __host__ __device__ int64_t units() const { return tiles() * splits; }

  __host__ __device__ TileCoord coord(int64_t unit) const {
    const int64_t t = splits > 1 ? unit / splits : unit;
    const int split = splits > 1 ? static_cast<int>(unit - t * splits) : 0;
    const int64_t per_batch = int64_t{tiles_m} * tiles_n;
    const int batch = batches > 1 ? static_cast<int>(t / per_batch) : 0;
    const int64_t r0 = t - int64_t{batch} * per_batch;
    const int64_t per_group = int64_t{group} * tiles_n;
    const int g = static_cast<int>(r0 / per_group);
    const int first_m = g * group;
    const int rows = tiles_m - first_m < group ? tiles_m - first_m : group;
    const int64_t r = r0 - int64_t{g} * per_group;
    return {first_m + static_cast<int>(r % rows), static_cast<int>(r / rows), batch, split, t};
  }
};

}  // namespace tessel::tile::sm90
