// L2 prefetch of weights the engine is about to read (src/llm/gpu_backend.cpp): at batch 1
// the KV-cache attention and the norms between two GEMMs leave HBM mostly idle; prefetching
// the next GEMM's weights into L2 there lets that GEMM start from L2 instead of from HBM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tessel::llm_engine {

// Asks L2 to fetch [p, p + bytes) (device memory) with cp.async.bulk.prefetch.L2, spread over
// `ctas` CTAs (0: one per SM). Fire and forget: nothing is written and the kernel does not wait
// for the data. evict_last: prefetch with the L2::evict_last policy instead of the default.
void l2_prefetch(const void* p, size_t bytes, bool evict_last, int ctas, cudaStream_t stream);

}  // namespace tessel::llm_engine
