// Attention backward WGMMA dK/dV kernel with f16 inputs (attention_bwd_wgmma_kernel.cuh;
// split per dtype so that the two compile in parallel).
#include "ops/attention/attention_bwd_wgmma_kernel.cuh"

namespace tessel::attention_detail {

void launch_bwd_wgmma_f16(const BwdArgs& a, cudaStream_t stream) {
  launch_bwd_wgmma_typed<cutlass::half_t>(a, stream);
}

}  // namespace tessel::attention_detail
