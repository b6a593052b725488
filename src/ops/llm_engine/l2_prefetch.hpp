// L2 prefetch of a weight the decode step will read soon (the engine's GPU backend): the copy
// engine of a few SMs pulls the bytes into L2 while latency-bound kernels (RoPE, decode
// attention, norms) leave the DRAM idle, so that the GEMM after them reads (part of) its weight
// from L2.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessel::llm_engine {

// Prefetches [p, p + bytes) into L2 (p 16-byte aligned; bytes rounded down to 16). Launched as
// a dependent launch when tessel::dependent_launch() is on: it issues its prefetches at once,
// lets the next kernel launch, then waits for the kernel before it (so the stream's order is
// kept for the kernels after it). A hint: no output, nothing to wait for.
void l2_prefetch(const void* p, size_t bytes, cudaStream_t stream);

}  // namespace tessel::llm_engine
