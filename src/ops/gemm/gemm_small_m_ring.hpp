// Small-M GEMM, bulk-copy ring kernel (gemm_small_m_ring.cu): the decode GEMV for B (N,K) and
// M <= 32, one persistent CTA per SM streaming the weight through a shared-memory ring that the
// TMA fills. Internal to the small-M family: gemm_small_m.cu validates the problem, owns the
// workspace and offers this kernel to the autotuner beside the register-streaming one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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
  int rms;            // A = a · norm_w (per k), sums scaled by 1 / sqrt(mean_k a² + rms_eps) per
  float rms_eps;      // token: an RMSNorm fused in front (gemm_small_m_rms)
  const void* norm_w;  // (k)
  int stage_k;        // k per stage: 512, 1024 or 2048
  int row_groups;     // 16-row groups per stage (a slab is 16 · row_groups weight rows)
  int stages;         // ring depth, 1 <= stages <= small_m_ring_max_stages(m, stage_k, row_groups)
  int slab_runs;      // small_m_ring_slab_runs: each CTA's run is whole slabs
  float* partials;    // [grid][2][m][16 · row_groups]: the CTAs' partial column slabs
  unsigned* tickets;  // [small_m_ring_slabs(n, row_groups)], zero between launches
};

constexpr int kSmallMRingMaxM = 32;

#if defined(__CUDACC__)
#define TESSEL_RING_HD __host__ __device__
#else
#define TESSEL_RING_HD
#endif

// The ring kernel's work split (host and device; tests/test_gemm_small_m_split.cpp): the
// `total` stages of all column slabs (`ksn` stages each, slab-major) cut into `grid` contiguous
// runs, one per CTA, of equal length (within one `unit`) in units of `unit` stages: 1, or ksn
// (whole slabs: no slab is cut between CTAs).
struct SmallMRingSplit {
  int64_t total;
  int ksn;
  int grid;
  int unit = 1;
  // First stage of CTA c's run (start(grid) == total).
  TESSEL_RING_HD int64_t start(int c) const { return int64_t{c} * (total / unit) / grid * unit; }
  // The CTA whose run holds stage L: the largest c with start(c) <= L.
  TESSEL_RING_HD int cta_of(int64_t L) const {
    return static_cast<int>(((L / unit + 1) * grid - 1) / (total / unit));
  }
  // Where CTA c keeps its partial sums of `slab` when it holds only a piece of it: 0 for the
  // slab its run starts in, 1 for the slab its run ends in (a run holds at most those two
  // pieces; every slab between them is whole).
  TESSEL_RING_HD int slot(int c, int64_t slab) const { return slab == start(c) / ksn ? 0 : 1; }
};
// Column slabs (16 · row_groups weight rows: the unit whose partial sums are combined across
// CTAs).
int small_m_ring_slabs(int n, int row_groups = 1);
// The deepest ring that fits in shared memory for m tokens (0 if not even one stage does).
int small_m_ring_max_stages(int m, int stage_k, int row_groups = 1);
// Whether the kernel is built for this stage shape and token count.
bool small_m_ring_shape_supported(int m, int stage_k, int row_groups);
// The most tokens the SwiGLU-fused (gated) and RMSNorm-fused (rms) variants take.
int small_m_ring_max_gated_m(int stage_k);
// Whether CTAs take whole slabs (SmallMRingSplit::unit = ksn) for an n-row weight on `sms`
// SMs: when the busiest CTA gets at most ~10 % more than an even stage split, or on the
// fewest CTAs (>= 60 % of the SMs) whose busiest has no more slabs than on all SMs. A slab cut
// between CTAs costs its finisher a fence, a ticket and the peers' partials after its last stage
// (~3 us on the H200, timed per CTA), more than the imbalance. TESSEL_GEMM_SMALL_M_RING_SLABS=0:
// never (A/B).
bool small_m_ring_slab_runs(int n, int sms, int row_groups = 1);
// The grid (CTAs) for an (n, k) problem on `sms` SMs.
int small_m_ring_grid(int n, int k, int stage_k, int sms, int row_groups = 1);
size_t small_m_ring_partial_bytes(int m, int grid, int row_groups = 1);
cudaError_t small_m_ring_launch(const SmallMRingParams& p, int grid, bool bf16,
                                cudaStream_t stream);

}  // namespace tessel::detail
