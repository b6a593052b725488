// Small-M GEMM, TMA ring kernel (gemm_small_m_ring.cu): the decode GEMV for B (N,K) and M <= 8,
// one persistent CTA per SM streaming the weight through a shared-memory ring of 128-row x
// 64-k tensor boxes. Internal to the small-M family: gemm_small_m.cu validates the problem,
// owns the workspace and offers this kernel to the autotuner beside the register-streaming one.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tessel::detail {

struct SmallMRingProblem {
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
  int stages;         // ring depth, 1 <= stages <= small_m_ring_max_stages(gated)
  bool bf16;          // else f16
  float* partials;    // [grid][2][m][128]: the CTAs' partial column slabs
  unsigned* tickets;  // [small_m_ring_slabs(n)], zero between launches
};

constexpr int kSmallMRingMaxM = 8;

// Column slabs (128 weight rows: the unit whose partial sums are combined across CTAs).
int small_m_ring_slabs(int n);
// The grid (CTAs) for an (n, k) problem on `sms` SMs.
int small_m_ring_grid(int n, int k, int sms);
// The deepest ring that fits in shared memory.
int small_m_ring_max_stages(bool gated);
size_t small_m_ring_partial_bytes(int m, int grid);
// Builds the tensor maps and launches; throws tessel::Error when a map cannot be encoded.
cudaError_t small_m_ring_launch(const SmallMRingProblem& p, int grid, cudaStream_t stream);

}  // namespace tessel::detail
