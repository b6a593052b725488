// Hopper attention backward, dK/dV kernel (FlashAttention-3 style): TMA + WGMMA,
// warp-specialized. The default (atomic dq) mode for D = 64 / 128 and TMA-aligned views;
// everything else stays on the mma.sync kernels (attention_bwd_kernel.cuh).
//
// One CTA per (128-key block, kv head, sequence); 1 producer + 2 consumer warpgroups:
//   producer : one elected thread TMA-loads the block's K and V once (own mbarrier), then
//              walks every q head of the kv head's group and every Br-row query block that
//              sees one of the keys, loading Q and dO into a Stages-deep ring. A second
//              warp is the dQ writer (below).
//   consumers: warpgroup w owns keys 64w .. 64w+63 and per query block computes, transposed
//              (keys are the M side of every WGMMA):
//                S^T = K Q^T, dP^T = V dO^T     SS WGMMA (64 x Br, fp32)
//                P^T = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - delta) s'
//                dV += P^T dO, dK += dS^T Q     RS WGMMA: P^T, dS^T rounded to T in registers;
//                                               Q / dO read MN-major from the same shared bytes
//                dQ = dS K                      SS WGMMA: dS^T goes through shared memory
//                                               (double buffer), both warpgroups' keys are the
//                                               K side
//              then leave the (Br x D) f32 dQ tile in shared memory in the blocked
//              workspace's order (attention_bwd.cuh: float4 stores in accumulator order);
//              the dQ writer warp adds it to the f32 dq workspace with one bulk reduce-add
//              (cp.reduce.async.bulk .add.f32) while the consumers go on, and hands the tile
//              back once the copy engine has read it. Under causal masks the workspace is
//              not zeroed beforehand: a tile's first dQ (ticket 0 of BwdArgs::dq_tickets, taken
//              a step ahead) is stored by a bulk copy and published once complete, and the
//              others wait for it before they add (a key block's first query blocks are ones
//              that no other key block has reached yet). At the end of the CTA the writer counts
//              its key block done (BwdArgs::kv_done) once every write of the CTA is complete:
//              the dq convert kernel, launched as a programmatic dependent (every CTA here
//              triggers it at its start), converts a (sequence, kv head)'s tiles once all its
//              key blocks are done, on SMs the last key blocks leave idle. (Converting tiles
//              in this kernel's idle producer warps measured 6-13 % slower, session 36.)
//              lse and delta of the block's Br rows go into one shared copy (warpgroup 0
//              stores lse, 1 delta), a step ahead (rows past the sequence: lse = +inf, P = 0).
//              The P / dS loop is compiled once per (soft-cap, mask) case: straight-line
//              code (a runtime branch per element tripled its instructions).
// Registers (-Xptxas -v, setmaxnreg 40 / 232): D = 128 8 bytes of spill (session 35); D = 64
// none.
// Tried and slower at D = 128 (B4 H32 S4096): dV / dK left in flight across the next step's
// S / dP (290 vs 320 TFLOP/s, 44 bytes of spills); S and dP in separate WGMMA groups with P
// computed while dP runs (hundreds of bytes of spills; session 18, without spills: P^T formed
// under dP^T, dV issued before dS^T, dS from the rounded P: 442 -> 409, D = 64 363 -> 313).
// The K-major (R x C) and MN-major (C x R) 128B-swizzled layouts of tile/sm90/tma.cuh map
// every element to the same offset, so one TMA load serves both operand roles.
// Br = 64: the dQ WGMMA splits N between the two warpgroups at D = 128; at D = 64 one
// warpgroup computes a step's dQ, alternating by step.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include <climits>
#include <cute/tensor.hpp>

#include "ops/attention/attention_bwd.cuh"
#include "ops/attention/attention_fwd_kernel.cuh"

