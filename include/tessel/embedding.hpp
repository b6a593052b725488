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
  // The same count / scan / fill passes, then every dweight row is stored once: a row with
  // at most 32 tokens is summed in fp32 (in bucket order, which varies run to run) and rounded
  // to dweight's dtype once; a hotter row is stored as zeros, then its tokens are summed in
  // fp32 in chunks of 64 and each chunk is added with vector atomics (chunk order varies).
  // Not bitwise reproducible. With a 16-bit dweight a hot row is rounded to 16 bits once per
  // 64-token chunk (ceil(T / 64) roundings), other rows once. Under CUDA graph capture with
  // too small a stream workspace (e.g. a stream without an earlier eager call): dweight is
  // zeroed and every token's row added with vector atomics instead (each addition rounded to
  // 16 bits for a 16-bit dweight: prefer an f32 dweight), nothing allocated.
  atomic = 1,
};

// dweight (V, D) = Σ_n onehot(ids[n]) ⊗ dout[n, :] (overwritten, not accumulated into).
// dweight dtype: f32 or dout's dtype; accumulation in fp32 (but for atomic mode's 16-bit
// roundings above).
// Both modes use the stream's workspace, left zeroed: ≈ 12·V + 4·N bytes + scan scratch, plus
// 8·(N/64 + N/33 + 1) + 256 bytes in atomic mode. Growing it allocates and synchronizes the
// stream, which graph capture forbids: before capturing a call, make an eager call of the same
// mode with at least as large V and N on that stream (otherwise the deterministic mode's
// growth can break the capture, and atomic mode takes the fallback above).
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        EmbeddingGradMode mode, bool check_ids, cudaStream_t stream);

}  // namespace tessel
