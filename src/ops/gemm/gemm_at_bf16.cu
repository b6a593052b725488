// tessel::gemm kernels with a transposed A (GemmOptions::a_layout = ALayout::km) and bf16 inputs
// (see gemm_run.cuh, run_typed_at; a translation unit of their own so that they compile in
// parallel with the K-major kernels).
#include <cutlass/numeric_types.h>

#include "ops/gemm/gemm_run.cuh"

namespace tessel::gemm_detail {

void run_at_bf16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
                 const GemmParams& p, int sms, cudaStream_t stream) {
  run_typed_at<cutlass::bfloat16_t>(cfg, kn, ops, tma_d, p, sms, stream);
}

}  // namespace tessel::gemm_detail
