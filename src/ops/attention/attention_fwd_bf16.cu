// Attention forward WGMMA kernels with bf16 inputs (attention_fwd_kernel.cuh; split per dtype
// so that the two compile in parallel).
#include "ops/attention/attention_fwd_kernel.cuh"

namespace tessel::attention_detail {

void launch_wgmma_bf16(const FwdArgs& a, cudaStream_t stream) {
  launch_typed<cutlass::bfloat16_t>(a, stream);
}

}  // namespace tessel::attention_detail
