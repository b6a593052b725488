// tessel embedding lookup and its gradient.
//
// ids: any shape (N...), i32 or i64, dense. weight / dweight: (V, D), last axis contiguous
// (row pitch allowed). out / dout: (N..., D) rows views. Float dtypes f32/f16/bf16.
//
// Out-of-range ids (id < 0 or id >= V):
//  * check_ids = false (default, no sync): never read or written out of bounds; forward
//    writes a zero row, backward ignores the token. No error is reported.
//  * check_ids = true: a device-side range check runs first, then the call SYNCHRONIZES the
//    stream (a sync point: not capturable in a CUDA graph) and throws tessel::Error
//    (INVALID_ARGUMENT) naming the first bad position and its id; nothing is written.
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

// out[n, :] = weight[ids[n], :]; out dtype == weight dtype.
void embedding(const Tensor& ids, const Tensor& weight, Tensor& out, bool check_ids,
               cudaStream_t stream);

enum class EmbeddingGradMode : int32_t {
  // Sort-free counting approach: count per id, exclusive scan, bucket fill, then one owner
  // per row of dweight sums its tokens in ascending token order in fp32 and writes the row
  // once (rows with no token are written as zeros). Bitwise reproducible run to run.
  deterministic = 0,
  // dweight is zeroed, then every token's row is added with vector atomics (order varies).
  // With a 16-bit dweight every addition is rounded to 16 bits: prefer an f32 dweight.
  atomic = 1,
};

// dweight (V, D) = Σ_n onehot(ids[n]) ⊗ dout[n, :] (overwritten, not accumulated into).
// dweight dtype: f32 or dout's dtype; accumulation in fp32 (deterministic mode).
// The deterministic mode uses the stream's workspace (≈ 12·V + 4·N bytes + scan scratch).
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        EmbeddingGradMode mode, bool check_ids, cudaStream_t stream);

}  // namespace tessel
