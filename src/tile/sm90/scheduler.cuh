// Persistent tile scheduler: a grid of at most #SMs CTAs walks output tiles with a stride of
// gridDim.x. Tiles are visited in grouped order: `group` tile-rows at a time, column by
// column inside a group, so the CTAs in flight share A row-panels and B column-panels in L2.
#pragma once

#include <cstdint>

namespace tessel::tile::sm90 {

struct TileCoord {
  int m;  // tile row
  int n;  // tile column
};

struct TileScheduler {
  int tiles_m = 0;
  int tiles_n = 0;
  int group = 8;

  __host__ __device__ TileScheduler(int M, int N, int bm, int bn, int group_rows)
      : tiles_m((M + bm - 1) / bm), tiles_n((N + bn - 1) / bn), group(group_rows) {}

  __host__ __device__ int64_t tiles() const { return int64_t{tiles_m} * tiles_n; }

  __host__ __device__ TileCoord coord(int64_t t) const {
    const int64_t per_group = int64_t{group} * tiles_n;
    const int first_m = static_cast<int>(t / per_group) * group;
    const int rows = tiles_m - first_m < group ? tiles_m - first_m : group;
    const int64_t r = t % per_group;
    return {first_m + static_cast<int>(r % rows), static_cast<int>(r / rows)};
  }
};

}  // namespace tessel::tile::sm90
