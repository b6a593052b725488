// Attention backward, head dim 256, f16 inputs (attention_bwd_wgmma_d256_kernel.cuh; one TU
// per dtype so that the two compile in parallel).
#include "ops/attention/attention_bwd_wgmma_d256_kernel.cuh"

namespace tessel::attention_detail {

void launch_bwd_wgmma_d256_f16(const BwdArgs& a, cudaStream_t stream) {
  bwd_wgmma_d256::launch<cutlass::half_t>(a, stream);
}

}  // namespace tessel::attention_detail
