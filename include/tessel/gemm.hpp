// tessel::gemm / tessel::bmm — Hopper tensor-core GEMM (WGMMA, fp32 accumulate) with fused
// epilogues:
//
//   D = act(alpha · A·B + bias) + beta · C
//
//   a    : (M, K) row-major, bf16 or f16 (ALayout::mk, the default), or (K, M) row-major
//          (ALayout::km: D = aᵀ·B without a transpose pass, e.g. a weight gradient Xᵀ·dY)
//   b    : (N, K) row-major (BLayout::nk, the nn.Linear weight layout; the default)
//          or (K, N) row-major (BLayout::kn); same dtype as a
//   d    : (M, N) row-major, f32, f16 or bf16
//   bias : optional (N,), f32 or d's dtype, added to every row before the activation
//   act  : none, relu, gelu_tanh, gelu (erf), silu
//   c    : optional (M, N), same dtype as d, added after the activation (the residual of
//          y = x + linear(h)); required when beta != 0, ignored when beta == 0; may be d itself
//
// With act == none this is cuBLASLt's alpha·A·B + beta·C + bias (CUBLASLT_EPILOGUE_BIAS);
// with bias + gelu_tanh and beta == 0, CUBLASLT_EPILOGUE_GELU_BIAS.
//
// Any M; N and K multiples of 8 (TMA needs 16-byte row strides). Rows may be pitched (last
// stride 1, row pitch a multiple of 8 elements); base pointers 16-byte aligned.
// Validation as for every op (tessel::Error naming gemm, the argument, expected and got;
// nothing written on error). M == 0 or N == 0 is a no-op; K == 0 gives D = act(bias) + beta·C.
//
// Tile shape, K split and raster order: with the autotuner on (the default) the first call of
// a problem shape measures the candidates and caches the winner on disk
// (src/runtime/autotune.hpp: TESSEL_AUTOTUNE_CACHE, TESSEL_AUTOTUNE=0 for the fixed heuristic;
// `tessel tune --family gemm` fills the cache ahead of time).
//
// Results are deterministic for a given plan: the same inputs give the same bits on every run
// (split-K sums its K slices in a fixed order); a process keeps its choice per problem, and the
// cache keeps it across processes (TESSEL_AUTOTUNE=0: the same plan everywhere).
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

enum class BLayout : int32_t {
  nk = 0,  // b is (N, K) row-major: D = A · bᵀ (nn.Linear weight)
  kn = 1,  // b is (K, N) row-major: D = A · b
};

enum class ALayout : int32_t {
  mk = 0,  // a is (M, K) row-major
  km = 1,  // a is (K, M) row-major: D = aᵀ · op(b) (read MN-major; no transpose pass)
};

enum class GemmActivation : int32_t {
  none = 0,
  relu = 1,
  gelu_tanh = 2,  // 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))
  gelu = 3,       // 0.5·x·(1 + erf(x/√2))
  silu = 4,       // x·σ(x)
};
const char* gemm_activation_name(GemmActivation act);

struct GemmOptions {
  float alpha = 1.f;
  float beta = 0.f;
  const Tensor* c = nullptr;
  BLayout b_layout = BLayout::nk;
  ALayout a_layout = ALayout::mk;
  const Tensor* bias = nullptr;
  GemmActivation activation = GemmActivation::none;
  // K slices summed by a deterministic in-kernel reduction: 0 = automatic (used for small
  // M·N with long K), 1 = never, S > 1 = S slices where the tile shape allows it (clamped to
  // the number of 64-wide K blocks).
  int split_k = 0;
};

void gemm(const Tensor& a, const Tensor& b, Tensor& d, cudaStream_t stream,
          const GemmOptions& opt = {});

// Strided batched GEMM: D[i] = act(alpha · A[i]·B[i] + bias) + beta · C[i], i < batch.
//   a : (batch, M, K), or (M, K) shared by every batch ((…, K, M) with ALayout::km)
//   b : (batch, N, K) / (batch, K, N) per b_layout, or 2-D shared by every batch
//   d : (batch, M, N);  c : (batch, M, N) like d;  bias : (N,) shared by every batch
// Last stride 1; row pitches and batch strides multiples of 8 elements (any order in memory;
// a batch stride of 0 on a or b also means shared). d's batches must not overlap.
void bmm(const Tensor& a, const Tensor& b, Tensor& d, cudaStream_t stream,
         const GemmOptions& opt = {});

}  // namespace tessel