namespace tessel::attention_detail {

namespace bwd_wgmma {

using namespace tessel::tile::sm90;

template <class T_, int D_>
struct BwdConfig {
  using T = T_;
  static constexpr int D = D_;
  // dQ: the consumers leave each step's dQ tile in shared memory, in the blocked workspace's
  // order (attention_bwd.cuh), and a writer warp adds it to the workspace with one bulk
  // reduce-add (cp.reduce.async.bulk; float2 atomics from the consumers measured 247 instead
  // of 326 TFLOP/s at D = 128, and 64 row-wise bulk ops ~4 % more than one, session 35).
  static constexpr int Bc = 128;  // keys per CTA: 2 consumer warpgroups x 64
  static constexpr int Br = 64;   // query rows per step
  static constexpr int Stages = D == 64 ? 4 : 2;
  static constexpr int Consumers = 2;
  static constexpr int Threads = kWarpgroupThreads * (1 + Consumers);
  using SmemK = SmemLayout<T, Major::K, Bc, D, 1>;         // K, V: A of S^T / dP^T
  using SmemKt = SmemLayout<T, Major::MN, D, Bc, 1>;       // the same bytes: B of dQ = dS K
  using SmemQ = SmemLayout<T, Major::K, Br, D, Stages>;    // Q, dO: B of S^T / dP^T
  using SmemQt = SmemLayout<T, Major::MN, D, Br, Stages>;  // the same bytes: B of dK / dV
  using SmemDS = SmemLayout<T, Major::MN, Br, Bc, 2>;      // dS (query-contiguous), A of dQ
  using SmemDSt = SmemLayout<T, Major::K, Bc, Br, 2>;      // the same bytes as dS^T (stmatrix)
  using MmaSdP = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<Br>, cute::Int<D>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::Int<Consumers>, cute::_1, cute::_1>>{}));
  using MmaKV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<D>, cute::Int<Br>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<Consumers>, cute::_1, cute::_1>>{}));
  // Warpgroups computing a step's dQ (64 x D): D = 128: both, 64 columns each; D = 64: one,
  // alternating by step (a 32-column half would be no 128B-swizzled MN-major operand).
  static constexpr int DqWgs = D == 128 ? 2 : 1;
  static constexpr int DqWriters = 1;  // producer warpgroup warp 1
  // D = 64: two dQ tiles, the copy engine reads one while a consumer writes the other (+2-4 %;
  // at D = 128 a second tile measured -2 % causal, equal otherwise, session 35).
  static constexpr int DqTiles = D == 64 ? 2 : 1;
  static constexpr int DqBarrierThreads = DqWgs * kWarpgroupThreads + 32 * DqWriters;
  using MmaDQ = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<D / DqWgs>, cute::Int<Bc>>,
                                       cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::_1, cute::Int<DqWgs>, cute::_1>>{}));
  using Pipeline = TmaPipeline<Stages>;
  struct Smem {
    alignas(1024) T k[cute::cosize_v<SmemK>];
    alignas(1024) T v[cute::cosize_v<SmemK>];
    alignas(1024) T q[cute::cosize_v<SmemQ>];
    alignas(1024) T dout[cute::cosize_v<SmemQ>];
    alignas(1024) T ds[cute::cosize_v<SmemDS>];
    // DqTiles dQ tiles (step it uses it % DqTiles), kDqTileRows x D each in the blocked order.
    alignas(128) float dq[DqTiles][Br * D];
    // A step's rows (by step parity): lse log2 e stored by warpgroup 0, scale * delta by 1.
    alignas(16) float lse2[2][Br];
    alignas(16) float delta[2][Br];
    alignas(16) typename Pipeline::SharedStorage pipe;
    alignas(8) uint64_t kv_full;
  };
  static constexpr uint32_t kQBytes = 2 * stage_bytes<T, SmemQ>;  // Q and dO
  static constexpr uint32_t kKVBytes = 2 * stage_bytes<T, SmemK>;
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
  static_assert(kSmemBytes <= 232448, "shared memory per block");
  static_assert(Br == kDqTileRows, "a step's dQ is one tile of the blocked workspace");
  static_assert(Bc == kDqKeyBlock, "BwdArgs::kv_done counts key blocks of kDqKeyBlock keys");
};

// Named barriers (0 is __syncthreads): the dS buffer is complete (both consumer warpgroups;
// it also publishes the next step's rows), the first step's rows are stored.
constexpr int kDsBarrier = 1;
constexpr int kRowsBarrier = 2;
// dQ tile p is written (consumers -> writer warp) / has been read (writer -> consumers): the
// consumer warpgroups that compute dQ + the writer warp.
constexpr int kDqFullBarrier0 = 4;   // + tile
constexpr int kDqEmptyBarrier0 = 6;  // + tile
// The CTA's last global writes are issued (consumers' dK / dV, the dQ writer's reduce-adds):
// the consumer warpgroups + the dQ writer warp, before the writer counts the key block done.
constexpr int kDoneBarrier = 8;
constexpr int kDoneBarrierThreads = 2 * kWarpgroupThreads + 32;
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}
template <int Threads>
__device__ __forceinline__ void dq_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(Threads) : "memory");
}
template <int Threads>
__device__ __forceinline__ void dq_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(Threads) : "memory");
}

// global[0 .. bytes) += shared[0 .. bytes) (f32), by the copy engine.
__device__ __forceinline__ void bulk_reduce_add_f32(float* global, const float* shared,
                                                    uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(global),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(shared))), "r"(bytes)
      : "memory");
}
// global[0 .. bytes) = shared[0 .. bytes), by the copy engine.
__device__ __forceinline__ void bulk_store(void* global, const void* shared, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(global),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(shared))), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;"); }
template <int Pending = 0>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(Pending) : "memory");
}

// One thread, once per CTA: every write of the CTA is done (the bulk reduce-adds this thread
// issued, the consumers' stores before kDoneBarrier), then BwdArgs::kv_done += 1 (release: the
// convert kernel acquires it before reading the workspace).
__device__ __forceinline__ void count_key_block_done(int* counter) {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
}

// The key block this CTA computes.
struct KeyBlock {
  int b = 0, blk = 0, hk = 0;
  int64_t q_row0 = 0, k_row0 = 0;
  int sq = 0, skv = 0;
};

