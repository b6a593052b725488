// Kernel launch with the optional programmatic-dependent-launch attribute (see
// include/tessel/launch.hpp). Only kernels that execute tile::wait_prior_grid() before reading
// anything a preceding kernel may write are launched through here.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "tessel/launch.hpp"

namespace tessel::detail {

template <class... Params, class... Args>
cudaError_t launch_programmatic(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block,
                                size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  return launch_programmatic(dependent_launch(), kernel, grid, block, smem, stream,
                             std::forward<Args>(args)...);
}

// An op's follow-up kernel (e.g. the sum of the partials its first kernel wrote): always a
// programmatic dependent launch, whatever the caller's policy, so that its CTAs are launched
// while the first kernel drains. Only for kernels that execute tile::wait_prior_grid() before
// any memory access: that wait covers everything before them on the stream (the first kernel
// completes only after its own wait, if it had one).
template <class... Params, class... Args>
cudaError_t launch_follow_up(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  return launch_programmatic(true, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// Launch in thread-block clusters of `cluster` (>= 1) CTAs along x (grid.x a multiple of it).
// The caller opts the kernel in to > 48 KB of shared memory / non-portable cluster sizes.
template <class... Params, class... Args>
cudaError_t launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                           int cluster, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Opts `kernel` in to `bytes` (> 48 KB) of dynamic shared memory on the current device, once
// per (kernel, device, bytes).
template <class... Params>
cudaError_t opt_in_shared_memory(void (*kernel)(Params...), int bytes) {
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), dev, bytes);
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(key)) return cudaSuccess;
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess)
    return e;
  done.insert(key);
  return cudaSuccess;
}

}  // namespace tessel::detail
