// Row slices on independent CTAs that meet through global memory: the alternative to a
// thread-block cluster for a row kernel whose CTAs each stage one slice of a long row in shared
// memory and need the whole row's statistics before writing. A cluster must start with all of
// its CTAs in one GPC at once; these CTAs are placed one by one. Used by cross-entropy's
// loss + dlogits for rows of more than 8 slices (session 26, H200: 0.76 -> 0.83 of copy against
// the cluster kernel of the time; since session 33 the cluster kernel, exchanging by st.async,
// leads where both apply); the norms' staged forward measured slower with it than with its
// cluster (docs/norms.md, session 26).
//
// Protocol, per launch (scratch from SliceExchange, counters zeroed before the launch):
//   slice id   thread 0 takes a ticket (atomicAdd): ids follow the order in which CTAs start,
//              so a CTA only ever waits for slices that are running or that start as soon as
//              another row finishes. No deadlock as long as the device holds one row's slices
//              at once, which a cluster launch of the same row needs too.
//   exchange   thread 0 stores its float4 partial, fences, counts itself in on the row's
//              counter and spins (acquire) until all of the row's slices have; after the
//              CTA barrier, lane r of warp 0 reads slice r's partial (L2) and merges in rank
//              order, as the cluster kernels do.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/check.hpp"
#include "tile/tile.cuh"

namespace tessel::detail {

// Thread 0: this CTA's slice id.
__device__ __forceinline__ unsigned take_slice_ticket(unsigned* sync) {
  return atomicAdd(&sync[0], 1u);
}

// Thread 0: publish this slice's partial and wait until all `slices` of `row` have; sleep_ns > 0
// sleeps that long between polls of the row's counter.
__device__ __forceinline__ void post_slice_and_wait(unsigned* sync, float4* part, int64_t row,
                                                    int slices, int rank, float4 v,
                                                    int sleep_ns = 0) {
  part[row * slices + rank] = v;
  __threadfence();
  unsigned* arrivals = sync + 1 + row;
  atomicAdd(arrivals, 1u);
  // The count stays far below 2^31: read as a signed counter.
  tile::wait_counter_at_least(reinterpret_cast<const int*>(arrivals), slices,
                              static_cast<unsigned>(sleep_ns));
}

// Lane r < slices of any thread after the CTA barrier that follows post_slice_and_wait: slice
// r's partial (else `idle`).
__device__ __forceinline__ float4 slice_partial(const float4* part, int64_t row, int slices, int r,
                                                float4 idle) {
  return r < slices ? __ldcg(&part[row * slices + r]) : idle;
}

// Host: the launch's scratch, stream-ordered (graph capture allowed): [ticket, one counter per
// row] zeroed, then rows x slices float4 partials. Freed (stream-ordered) by the destructor,
// after the launch has been enqueued.
struct SliceExchange {
  unsigned* sync = nullptr;
  float4* part = nullptr;
  cudaStream_t stream;
  SliceExchange(int64_t rows, int64_t slices, cudaStream_t s) : stream(s) {
    const size_t sync_bytes = (static_cast<size_t>(rows) + 1 + 3) / 4 * 16;
    void* p = nullptr;
    TESSEL_CUDA_CHECK(cudaMallocAsync(
        &p, sync_bytes + static_cast<size_t>(rows * slices) * sizeof(float4), stream));
    TESSEL_CUDA_CHECK(cudaMemsetAsync(p, 0, sync_bytes, stream));
    sync = static_cast<unsigned*>(p);
    part = reinterpret_cast<float4*>(static_cast<char*>(p) + sync_bytes);
  }
  ~SliceExchange() { cudaFreeAsync(sync, stream); }
  SliceExchange(const SliceExchange&) = delete;
  SliceExchange& operator=(const SliceExchange&) = delete;
};

}  // namespace tessel::detail