template <int Bc>
__device__ __forceinline__ bool find_key_block(const BwdArgs& a, KeyBlock& kb) {
  if (a.cu_q == nullptr) {
    kb.sq = a.sq;
    kb.skv = a.skv;
    if (a.order_pairs <= 0) {
      kb.b = blockIdx.z;
      kb.hk = blockIdx.y;
      kb.blk = blockIdx.x;  // key block 0 sees the most queries under a causal mask: first
      return true;
    }
    // Sections of order_pairs (kv head, sequence) pairs, key block slowest within a section:
    // every pair's key block 0 (the longest under a causal mask) first, and the grid ends on
    // the shortest blocks of the last section (a greedy list schedule of 132 SMs: ~3 % shorter
    // at B 4, H 32, 4096 causal). A section's Q / dO stay in L2 while it runs.
    const int nb = static_cast<int>(gridDim.x), pairs = static_cast<int>(gridDim.y * gridDim.z);
    const int id = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    const int per_section = a.order_pairs * nb, section = id / per_section;
    const int r = id - section * per_section;
    const int in_section = min(a.order_pairs, pairs - section * a.order_pairs);
    kb.blk = r / in_section;
    const int pair = section * a.order_pairs + (r - kb.blk * in_section);
    kb.hk = pair % static_cast<int>(gridDim.y);
    kb.b = pair / static_cast<int>(gridDim.y);
    return true;
  }
  kb.hk = blockIdx.y;
  int id = static_cast<int>(blockIdx.x);
  for (int b = 0; b < a.batches; ++b) {
    const int k0 = a.cu_k[b], k1 = a.cu_k[b + 1];
    const int nb = (k1 - k0 + Bc - 1) / Bc;
    if (id < nb) {
      kb.b = b, kb.blk = id, kb.q_row0 = a.cu_q[b], kb.k_row0 = k0;
      kb.sq = a.cu_q[b + 1] - a.cu_q[b], kb.skv = k1 - k0;
      return true;
    }
    id -= nb;
  }
  return false;
}

template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const T l = static_cast<T>(lo), h = static_cast<T>(hi);
  return uint32_t{reinterpret_cast<const uint16_t&>(l)} |
         (uint32_t{reinterpret_cast<const uint16_t&>(h)} << 16);
}

// Query blocks (Br rows) that see some key of [j0, j0 + Bc): m_lo .. m_lo + nm - 1.
template <int Bc, int Br>
__device__ __forceinline__ void visible_query_blocks(const BwdArgs& a, const KeyBlock& kb, int j0,
                                                     int& m_lo, int& nm) {
  const int offset = kb.skv - kb.sq;
  const int j_last = min(j0 + Bc, kb.skv) - 1;
  int i_min = 0, i_max = kb.sq - 1;
  if (a.window_right >= 0) i_min = max(i_min, j0 - offset - a.window_right);
  if (a.window_left >= 0) i_max = min(i_max, j_last - offset + a.window_left);
  m_lo = max(i_min, 0) / Br;
  nm = i_max >= i_min ? i_max / Br + 1 - m_lo : 0;
}

// Producer thread: the key block's K and V once (kv_full), then Q and dO of every step (q head
// hk * group + it / nm, query block m_lo + it % nm) into the pipeline's stages.
template <class Cfg, class TmaQ, class TmaK, class Pipe, class SK, class SQ>
__device__ __forceinline__ void produce_steps(const TmaQ& tma_q, const TmaQ& tma_do,
                                              const TmaK& tma_k, const TmaK& tma_v,
                                              const BwdArgs& a, const KeyBlock& kb, int hk,
                                              int group, int m_lo, int nm, uint64_t& kv_full,
                                              Pipe& pipe, const SK& sK, const SK& sV, const SQ& sQ,
                                              const SQ& sdO) {
  using namespace cute;
  constexpr int Bc = Cfg::Bc, Br = Cfg::Br, D = Cfg::D, Stages = Cfg::Stages;
  const bool varlen = a.cu_q != nullptr;
  const int bt = varlen ? 0 : kb.b, bts = varlen ? 1 : a.batches;
  Tensor mK = domain_offset(make_coord(static_cast<int>(kb.k_row0), 0, 0, 0),
                            tma_k.get_tma_tensor(make_shape(a.skv, D, a.hkv, bts)));
  Tensor mV = domain_offset(make_coord(static_cast<int>(kb.k_row0), 0, 0, 0),
                            tma_v.get_tma_tensor(make_shape(a.skv, D, a.hkv, bts)));
  Tensor mQ = domain_offset(make_coord(static_cast<int>(kb.q_row0), 0, 0, 0),
                            tma_q.get_tma_tensor(make_shape(a.sq, D, a.hq, bts)));
  Tensor mdO = domain_offset(make_coord(static_cast<int>(kb.q_row0), 0, 0, 0),
                             tma_do.get_tma_tensor(make_shape(a.sq, D, a.hq, bts)));
  Tensor gK = local_tile(mK(_, _, hk, bt), Shape<Int<Bc>, Int<D>>{}, make_coord(_, 0));
  Tensor gV = local_tile(mV(_, _, hk, bt), Shape<Int<Bc>, Int<D>>{}, make_coord(_, 0));
  auto [tKg, tKs] =
      tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVg, tVs] =
      tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&kv_full, Cfg::kKVBytes);
  copy(tma_k.with(kv_full), tKg(_, kb.blk), tKs(_, 0));
  copy(tma_v.with(kv_full), tVg(_, kb.blk), tVs(_, 0));
  auto st = producer_start<Stages>();
  for (int it = 0; it < nm * group; ++it) {
    const int h = hk * group + it / nm, m = m_lo + it % nm;
    Tensor gQ = local_tile(mQ(_, _, h, bt), Shape<Int<Br>, Int<D>>{}, make_coord(_, 0));
    Tensor gdO = local_tile(mdO(_, _, h, bt), Shape<Int<Br>, Int<D>>{}, make_coord(_, 0));
    auto [tQg, tQs] =
        tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tdOg, tdOs] = tma_partition(tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                      group_modes<0, 2>(gdO));
    pipe.producer_acquire(st);
    auto* bar = pipe.producer_get_barrier(st);
    copy(tma_q.with(*bar), tQg(_, m), tQs(_, st.index()));
    copy(tma_do.with(*bar), tdOg(_, m), tdOs(_, st.index()));
    ++st;
  }
  pipe.producer_tail(st);
}

