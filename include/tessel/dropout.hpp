// tessel dropout with a counter-based RNG (Philox 4x32-10, implemented in tessel).
//
// The mask is a pure function of (seed, offset, element index): element i (row-major logical
// index over the whole tensor) is kept iff u >= round(p · 2^16), where u is the low (i even)
// or high (i odd) 16 bits of word (i / 2) % 4 of philox4x32_10(counter = {lo(i/8), hi(i/8),
// lo(offset), hi(offset)}, key = {lo(seed), hi(seed)}) — eight elements per Philox call, so
// p has a resolution of 2^-16 (p below 2^-17 keeps everything; p within 2^-17 of 1 drops
// everything, as p = 1 does). Kept elements are scaled by 1/(1-p) (computed once in fp32).
// The offset selects an independent stream for the same seed: use a distinct offset per
// dropout call (e.g. a per-step counter); any two distinct offsets never share counters for
// tensors below 2^35 elements. backward regenerates the mask from (seed, offset): no mask
// tensor needs to be stored. x, y (and dy, dx) same shape and dtype f32/f16/bf16, dense.
#pragma once

#include <cstdint>

#include "tessel/tensor.hpp"

namespace tessel {

// y = x · keep / (1 - p), p in [0, 1].
void dropout(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t offset,
             cudaStream_t stream);
// Same, and also writes mask (u8, x's shape, dense): 1 kept, 0 dropped.
void dropout_with_mask(const Tensor& x, Tensor& y, Tensor& mask, double p, uint64_t seed,
                       uint64_t offset, cudaStream_t stream);
// dx = dy · keep / (1 - p) with the mask of dropout(…, p, seed, offset).
void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t offset,
                      cudaStream_t stream);

}  // namespace tessel
