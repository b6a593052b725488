// A kernel that keeps a stream busy for a while: the engine's op profile (src/llm/op_profile.cpp)
// queues a whole step behind it, so the GPU runs the step's kernels back to back and the events
// between them time the kernels, not the host's launch rate.
#pragma once

#include <cuda_runtime_api.h>

namespace tessel::llm_engine {

// One thread spins on the SM clock for about `microseconds` (clock rate read once per device).
void hold_stream(double microseconds, cudaStream_t stream);

}  // namespace tessel::llm_engine
