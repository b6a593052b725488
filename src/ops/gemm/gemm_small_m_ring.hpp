// Small-M GEMM, bulk-copy ring kernel (gemm_small_m_ring.cu): the decode GEMV for B (N,K) and
// M <= 8, one persistent CTA per SM streaming the weight through a shared-memory ring that the
// TMA fills. Internal to the small-M family: gemm_small_m.cu validates the problem, owns the
// workspace and offers this kernel to the autotuner beside the register-streaming one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tile/stream_k.hpp"

namespace tessel::detail {

struct SmallMRingParams {
  const void* a;  // (M, K), or the gate half of [gate | up] (M, 2K) when gated
  int64_t lda;
  const void* b;  // (N, K)
  int64_t ldb;
  void* d;
  int64_t ldd;
  const void* c;  // beta · C, or nullptr
  int64_t ldc;
  float alpha, beta;
  int m, n, k;
  int out;            // 0 f32, 1 f16, 2 bf16
  int gated;          // A = silu(a[:, :k]) * a[:, k:2k] (the SwiGLU MLP's down projection)
  int stage_k;        // k per stage: 1024 or 2048
  int stages;         // ring depth, 1 <= stages <= small_m_ring_max_stages(m, stage_k)
  float* partials;    // [grid][2][m][16]: the CTAs' partial column slabs
  unsigned* tickets;  // [small_m_ring_slabs(n)], zero between launches
};

constexpr int kSmallMRingMaxM = 8;

// The ring kernel's work split: column slabs x stages (tile/stream_k.hpp).
using SmallMRingSplit = tile::StreamKSplit;
// Column slabs (16 weight rows: the unit whose partial sums are combined across CTAs).
int small_m_ring_slabs(int n);
// The deepest ring that fits in shared memory for m tokens.
int small_m_ring_max_stages(int m, int stage_k);
// The most tokens the SwiGLU-fused (gated) variant takes.
int small_m_ring_max_gated_m(int stage_k);
// The grid (CTAs) for an (n, k) problem on `sms` SMs.
int small_m_ring_grid(int n, int k, int stage_k, int sms);
size_t small_m_ring_partial_bytes(int m, int grid);
cudaError_t small_m_ring_launch(const SmallMRingParams& p, int grid, bool bf16,
                                cudaStream_t stream);

}  // namespace tessel::detail
