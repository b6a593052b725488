// tessel::gemm kernels with bf16 inputs (see gemm_run.cuh; split from gemm.cu so that the two
// input dtypes compile in parallel).
#include <cutlass/numeric_types.h>

#include "ops/gemm/gemm_run.cuh"

namespace tessel::gemm_detail {

void run_bf16(int cfg, bool kn, const GemmOperands& ops, const CUtensorMap& tma_d,
            const GemmParams& p, int sms, cudaStream_t stream) {
  run_typed<cutlass::bfloat16_t>(cfg, kn, ops, tma_d, p, sms, stream);
}

}  // namespace tessel::gemm_detail
