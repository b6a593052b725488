// Which kernel runs MLA decode blocks of <= 16 query rows: mla_swap_kernel (WGMMA with the
// operands swapped; the default where the cache geometry allows) or decode_kernel (mma.sync).
// Not public API: tests run both on the same inputs, bench A/Bs set TESSEL_MLA_SWAP=0.
#pragma once

namespace tessel::detail {

// TESSEL_MLA_SWAP=0 at the first call turns the swap kernel off; set_mla_swap overrides it.
bool mla_swap_enabled();
void set_mla_swap(bool enabled);

}  // namespace tessel::detail
