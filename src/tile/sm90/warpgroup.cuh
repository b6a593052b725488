// Warp-specialized roles on Hopper: which warpgroup a thread is in, and register reallocation.
//
// A CTA of (1 + C) warpgroups: warpgroup 0 is the producer (one elected thread issues TMA
// loads), warpgroups 1..C are consumers (WGMMA + epilogue). setmaxnreg moves registers from
// the producer to the consumers; it needs a register cap at entry (__launch_bounds__(n, 1))
// and each role in one branch of a single if/else.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/reg_reconfig.h>

namespace tessel::tile::sm90 {

constexpr int kWarpgroupThreads = 128;

// Warpgroup index, uniform across the warp (lets the compiler treat roles as warp-uniform).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
}
__device__ __forceinline__ int warp_in_warpgroup() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32 % 4, 0);
}
// Thread index among the consumer warpgroups (0 .. 128*C-1).
__device__ __forceinline__ int consumer_thread() {
  return static_cast<int>(threadIdx.x) - kWarpgroupThreads;
}

// Register budgets: producer + 2 consumers = 40 + 2*232 = 504 per lane-triple <= 512.
// (48 + 2*232 = 512 hung on H100: the consumers' setmaxnreg.inc never found its registers.)
template <int Regs = 40>
__device__ __forceinline__ void producer_registers() {
  cutlass::arch::warpgroup_reg_dealloc<Regs>();
}
template <int Regs = 232>
__device__ __forceinline__ void consumer_registers() {
  cutlass::arch::warpgroup_reg_alloc<Regs>();
}

// True in exactly one lane of the calling warp.
__device__ __forceinline__ bool elect_one() { return cute::elect_one_sync(); }

}  // namespace tessel::tile::sm90
