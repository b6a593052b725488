// Multi-stage shared-memory pipeline between one TMA producer thread and consumer
// warpgroups: cutlass::PipelineTmaAsync (full barriers count TMA transaction bytes, empty
// barriers count consumer arrivals).
//
//   producer: acquire(st) -> issue TMA with barrier(st) -> ++st      ... tail(st) at the end
//   consumer: wait(st) -> read stage st.index() -> release(st) -> ++st
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "tile/sm90/warpgroup.cuh"

namespace tessel::tile::sm90 {

template <int Stages>
using TmaPipeline = cutlass::PipelineTmaAsync<Stages>;
template <int Stages>
using PipeState = cutlass::PipelineState<Stages>;

// Every thread of the CTA constructs it; warp 0 initializes the barriers. Follow with
// cluster_sync() before the first use. With ClusterM > 1 CTAs of a (ClusterM, 1) cluster
// multicast into each other's stages: each consumer warpgroup releases a stage to every
// CTA of the cluster (the empty barriers count all of them).
template <int Stages, int ClusterM = 1>
__device__ __forceinline__ TmaPipeline<Stages> make_tma_pipeline(
    typename TmaPipeline<Stages>::SharedStorage& storage, bool producer, uint32_t tx_bytes,
    int consumer_threads) {
  using P = TmaPipeline<Stages>;
  typename P::Params params;
  params.transaction_bytes = tx_bytes;
  params.role = producer ? P::ThreadCategory::Producer : P::ThreadCategory::Consumer;
  params.is_leader = threadIdx.x % kWarpgroupThreads == 0 && producer;
  params.num_consumers = static_cast<uint32_t>(consumer_threads);
  return P(storage, params, cute::Shape<cute::Int<ClusterM>, cute::_1, cute::_1>{});
}

// Barrier initialization visible to every thread of the cluster (or CTA) before use.
template <int ClusterM>
__device__ __forceinline__ void cluster_sync() {
  if constexpr (ClusterM > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }
}

template <int Stages>
__device__ __forceinline__ PipeState<Stages> producer_start() {
  return cutlass::make_producer_start_state<TmaPipeline<Stages>>();
}

}  // namespace tessel::tile::sm90