// Epilogue: the rows of dK and dV a thread's accumulators hold (tKVc: (key, column) of each
// element; zeros for keys no query sees, nothing past the sequence).
template <class T, class TC, class TAcc>
__device__ __forceinline__ void store_dk_dv(const BwdArgs& a, const KeyBlock& kb, int hk, int j0,
                                            const TC& tKVc, const TAcc& tdKrdK,
                                            const TAcc& tdVrdV) {
  const int bt = a.cu_q != nullptr ? 0 : kb.b;
  T* dk = static_cast<T*>(a.dk) + bt * a.dk_sb + hk * a.dk_sh;
  T* dv = static_cast<T*>(a.dv) + bt * a.dv_sb + hk * a.dv_sh;
  CUTE_UNROLL
  for (int e = 0; e < cute::size(tdVrdV); e += 2) {
    const int j = j0 + cute::get<0>(tKVc(e)), c = cute::get<1>(tKVc(e));
    if (j >= kb.skv) continue;
    *reinterpret_cast<uint32_t*>(dk + (kb.k_row0 + j) * a.dk_ss + c) =
        pack_pair<T>(tdKrdK(e), tdKrdK(e + 1));
    *reinterpret_cast<uint32_t*>(dv + (kb.k_row0 + j) * a.dv_ss + c) =
        pack_pair<T>(tdVrdV(e), tdVrdV(e + 1));
  }
}

// Host: the TMA loads of Q, dO (Br-row steps) and K, V (Bc-row blocks) of a kernel config.
template <class Cfg>
auto make_step_tmas(const BwdArgs& a) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  const int bt = a.cu_q != nullptr ? 1 : a.batches;
  auto tma_q = make_tma_load<1>(gmem_rows<T, false>(a.q, a.sq, D, a.hq, bt, a.q_ss, a.q_sh, a.q_sb),
                                typename Cfg::SmemQ{});
  auto tma_do =
      make_tma_load<1>(gmem_rows<T, false>(a.dout, a.sq, D, a.hq, bt, a.do_ss, a.do_sh, a.do_sb),
                       typename Cfg::SmemQ{});
  auto tma_k = make_tma_load<1>(
      gmem_rows<T, false>(a.k, a.skv, D, a.hkv, bt, a.k_ss, a.k_sh, a.k_sb), typename Cfg::SmemK{});
  auto tma_v = make_tma_load<1>(
      gmem_rows<T, false>(a.v, a.skv, D, a.hkv, bt, a.v_ss, a.v_sh, a.v_sb), typename Cfg::SmemK{});
  return cute::make_tuple(tma_q, tma_do, tma_k, tma_v);
}

// Host: one CTA per (Bc-key block, kv head, sequence); varlen grids add one spare block per
// sequence (find_key_block).
template <class Cfg>
dim3 key_block_grid(const BwdArgs& a) {
  const bool varlen = a.cu_q != nullptr;
  const unsigned kblocks = static_cast<unsigned>((a.skv + Cfg::Bc - 1) / Cfg::Bc);
  return dim3(varlen ? kblocks + a.batches : kblocks, a.hkv, varlen ? 1 : a.batches);
}

