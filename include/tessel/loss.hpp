// tessel loss ops: cross-entropy over large vocabularies and a chunked fused
// linear + cross-entropy (the logits are never materialized whole).
//
// Semantics follow torch.nn.functional.cross_entropy (fp32 math whatever the storage):
//   lse_i   = log Σ_j exp(x_ij)
//   loss_i  = lse_i - (1-ε)·x_i,t_i - (ε/V)·Σ_j x_ij          (ε = label_smoothing)
//   loss_i  = 0 where t_i == ignore_index
//   mean    = Σ loss_i / #{i : t_i != ignore_index}  (NaN when every row is ignored)
//   dlogits = scale · (softmax(x_i) - (1-ε)·onehot(t_i) - ε/V), 0 on ignored rows,
//             scale = grad_scale / #valid (mean) or grad_scale (sum, none)
// A target outside [0, V) that is not ignore_index gives a NaN loss for its row.
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

enum class Reduction : int32_t { none = 0, mean = 1, sum = 2 };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  float label_smoothing = 0.f;  // in [0, 1]
  Reduction reduction = Reduction::mean;
  // Multiplies dlogits: the upstream gradient of the (reduced) loss.
  float grad_scale = 1.f;
};

// logits  : (N, V) f32/f16/bf16, rows may be pitched (last stride 1)
// targets : (N) i32 or i64
// loss    : reduction none -> (N); mean/sum -> one element (shape () or (1)); f32 or logits' dtype
// dlogits : optional (nullptr: forward only); (N, V), logits' dtype; may be logits itself
//           (in place). Computed in the same launch as the loss.
// One pass: rows of up to 131072 elements (16-byte aligned) are held in registers by a group of
// threads (<= 16384) or a cluster of <= 8 CTAs (logits read once, dlogits written once); longer
// or unaligned rows stream (logits read twice).
void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor* dlogits,
                   cudaStream_t stream, const CrossEntropyOptions& opt = {});

struct FusedLinearCrossEntropyOptions {
  CrossEntropyOptions ce{};
  // Rows of hidden per chunk (a multiple of 8); 0 picks min(N rounded up to 8, R) where R is
  // the most rows (a multiple of 128, at least 1024) whose logits slab (rows x V) fits in
  // 1 GiB (4096 rows for V = 128256 in 16 bits).
  int64_t chunk_rows = 0;
};

// loss = cross_entropy(hidden @ weightᵀ, targets) without materializing the (N, V) logits:
// per chunk of rows, logits_chunk = gemm(hidden_chunk, weight) (tessel::gemm), the CE kernel
// turns it into loss + dlogits in place, then
//   dhidden_chunk  = dlogits_chunk @ weight            (written directly)
//   dweight       += dlogits_chunkᵀ @ hidden_chunk     (f32 accumulation, beta = 1; the
//                                                      slab read transposed, ALayout::km)
//
// hidden  : (N, H) bf16 or f16, dense;   weight: (V, H), hidden's dtype, dense
// targets : (N) i32/i64;   loss: as cross_entropy (f32 or hidden's dtype)
// dhidden : optional (N, H), hidden's dtype or f32;  dweight: optional (V, H) f32
// H and V multiples of 8 (tessel::gemm). Temporary device memory (chunk × V logits and a
// padded hidden chunk) is taken with cudaMallocAsync on `stream`.
void fused_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                Tensor& loss, Tensor* dhidden, Tensor* dweight,
                                cudaStream_t stream,
                                const FusedLinearCrossEntropyOptions& opt = {});

}  // namespace tessel
