// Small-M GEMM (decode, M = 1…32): D(M,N) = alpha · A(M,K) · op(B) + beta · C, streaming the
// weight B once with 128-bit loads (tensor-core mma.sync m16n8k16, fp32 accumulate).
//
//   a : (M, K) row-major bf16/f16, 1 <= M <= 32
//   b : (N, K) row-major (BLayout::nk) or (K, N) row-major (BLayout::kn), a's dtype
//   d : (M, N) f32/f16/bf16; opt.c (same dtype/shape as d, may be d) when beta != 0
//
// Arguments must already be validated by tessel::gemm (dtypes, shapes, N and K multiples of
// 8, row pitches multiples of 8 elements, 16-byte aligned base pointers, device pointers).
// Returns false without launching anything for cases it does not handle (M outside 1…32,
// K == 0, anything it cannot prove it supports); the caller then uses the general kernel.
//
// Config (rows/columns per block, warps along K, split-K count; or, for B (N,K), the bulk-copy
// ring kernel of gemm_small_m_ring.cu and its stage shape) comes from the autotuner
// (src/runtime/autotune.hpp, family "gemm_small_m"); split-K partials are reduced
// deterministically (fixed split / CTA order) by the last block of each column slab.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "tessel/gemm.hpp"

namespace tessel::detail {

bool gemm_small_m(const Tensor& a, const Tensor& b, Tensor& d, const GemmOptions& opt,
                  cudaStream_t stream);

// Whether tessel::gemm should send an (M, N, K) problem (1 <= M <= 32) here rather than to
// the TMA/WGMMA kernel. For B (N,K) with M = 17-32 and weights of at most one wave of 64x64
// tiles (N <= 64 x #SMs), the TMA kernel's 64x64 tiles stream the weight faster (H100,
// bench gemm_sweep with TESSEL_GEMM_SMALL_M=0: 32x4096x4096 1732 vs 1150 GB/s); M <= 16 runs
// here (the ring kernel's 32-row stages: H200, 16x4096x4096 15.2 µs vs 18.3 on 64x64 tiles;
// with TESSEL_GEMM_SMALL_M_RING=0 the old rule, M <= 8). TESSEL_GEMM_SMALL_M=0 / 1 forces
// never / always.
bool gemm_small_m_preferred(int64_t m, int64_t n, bool kn, int sms);

// The down projection of a SwiGLU MLP with the activation fused into the A staging:
// D = alpha · (silu(G) ⊙ U) · op(B) + beta · C, where gate_up = [G | U] is (M, 2K) (unit
// column stride, any row pitch that gemm_small_m accepts for A) and K is B's reduction size.
// silu(G) ⊙ U is rounded to the input dtype exactly as tessel::swiglu rounds it, so with the
// same config the result equals swiglu followed by gemm_small_m bit for bit (the autotuner
// tunes this problem under its own key, "gemm_small_m_swiglu", so its choice may differ from
// the plain problem's). Same contract otherwise (false: nothing launched; the caller runs
// swiglu + gemm). With config -1 it also refuses where the plain problem's choice is a ring
// config that the SwiGLU prologue cannot run (more than 2048 / stage_k tokens).
// `config` as in gemm_small_m_with_config (-1: the autotuner's choice for the plain problem).
bool gemm_small_m_swiglu(const Tensor& gate_up, const Tensor& b, Tensor& d, const GemmOptions& opt,
                         cudaStream_t stream, int config = -1);

// The projection after an RMSNorm, with the norm fused into the GEMM:
// D = alpha · diag(r) · (A ⊙ w) · op(B) + beta · C, r[i] = 1 / sqrt(mean_k A[i,k]² + eps),
// i.e. rms_norm(A, w) · op(B) with the row scale applied to the fp32 sums: A ⊙ w (w the norm
// weight, K elements of A's dtype, 16-byte aligned) is rounded to the input dtype once while
// staged, and every CTA computes r from A after its dependent-launch wait. opt.c may be d (a
// residual added in place). Same contract and tuning as gemm_small_m (the plain problem's
// config; false: nothing launched — also for an eps that is negative or not finite, a norm
// weight of another dtype / size / alignment, or where the chosen ring config's A warps cannot
// stage m tokens: more than 2048 / stage_k).
bool gemm_small_m_rms(const Tensor& a, const Tensor& norm_w, float eps, const Tensor& b,
                      Tensor& d, const GemmOptions& opt, cudaStream_t stream, int config = -1);

// Tuning hooks (benchmarks, tests, `tessel tune`): number of candidate configs, a config's
// description, and a launch with a forced config (-1: the autotuner's choice). Same
// contract as gemm_small_m.
int gemm_small_m_num_configs();
std::string gemm_small_m_config_name(int config);
// Whether `config` is one of the ring kernel's (B (N,K) only; refused by the SwiGLU-fused
// problem where its A warps cannot hold the tokens).
bool gemm_small_m_is_ring_config(int config);
bool gemm_small_m_with_config(const Tensor& a, const Tensor& b, Tensor& d, const GemmOptions& opt,
                              cudaStream_t stream, int config);
// The config gemm_small_m would use for this problem right now (may tune; -1 if the
// problem is not handled).
int gemm_small_m_choice(const Tensor& a, const Tensor& b, const Tensor& d, const GemmOptions& opt,
                        cudaStream_t stream);

}  // namespace tessel::detail
