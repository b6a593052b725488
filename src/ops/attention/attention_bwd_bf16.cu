// Attention backward kernels with bf16 inputs (attention_bwd_kernel.cuh; split per dtype so
// that the two compile in parallel).
#include "ops/attention/attention_bwd_kernel.cuh"

namespace tessel::attention_detail {

void launch_bwd_bf16(const BwdArgs& a, cudaStream_t stream) {
  launch_bwd_typed<__nv_bfloat16>(a, stream);
}

}  // namespace tessel::attention_detail