template <class Cfg, class TmaQ, class TmaK>
__global__ void __launch_bounds__(Cfg::Threads, 1)
    attention_bwd_dkdv_wgmma(const __grid_constant__ TmaQ tma_q,
                             const __grid_constant__ TmaQ tma_do,
                             const __grid_constant__ TmaK tma_k, const __grid_constant__ TmaK tma_v,
                             const __grid_constant__ BwdArgs a) {
  using namespace cute;
  using T = typename Cfg::T;
  constexpr int Bc = Cfg::Bc, Br = Cfg::Br, D = Cfg::D, Stages = Cfg::Stages;

  // The blocked convert kernel (a programmatic dependent, BwdArgs::kv_done) may be scheduled
  // once every CTA has started: it fills the SMs that the last key blocks leave idle.
  tile::allow_next_grid();
  KeyBlock kb;
  if (!find_key_block<Bc>(a, kb)) return;  // varlen grids have spare CTAs
  const int hk = kb.hk, group = a.hq / a.hkv;
  const int j0 = kb.blk * Bc;
  const int offset = kb.skv - kb.sq;
  int m_lo, nm;
  visible_query_blocks<Bc, Br>(a, kb, j0, m_lo, nm);
  const int iters = nm * group;

  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Cfg::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Cfg::SmemK{});
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout), typename Cfg::SmemQ{});

  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    // The descriptors' first use is the producer's first loads (part of the ~6 us per CTA
    // that a key block does not overlap, docs/attention_backward.md session 37).
    cute::prefetch_tma_descriptor(tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_v.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  auto pipe = make_tma_pipeline<Stages, 1>(smem.pipe, wg == 0, Cfg::kQBytes,
                                           Cfg::Consumers * kWarpgroupThreads);
  cluster_sync<1>();

  if (wg == 0) {  // ---- producer ----
    producer_registers<40>();
    const int pwarp = warp_in_warpgroup();  // before any divergence (a full-warp shuffle)
    if (pwarp == 0 && elect_one() && iters > 0) {
      produce_steps<Cfg>(tma_q, tma_do, tma_k, tma_v, a, kb, hk, group, m_lo, nm, smem.kv_full,
                         pipe, sK, sV, sQ, sdO);
    } else if (pwarp == 1) {
      if (iters > 0) {
        // dQ writer: each step's tile is one tile of the blocked workspace, added by one bulk
        // reduce-add once the consumers have stored it; handed back once the copy engine has
        // read it.
        const int lane = threadIdx.x % 32;
        const int64_t tile0 = dq_tile0(a, kb.b, kb.q_row0);
        // Tile it % DqTiles is added while the consumers write the others; tile it - DqTiles + 1
        // goes back to them once the copy engine has read it (DqTiles - 1 bulk groups in flight
        // behind the newest).
        constexpr int kTiles = Cfg::DqTiles;
        // Workspace tile of step it; with dq_tickets, its ticket is taken a step ahead (the
        // atomic's latency hides behind the wait for the consumers).
        auto ws_tile = [&](int it) {
          return (tile0 + m_lo + it % nm) * a.hq + hk * group + it / nm;
        };
        int ticket = 0;
        if (a.dq_tickets != nullptr && lane == 0) ticket = atomicAdd(a.dq_tickets + ws_tile(0), 1);
        for (int it = 0; it < iters; ++it) {
          const int64_t t = ws_tile(it);
          int64_t stored = -1;  // a tile this step stored first
          dq_barrier_sync<Cfg::DqBarrierThreads>(kDqFullBarrier0 + it % kTiles);
          if (lane == 0) {
            float* dst = a.dq_accum + t * int64_t{Br * D};
            const uint32_t bytes = Br * D * sizeof(float);
            if (a.dq_tickets == nullptr) {
              bulk_reduce_add_f32(dst, smem.dq[it % kTiles], bytes);
              bulk_commit();
            } else if (ticket == 0) {  // the first dQ of this tile: stored, published below
              bulk_store(dst, smem.dq[it % kTiles], bytes);
              bulk_commit();
              stored = t;
            } else {  // added once the first one is stored
              if (!(ticket & kDqTileReady)) {
                for (;;) {
                  int seen;
                  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];"
                               : "=r"(seen)
                               : "l"(a.dq_tickets + t)
                               : "memory");
                  if (seen & kDqTileReady) break;
                  __nanosleep(64);
                }
              }
              asm volatile("fence.proxy.async;" ::: "memory");  // before the reduce-add
              bulk_reduce_add_f32(dst, smem.dq[it % kTiles], bytes);
              bulk_commit();
            }
            if (a.dq_tickets != nullptr && it + 1 < iters)
              ticket = atomicAdd(a.dq_tickets + ws_tile(it + 1), 1);
            bulk_wait_read<kTiles - 1>();
          }
          __syncwarp();
          const int read = it - (kTiles - 1);      // the tile the copy engine has now read
          if (read >= 0 && read + kTiles < iters)  // step read + kTiles rewrites it
            dq_barrier_arrive<Cfg::DqBarrierThreads>(kDqEmptyBarrier0 + read % kTiles);
          if (stored >= 0) {  // lane 0: the others may add once the store is complete
            asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
            asm volatile("fence.proxy.async;" ::: "memory");
            asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(a.dq_tickets + stored),
                         "n"(kDqTileReady)
                         : "memory");
          }
        }
        if (lane == 0) bulk_wait_read<0>();  // the tiles outlive the copy engine's reads
        __syncwarp();
      }
      if (a.kv_done != nullptr) {
        dq_barrier_sync<kDoneBarrierThreads>(kDoneBarrier);
        if (threadIdx.x % 32 == 0) count_key_block_done(a.kv_done + kb.b * a.hkv + hk);
      }
    }
    return;
  }

  // ---- consumers ----
  consumer_registers<232>();
  const int ctid = consumer_thread();
  const int wgc = wg - 1;
  const int wtid = ctid % kWarpgroupThreads;
  typename Cfg::MmaSdP mma_sdp;
  typename Cfg::MmaKV mma_kv;
  typename Cfg::MmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_slice(ctid);
  auto thr_kv = mma_kv.get_slice(ctid);
  auto thr_dq = mma_dq.get_slice(Cfg::DqWgs == 2 ? ctid : wtid);
  Tensor sQt = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout), typename Cfg::SmemQt{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename Cfg::SmemKt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds), typename Cfg::SmemDS{});
  // dS^T goes to shared memory by stmatrix at D = 64, from the accumulator layout (per-element
  // stores of swizzled addresses cost ~6 instructions each).
  auto stsm_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, T>{}, mma_sdp);
  auto thr_stsm_ds = stsm_ds.get_thread_slice(ctid);
  Tensor tdSsdS = thr_stsm_ds.partition_D(
      make_tensor(make_smem_ptr(smem.ds), typename Cfg::SmemDSt{}));  // (CPY, M, N, 2)

  Tensor tSrK = thr_sdp.make_fragment_A(thr_sdp.partition_A(sK));    // (MMA, 1, D/16, 1)
  Tensor tSrV = thr_sdp.make_fragment_A(thr_sdp.partition_A(sV));    // (MMA, 1, D/16, 1)
  Tensor tSrQ = thr_sdp.make_fragment_B(thr_sdp.partition_B(sQ));    // (MMA, 1, D/16, Stages)
  Tensor tSrdO = thr_sdp.make_fragment_B(thr_sdp.partition_B(sdO));  // (MMA, 1, D/16, Stages)
  Tensor tKVrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt));   // (MMA, 1, Br/16, Stages)
  Tensor tKVrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt));
  Tensor tdQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS));  // (MMA, 1, Bc/16, 2)
  Tensor tdQrK = thr_dq.make_fragment_B(thr_dq.partition_B(sKt));   // (MMA, 1, Bc/16, 1)

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<Bc>, Int<Br>>{});  // ((2,2,Br/8),1,1)
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<Bc>, Int<Br>>{});
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<Int<Bc>, Int<D>>{});  // ((2,2,D/8),1,1)
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<Int<Bc>, Int<D>>{});
  // P^T / dS^T as A operands of the RS WGMMAs (see attention_fwd_kernel.cuh: the accumulator
  // (col pair, row half, 8-col group) regrouped by 16-wide k blocks).
  Tensor tKVrP = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<Br / 16>>>{});
  Tensor tKVrdS = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<Br / 16>>>{});
  static_assert(size(tSrS) == Br / 2 && size(tdVrdV) == D / 2, "64xN fp32 accumulators");

  // Per-thread parts of the swizzled dS^T store addresses (D = 128, see there).
  const int ds_lane = wtid % 32, ds_rq = ds_lane / 4;
  char* const ds_bytes = reinterpret_cast<char*>(smem.ds) + (8 * wgc + 2 * (wtid / 32)) * 1024 +
                         ds_rq * 128 + 4 * (ds_lane % 4);
  const int ds_xor = ds_rq * 16;
  // (key, query) / (key, column) / (query, column) of every accumulator element.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<Bc>, Int<Br>>{}));
  Tensor tKVc = thr_kv.partition_C(make_identity_tensor(Shape<Int<Bc>, Int<D>>{}));

  CUTE_UNROLL
  for (int i = 0; i < size(tdVrdV); ++i) tdVrdV(i) = tdKrdK(i) = 0.f;

  const bool capped = a.softcap > 0.f;
  const float mult = a.scale * kLog2e, cap_in = capped ? a.scale / a.softcap : 0.f;

  if (iters > 0) {
    PipeState<Stages> st;
    mma_kv.accumulate_ = GMMA::ScaleOut::One;
    // lse and delta of a step's rows, one row per thread (one shared copy by step parity:
    // warpgroup 0 stores lse, 1 delta), loaded two steps ahead and stored one step ahead, before
    // the dS barrier that every consumer thread passes each step: no load latency and no extra
    // barrier in a step. Raw values (rows past the sequence: lse = -inf, delta = 0) are
    // converted when stored: lse in log2 units (+inf where the row sees nothing: P = 0),
    // delta times the scale.
    auto load_rows = [&](int step, float& lse, float& delta) {
      lse = -INFINITY, delta = 0.f;
      const int hs = hk * group + step / nm, is = (m_lo + step % nm) * Br + wtid;
      if (step < iters && wtid < Br && is < kb.sq) {
        const int64_t at = kb.b * a.lse_sb + hs * a.lse_sh + kb.q_row0 + is;
        lse = a.lse[at];
        delta = a.delta[at];
      }
    };
    auto store_rows = [&](int buf, float lse, float delta) {
      if (wtid < Br) {
        if (wgc == 0)
          smem.lse2[buf][wtid] = lse == -INFINITY ? INFINITY : lse * kLog2e;
        else
          smem.delta[buf][wtid] = delta * a.scale;
      }
    };
    float lse_raw, delta_raw;
    load_rows(0, lse_raw, delta_raw);
    store_rows(0, lse_raw, delta_raw);
    load_rows(1, lse_raw, delta_raw);
    named_barrier_sync(kRowsBarrier);  // both warpgroups
    // K / V only now: the rows' L2 round trip above overlaps their load (+1.4 %, session 37).
    cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_full, 0);
    for (int it = 0; it < iters; ++it) {
      const int m = m_lo + it % nm;
      const int i0 = m * Br;
      const int par = it % 2;
      pipe.consumer_wait(st);
      const int s = st.index();
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tSrdP);
      warpgroup_arrive();
      mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrK); ++k) {
        cute::gemm(mma_sdp, tSrK(_, _, k, 0), tSrQ(_, _, k, s), tSrS);
        mma_sdp.accumulate_ = GMMA::ScaleOut::One;
      }
      mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrV); ++k) {
        cute::gemm(mma_sdp, tSrV(_, _, k, 0), tSrdO(_, _, k, s), tSrdP);
        mma_sdp.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tSrdP);

      // P^T and dS^T in place (fp32), masked only on blocks that straddle a boundary.
      const bool need_mask = j0 + Bc > kb.skv ||
                             (a.window_right >= 0 && j0 + Bc - 1 > i0 + offset + a.window_right) ||
                             (a.window_left >= 0 && j0 < i0 + Br - 1 + offset - a.window_left);
      const float* l2s = smem.lse2[par];
      const float* dls = smem.delta[par];  // scale * delta (see the row loads above)
      // Straight-line code per (soft-cap, mask) case: a per-element branch on either (as the
      // single loop compiled) made ~3x the instructions of the common, unmasked path.
      auto probs_and_ds = [&](auto capped_c, auto masked_c) {
        constexpr bool kCapped = decltype(capped_c)::value, kMasked = decltype(masked_c)::value;
        CUTE_UNROLL
        for (int e = 0; e < size(tSrS); ++e) {
          const int jl = get<0>(tScS(e)), il = get<1>(tScS(e));
          float p;
          // dS = P (dP - delta) s' = P (scale dP - scale delta) (s' / scale)
          float ds = fmaf(tSrdP(e), a.scale, -dls[il]);
          if constexpr (kCapped) {
            const float th = tanhf(tSrS(e) * cap_in);
            p = tile::exp2_ftz(fmaf(a.softcap * th, kLog2e, -l2s[il]));
            ds *= 1.f - th * th;
          } else {
            p = tile::exp2_ftz(fmaf(tSrS(e), mult, -l2s[il]));
          }
          if constexpr (kMasked) {
            const int i = i0 + il, j = j0 + jl;
            bool vis = j < kb.skv;
            if (a.window_right >= 0) vis = vis && j <= i + offset + a.window_right;
            if (a.window_left >= 0) vis = vis && j >= i + offset - a.window_left;
            if (!vis) p = 0.f;
          }
          tSrS(e) = p;
          tSrdP(e) = p * ds;
        }
      };
      using False = cute::false_type;
      using True = cute::true_type;
      if (capped) {
        if (need_mask)
          probs_and_ds(True{}, True{});
        else
          probs_and_ds(True{}, False{});
      } else if (need_mask) {
        probs_and_ds(False{}, True{});
      } else {
        probs_and_ds(False{}, False{});
      }
      // Round to T as the A operands, and dS^T into shared memory (query pairs: 4 bytes).
      CUTE_UNROLL
      for (int g = 0; g < Br / 8; ++g) CUTE_UNROLL
      for (int i1 = 0; i1 < 2; ++i1) CUTE_UNROLL
      for (int i0p = 0; i0p < 2; ++i0p) {
        const auto e = make_coord(make_coord(i0p, i1, g), 0, 0);
        const auto ea = make_coord(make_coord(i0p, i1, g % 2), 0, g / 2);
        tKVrP(ea) = static_cast<T>(tSrS(e));
        tKVrdS(ea) = static_cast<T>(tSrdP(e));
      }
      if constexpr (D == 64) {
        // The A-operand regrouping keeps the accumulator's register order (index i0p + 2 i1 +
        // 4 g in both), so the same registers viewed in the accumulator layout feed stmatrix.
        cute::copy(stsm_ds, thr_stsm_ds.retile_S(make_tensor(tKVrdS.data(), tSrdP.layout())),
                   tdSsdS(_, _, _, par));
      } else {  // D = 128: stmatrix's addressing made ptxas serialize the WGMMAs (C7512)
        // Element (q, key) of the MN-major 128B-swizzled tile lives at byte (key / 8) 1024 +
        // (key % 8) 128 + ((q / 8) ^ (key % 8)) 16 + (q % 8) 2 of the buffer; with key = 64 wgc
        // + 16 warp + lane / 4 + 8 i1 and q = 2 (lane % 4) + 8 g + {0, 1} (the accumulator's
        // layout) that is a per-thread base, a constant and one XOR. (cute's sdS(q, key) kept
        // 16 generic 64-bit addresses live across the loop: ST.E stores and spills.)
        char* const ds_row = ds_bytes + par * (Br * Bc * int(sizeof(T)));
        CUTE_UNROLL
        for (int g = 0; g < Br / 8; ++g) CUTE_UNROLL
        for (int i1 = 0; i1 < 2; ++i1) {
          const int e = 2 * i1 + 4 * g;
          *reinterpret_cast<uint32_t*>(ds_row + i1 * 1024 + ((g * 16) ^ ds_xor)) =
              pack_pair<T>(tSrdP(e), tSrdP(e + 1));
        }
      }

      warpgroup_fence_operand(tKVrP);
      warpgroup_fence_operand(tKVrdS);
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < Br / 16; ++k)
        cute::gemm(mma_kv, tKVrP(_, _, k), tKVrdOt(_, _, k, s), tdVrdV);
      CUTE_UNROLL
      for (int k = 0; k < Br / 16; ++k)
        cute::gemm(mma_kv, tKVrdS(_, _, k), tKVrQt(_, _, k, s), tdKrdK);
      warpgroup_commit_batch();

      // dQ = dS K once both warpgroups' dS^T are in shared memory (generic-proxy writes made
      // visible to the WGMMA's async proxy first).
      store_rows(par ^ 1, lse_raw, delta_raw);  // the next step's rows (see load_rows)
      load_rows(it + 2, lse_raw, delta_raw);
      cutlass::arch::fence_view_async_shared();
      named_barrier_sync(kDsBarrier);
      if (Cfg::DqWgs == 1 && wgc != it % 2) {  // the other warpgroup computes this dQ
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdVrdV);
        warpgroup_fence_operand(tdKrdK);
        pipe.consumer_release(st);
        ++st;
        continue;
      }
      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<Br>, Int<D>>{});
      warpgroup_fence_operand(tdQrdQ);
      warpgroup_arrive();
      mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tdQrdS); ++k) {
        cute::gemm(mma_dq, tdQrdS(_, _, k, par), tdQrK(_, _, k, 0), tdQrdQ);
        mma_dq.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      warpgroup_fence_operand(tdQrdQ);
      pipe.consumer_release(st);
      ++st;

      // The tile in the blocked order (attention_bwd.cuh): accumulator elements 4k .. 4k+3 of
      // thread t of the computing warpgroup as one float4 at float 4 (t + 128 k) of its
      // 64-column chunk (conflict-free 16-byte stores).
      if (it >= Cfg::DqTiles)  // the copy engine has read step it - DqTiles's tile
        dq_barrier_sync<Cfg::DqBarrierThreads>(kDqEmptyBarrier0 + it % Cfg::DqTiles);
      float4* const dq_chunk = reinterpret_cast<float4*>(smem.dq[it % Cfg::DqTiles] +
                                                         (Cfg::DqWgs == 2 ? wgc : 0) * (Br * 64)) +
                               wtid;
      CUTE_UNROLL
      for (int k = 0; k < size(tdQrdQ) / 4; ++k)
        dq_chunk[kWarpgroupThreads * k] =
            make_float4(tdQrdQ(4 * k), tdQrdQ(4 * k + 1), tdQrdQ(4 * k + 2), tdQrdQ(4 * k + 3));
      cutlass::arch::fence_view_async_shared();  // visible to the copy engine
      dq_barrier_arrive<Cfg::DqBarrierThreads>(kDqFullBarrier0 + it % Cfg::DqTiles);
    }
  }

  // ---- epilogue: dK, dV rows of this warpgroup's keys (zeros for keys no query sees) ----
  store_dk_dv<T>(a, kb, hk, j0, tKVc, tdKrdK, tdVrdV);
  if (a.kv_done != nullptr) dq_barrier_arrive<kDoneBarrierThreads>(kDoneBarrier);
}

template <class T, int D>
void launch(const BwdArgs& a, cudaStream_t stream) {
  using Cfg = BwdConfig<T, D>;
  auto [tma_q, tma_do, tma_k, tma_v] = make_step_tmas<Cfg>(a);
  auto kernel = attention_bwd_dkdv_wgmma<Cfg, decltype(tma_q), decltype(tma_k)>;
  static bool configured = false;  // per instantiation: the attribute outlives the call
  if (!configured) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Cfg::kSmemBytes));
    if (err != cudaSuccess) return;  // the launch check reports it
    configured = true;
  }
  kernel<<<key_block_grid<Cfg>(a), Cfg::Threads, Cfg::kSmemBytes, stream>>>(tma_q, tma_do, tma_k,
                                                                            tma_v, a);
}

}  // namespace bwd_wgmma

template <class T>
void launch_bwd_wgmma_typed(const BwdArgs& a, cudaStream_t stream) {
  if (a.d == 64)
    bwd_wgmma::launch<T, 64>(a, stream);
  else
    bwd_wgmma::launch<T, 128>(a, stream);
}

}  // namespace tessel::attention_detail
