// Hopper bulk (non-tensor) TMA copies global -> shared, completed on an mbarrier. For row
// kernels that stage a whole row slice in shared memory: one thread issues the copies, the
// data arrive without registers or load instructions, and the CTA's threads wait on the
// barrier of the piece they need. Addresses and sizes must be multiples of 16 bytes.
#pragma once

#include <cstdint>

namespace tessel::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

// Makes initialized barriers visible to the async (TMA) proxy and the cluster.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// bytes: a multiple of 16; dst, src 16-byte aligned.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// A plain arrival (no transaction bytes); release semantics: this thread's earlier shared
// memory writes are visible to threads that see the phase complete.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// An L2 policy for data read once (streamed weights): evicted first, so the activations and
// outputs the next kernels read stay in L2.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// bulk_copy_g2s with an L2 cache policy (l2_evict_first_policy).
__device__ __forceinline__ void bulk_copy_g2s_hint(void* dst, const void* src, uint32_t bytes,
                                                   uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// Named CTA barrier halves (bar.sync / bar.arrive on barrier `id`, `threads` arrivals in all):
// the threads that need the others' shared-memory writes wait, the rest arrive and go on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Cluster barrier halves without the release that cg's cluster.sync() / barrier_arrive() give
// every thread (a memory barrier each). For arrivals that publish nothing, or whose one writer
// fenced first (fence_cluster); the wait keeps its acquire.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
__device__ __forceinline__ void fence_cluster() {
  asm volatile("fence.acq_rel.cluster;" ::: "memory");
}

// ---- distributed shared memory pushes (thread-block clusters) ----
// `local`'s address in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa_u32(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}

// 8 / 16 bytes into CTA `rank`'s copy of *local, completed on its copy of *bar (transaction
// bytes): a message that needs no cluster barrier (the receiver waits on its barrier). The
// receiver's barrier must be initialized before the push (cluster-wide, e.g. a cluster barrier
// after fence.mbarrier_init).
__device__ __forceinline__ void st_async_f2(float2* local, uint64_t* bar, uint32_t rank, float2 v) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(
          mapa_u32(smem_u32(local), rank)),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(mapa_u32(smem_u32(bar), rank))
      : "memory");
}
__device__ __forceinline__ void st_async_f4(float4* local, uint64_t* bar, uint32_t rank, float4 v) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(mapa_u32(smem_u32(local), rank)),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(mapa_u32(smem_u32(bar), rank))
      : "memory");
}

}  // namespace tessel::detail
