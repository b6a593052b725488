// The configurations of mla_decode's kernel for blocks of <= 16 query rows (H·Sq <= 16, the
// memory-bound DeepSeek decode). Not public API: the bench picks one with TESSEL_MLA_CFG, the
// tests through the override below.
//
//   n  tile  stages  warps  Q in       CTAs/SM  shared memory
//   0  32    2       8      smem       2        99,992 B   (default)
//   1  16    4       8      smem       2        100,456 B  (same ring bytes, 3 tiles in flight)
//   2  16    6       4      registers  2        115,064 B  (5 tiles in flight)
//   3  16    3       4      registers  3        59,360 B   (2 tiles in flight, 3 CTAs)
//
// Variants 1-3 are built for bf16 only; f16 and blocks of more than 16 rows always take their
// default kernels.
#pragma once

namespace tessel::detail {

inline constexpr int kMlaSmallConfigs = 4;
// The CTAs per SM each configuration is sized for (shared memory and registers, sm_90).
inline constexpr int kMlaSmallCtasPerSm[kMlaSmallConfigs] = {2, 2, 2, 3};

// The configuration the next bf16 call with <= 16 rows per block uses: the test override when
// set, else TESSEL_MLA_CFG (read at the first call; unset, or a value outside 0..3: 0).
int mla_small_config();

// Tests: run the following calls with configuration n (0..3); any other n returns to
// TESSEL_MLA_CFG. Process-wide.
void set_mla_small_config(int n);

// CTAs per SM of configuration n's kernel (paged or contiguous cache) on the current device,
// from the occupancy query that also sizes its splits.
int mla_small_resident_ctas(int n, bool paged);

}  // namespace tessel::detail
