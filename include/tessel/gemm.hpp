// tessel::gemm — D = alpha · A·B + beta · C on Hopper tensor cores (WGMMA, fp32 accumulate).
//
//   a : (M, K) row-major, bf16 or f16
//   b : (N, K) row-major (BLayout::nk, the nn.Linear weight layout; the default)
//       or (K, N) row-major (BLayout::kn); same dtype as a
//   d : (M, N) row-major, f32, f16 or bf16
//   c : optional (M, N), same dtype as d; required when beta != 0 (may be d itself)
//
// Any M; N and K multiples of 8 (TMA needs 16-byte row strides). Rows may be pitched (last
// stride 1, row pitch a multiple of 8 elements); base pointers 16-byte aligned.
// Validation as for every op (tessel::Error naming gemm, the argument, expected and got;
// nothing written on error). M == 0 or N == 0 is a no-op; K == 0 gives D = beta · C.
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

enum class BLayout : int32_t {
  nk = 0,  // b is (N, K) row-major: D = A · bᵀ (nn.Linear weight)
  kn = 1,  // b is (K, N) row-major: D = A · b
};

struct GemmOptions {
  float alpha = 1.f;
  float beta = 0.f;
  const Tensor* c = nullptr;
  BLayout b_layout = BLayout::nk;
};

void gemm(const Tensor& a, const Tensor& b, Tensor& d, cudaStream_t stream,
          const GemmOptions& opt = {});

}  // namespace tessel
