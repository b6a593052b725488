// Which kernel runs MLA decode blocks of <= 16 query rows: mla_swap_kernel (WGMMA with the
// operands swapped; the default where the cache geometry allows) or decode_kernel (mma.sync).
// Not public API: tests run both on the same inputs, bench A/Bs set TESSEL_MLA_SWAP=0.
#pragma once

namespace tessel::detail {

// 0: decode_kernel always; 1 (default): mla_swap_kernel where its splits get >= 3 tiles;
// 2: mla_swap_kernel wherever the cache geometry allows (tests). TESSEL_MLA_SWAP=0 / 2 at the
// first call sets the mode; set_mla_swap overrides it.
int mla_swap_mode();
void set_mla_swap(int mode);

}  // namespace tessel::detail
