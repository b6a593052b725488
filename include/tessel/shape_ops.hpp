// tessel shape ops: concatenation and batched transpose (bit-exact, any dtype).
#pragma once

#include <cstddef>

#include "tessel/tensor.hpp"

namespace tessel {

// out = cat(inputs[0..count), axis). Every tensor dense, same dtype and rank; shapes equal
// except along `axis` (negative counts from the end), where out's size is the sum. One launch
// for up to 256 inputs; 16-byte accesses when every slab is 16-byte aligned.
void concat(const Tensor* inputs, size_t count, int axis, Tensor& out, cudaStream_t stream);

// dst (B, C, R) = src (B, R, C) transposed per batch. Both dense; any dtype. A 2-D src is
// B = 1 (then identical to tessel::transpose on dense tensors).
void transpose_batched(const Tensor& src, Tensor& dst, cudaStream_t stream);

}  // namespace tessel
