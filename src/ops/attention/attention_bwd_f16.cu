// Attention backward kernels with f16 inputs (attention_bwd_kernel.cuh; split per dtype so
// that the two compile in parallel).
#include "ops/attention/attention_bwd_kernel.cuh"

namespace tessel::attention_detail {

void launch_bwd_f16(const BwdArgs& a, cudaStream_t stream) { launch_bwd_typed<__half>(a, stream); }

}  // namespace tessel::attention_detail
