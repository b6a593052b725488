// Dependent launch for the small kernels between the decode GEMMs (runtime/launch.cuh).
#pragma once

#include "tile/tile.cuh"

namespace tessel::tile {

// Let the next kernel launch first, then wait for the previous one. A GEMM two or three
// launches ahead then becomes resident as SMs free up and streams its weights while this kernel
// waits and runs. Safe for any dependent: its wait_prior_grid() returns only after this grid
// has completed, and this grid completes only after its own wait.
__device__ __forceinline__ void allow_next_then_wait_prior() {
  allow_next_grid();
  wait_prior_grid();
}

}  // namespace tessel::tile
