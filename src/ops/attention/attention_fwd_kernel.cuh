// Hopper attention forward (FlashAttention-style), TMA + WGMMA, warp-specialized.
//
// One CTA per (BM-row query block, q head, sequence) - or, for padded batches of more blocks
// than SMs, one persistent CTA per SM that takes blocks from a ticket counter (see the
// kernel) - with 1 producer + 2 consumer warpgroups (BM = 128; D = 64: 3 consumers, BM = 192):
//   producer : one elected thread TMA-loads the (BM x D) Q tile (own mbarrier), then
//              walks the visible key tiles right to left, loading each (BN x D) K tile and
//              V tile into one stage of a Stages-deep ring (tile/sm90/pipeline.cuh).
//   consumers: warpgroup w owns query rows 64w .. 64w+63. Per key tile:
//                S = Q K^T           WGMMA, both operands in shared memory (SS)
//                softcap, mask       only on tiles that straddle a boundary (the causal /
//                                    window diagonal, the end of the keys)
//                online softmax      row max over the quad, exp2 with the scale folded into
//                                    one FFMA, running sums per thread (reduced at the end)
//                O += P V            P converted to T in registers; WGMMA with A from
//                                    registers (RS), V read MN-major from shared memory
//              then O / l (sinks joined in log2 space), written straight from registers.
// Schedule (D = 64, 128; 3+ stages): tile n's QK^T is issued with tile n+1's PV (keys run
// right to left), so the softmax of n overlaps that PV; the warpgroups take turns issuing
// (named-barrier ping-pong ring). D = 256 (2 stages) runs the steps in order.
// Varlen: each CTA finds its sequence by a scan of cu_seqlens_q; the TMA views are shifted
// by the sequence's first row (domain_offset); rows past the end belong to the next
// sequence or are zero-filled by TMA and are masked (keys) or not stored (queries).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <cute/tensor.hpp>

#include "ops/attention/attention_fwd.cuh"
#include "runtime/workspace.hpp"
#include "tile/sm90/pipeline.cuh"
#include "tile/sm90/tma.cuh"
#include "tile/sm90/warpgroup.cuh"
#include "tile/sm90/wgmma.cuh"
#include "tile/tile.cuh"

namespace tessel::attention_detail {

using namespace tessel::tile::sm90;

// Consumers: 2 consumer warpgroups (BM = 128), or 3 (BM = 192) as FlashAttention-3 does at
// D = 64, where the per-tile softmax (one ex2 per logit against 4·D flops of MMA: MUFU and
// tensor cores equally loaded) needs a third warpgroup to keep the tensor cores fed; the
// register file then allows 160 per consumer, so BN drops to 128 (S 64 + P 32 + O 32).
template <class T_, int D_, int Consumers_ = 2>
struct FwdConfig {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int Consumers = Consumers_;
  static_assert(Consumers == 2 || (Consumers == 3 && D == 64), "3 consumers at D = 64 only");
  static constexpr int BM = 64 * Consumers;  // 64 query rows per consumer warpgroup
  static constexpr int BN = D == 256 ? 64 : D == 128 ? 128 : Consumers == 3 ? 128 : 192;
  static constexpr int Stages = D == 256 ? 2 : D == 128 ? 3 : Consumers == 3 ? 5 : 4;
  // The overlapped schedule holds two stages per consumer; with 2 the loads would serialize.
  static constexpr bool kOverlap = Stages >= 3;
  static constexpr int Threads = kWarpgroupThreads * (1 + Consumers);
  // setmaxnreg split of the CTA's registers (the launch gives 65536 / Threads each).
  static constexpr int kProducerRegs = Consumers == 3 ? 32 : 40;
  static constexpr int kConsumerRegs = Consumers == 3 ? 160 : 232;
  // Lazy O rescale (kRescaleLog2) at D >= 128, where the rescale is D / 2 multiplies per
  // thread and tile (H100, same call: D128 +1.5 % non-causal, +3 % causal; D64 -1 %, noise).
  static constexpr bool kLazyRescale = D >= 128;
  using SmemQ = SmemLayout<T, Major::K, BM, D, 1>;        // (BM, D, 1)
  using SmemK = SmemLayout<T, Major::K, BN, D, Stages>;   // (BN, D, Stages)
  using SmemV = SmemLayout<T, Major::MN, D, BN, Stages>;  // (D, BN, Stages): V^T, N = D
  using MmaQK = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<BN>, cute::Int<D>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::Int<Consumers>, cute::_1, cute::_1>>{}));
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<D>, cute::Int<BN>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<Consumers>, cute::_1, cute::_1>>{}));
  using Pipeline = TmaPipeline<Stages>;
  struct Smem {
    alignas(1024) T q[cute::cosize_v<SmemQ>];
    alignas(1024) T k[cute::cosize_v<SmemK>];
    alignas(1024) T v[cute::cosize_v<SmemV>];
    alignas(16) typename Pipeline::SharedStorage pipe;
    alignas(8) uint64_t q_full;
    alignas(8) uint64_t q_empty;
    int ticket;  // persistent schedule: the block whose Q q_full announces (-1: none left)
  };
  static constexpr uint32_t kQBytes = stage_bytes<T, SmemQ>;
  static constexpr uint32_t kKVBytes = stage_bytes<T, SmemK> + stage_bytes<T, SmemV>;
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

// Named barriers of the ping-pong schedule (0 is __syncthreads): warpgroup w waits on
// kPingPongBarrier0 + w, which the previous warpgroup (cyclically) arrives at after issuing
// its WGMMAs; each barrier joins one syncing and one arriving warpgroup (256 threads).
constexpr int kPingPongBarrier0 = 1;
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}

constexpr float kLog2e = 1.4426950408889634f;
// Online softmax: the running row max is raised only when a tile's max exceeds it by more
// than this (log2 units), so that most tiles skip the rescale of O.
constexpr float kRescaleLog2 = 8.f;

constexpr float kLn2 = 0.6931471805599453f;

// The query block this CTA computes: sequence b, block m, its first q / key rows and lengths.
struct Block {
  int b = 0, m = 0;
  int64_t q_row0 = 0, k_row0 = 0;
  int sq = 0, skv = 0;
};

// Block (x, z) of the virtual grid (tiles_x, Hq, batches or 1).
template <int BM>
__device__ __forceinline__ bool find_block(const FwdArgs& a, int x, int z, Block& blk) {
  if (a.cu_q == nullptr) {
    blk.b = z;
    blk.m = a.tiles_x - 1 - x;  // longest (causal) blocks first
    blk.sq = a.sq;
    blk.skv = a.skv;
    return true;
  }
  int id = x;
  for (int b = 0; b < a.batches; ++b) {
    const int q0 = a.cu_q[b], q1 = a.cu_q[b + 1];
    const int nb = (q1 - q0 + BM - 1) / BM;
    if (id < nb) {
      blk.b = b;
      blk.m = id;
      blk.q_row0 = q0;
      blk.k_row0 = a.cu_k[b];
      blk.sq = q1 - q0;
      blk.skv = a.cu_k[b + 1] - a.cu_k[b];
      return true;
    }
    id -= nb;
  }
  return false;
}

// Key tiles [lo, hi) that hold a visible key for some row of query block m.
template <int BM, int BN>
__device__ __forceinline__ void key_tile_range(const FwdArgs& a, const Block& blk, int& lo,
                                               int& hi) {
  const int offset = blk.skv - blk.sq;
  int end = blk.skv;  // one past the last visible key
  if (a.window_right >= 0) end = min(end, (blk.m + 1) * BM - 1 + offset + a.window_right + 1);
  int begin = 0;
  if (a.window_left >= 0) begin = max(0, blk.m * BM + offset - a.window_left);
  hi = end > 0 ? (end + BN - 1) / BN : 0;
  lo = min(begin / BN, hi);
}

// How a CTA finds its query blocks.
enum class Sched {
  one,         // one block per CTA (blockIdx)
  persistent,  // one CTA per SM; blocks from a ticket counter (FwdArgs::sched)
};

// Persistent schedule: ticket t -> the virtual grid's (x, rr). Sections of sched_groups
// (head, batch) pairs, whose K/V stay in L2 while the section runs; within one, x-major, so
// x = 0 (the longest block under causal masks) of every pair first: the CTAs that take the
// last tickets get the shortest blocks, and the kernel ends nearly level.
__device__ __forceinline__ void ticket_block(const FwdArgs& a, int t, int& x, int& rr) {
  const int groups = a.hq * a.batches;
  const int per_section = a.sched_groups * a.tiles_x;
  const int section = t / per_section, r = t - section * per_section;
  const int in_section = min(a.sched_groups, groups - section * a.sched_groups);
  x = r / in_section;
  rr = section * a.sched_groups + (r - x * in_section);
}

// Sched::one keeps its own instantiation: the one-block kernel keeps its registers for the
// tile loop.
template <class Cfg, Sched kSched, class TmaQ, class TmaK, class TmaV>
__global__ void __launch_bounds__(Cfg::Threads, 1)
    attention_fwd_kernel(const __grid_constant__ TmaQ tma_q, const __grid_constant__ TmaK tma_k,
                         const __grid_constant__ TmaV tma_v, const __grid_constant__ FwdArgs a) {
  using namespace cute;
  using T = typename Cfg::T;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, D = Cfg::D, Stages = Cfg::Stages;

  // Persistent: the CTA runs query blocks one after another. The K/V ring runs on into the
  // next block; its Q is loaded once the consumers' last QK^T of the previous one has
  // completed (q_empty), while they finish that block's PV and epilogue, so a block's fixed
  // costs (Q and first K/V loads, the first tile without overlap, the last PV, the epilogue)
  // overlap its neighbours' work.
  constexpr bool Persistent = kSched == Sched::persistent;
  const bool varlen = a.cu_q != nullptr;
  // The block of ticket t: its block, q head and the visible key tiles [n_lo, n_hi); false:
  // no such block (varlen grids have spare CTAs; persistent grids are padded batches only).
  auto decode = [&](int t, Block& blk, int& h, int& n_lo, int& n_hi) {
    int x, rr;
    if constexpr (Persistent) {
      ticket_block(a, t, x, rr);
    } else {
      x = t % a.tiles_x;
      rr = t / a.tiles_x;
    }
    h = rr % a.hq;
    if (!find_block<BM>(a, x, rr / a.hq, blk)) return false;
    key_tile_range<BM, BN>(a, blk, n_lo, n_hi);
    return true;
  };
  // Sched::one: the one ticket blockIdx.x.
  const int total_tickets = Persistent ? a.tiles_x * a.hq * a.batches : blockIdx.x + 1;

  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Cfg::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Cfg::SmemV{});

  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&smem.q_full, 1);
    cutlass::arch::ClusterBarrier::init(&smem.q_empty, Cfg::Consumers * kWarpgroupThreads);
    smem.ticket = -1;
    cutlass::arch::fence_barrier_init();
  }
  auto pipe = make_tma_pipeline<Stages, 1>(smem.pipe, wg == 0, Cfg::kKVBytes,
                                           Cfg::Consumers * kWarpgroupThreads);
  cluster_sync<1>();

  if (wg == 0) {  // ---- producer ----
    producer_registers<Cfg::kProducerRegs>();
    if (warp_in_warpgroup() == 0 && elect_one()) {
      auto st = producer_start<Stages>();
      int loaded = 0;  // blocks announced on q_full (its and q_empty's phases)
      for (int ticket = blockIdx.x; ticket < total_tickets;) {
        Block blk;
        int h, n_lo, n_hi;
        int next_ticket = total_tickets;
        // The next ticket is fetched now and used once this block's loads are issued.
        if constexpr (Persistent) next_ticket = static_cast<int>(gridDim.x) + atomicAdd(a.sched, 1);
        if (!decode(ticket, blk, h, n_lo, n_hi) || (!Persistent && n_hi <= n_lo)) break;
        const int hk = h / (a.hq / a.hkv), bt = varlen ? 0 : blk.b;
        Tensor mQ =
            domain_offset(make_coord(static_cast<int>(blk.q_row0), 0, 0, 0),
                          tma_q.get_tma_tensor(make_shape(a.sq, D, a.hq, varlen ? 1 : a.batches)));
        Tensor mK = domain_offset(
            make_coord(static_cast<int>(blk.k_row0), 0, 0, 0),
            tma_k.get_tma_tensor(make_shape(a.skv, D, a.hkv, varlen ? 1 : a.batches)));
        Tensor mV = domain_offset(
            make_coord(0, static_cast<int>(blk.k_row0), 0, 0),
            tma_v.get_tma_tensor(make_shape(D, a.skv, a.hkv, varlen ? 1 : a.batches)));
        Tensor gQ = local_tile(mQ(_, _, h, bt), Shape<Int<BM>, Int<D>>{}, make_coord(blk.m, 0));
        Tensor gK = local_tile(mK(_, _, hk, bt), Shape<Int<BN>, Int<D>>{}, make_coord(_, 0));
        Tensor gV = local_tile(mV(_, _, hk, bt), Shape<Int<D>, Int<BN>>{}, make_coord(0, _));
        auto [tQg, tQs] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
        auto [tKg, tKs] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
        auto [tVg, tVs] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));
        // The first K/V tile may go out before Q's buffer is free; Q waits for q_empty.
        int n = n_hi - 1;
        if (Persistent && n_hi <= n_lo) {  // no visible key: the consumers write the empty rows
          if (loaded > 0) cutlass::arch::ClusterBarrier::wait(&smem.q_empty, (loaded - 1) & 1);
          smem.ticket = ticket;
          cutlass::arch::ClusterBarrier::arrive(&smem.q_full);
          ++loaded;
          ticket = next_ticket;
          continue;
        }
        if (Persistent && loaded > 0) {
          pipe.producer_acquire(st);
          auto* bar = pipe.producer_get_barrier(st);
          copy(tma_k.with(*bar), tKg(_, n), tKs(_, st.index()));
          copy(tma_v.with(*bar), tVg(_, n), tVs(_, st.index()));
          ++st;
          --n;
          cutlass::arch::ClusterBarrier::wait(&smem.q_empty, (loaded - 1) & 1);
        }
        if constexpr (Persistent) smem.ticket = ticket;  // published by q_full's arrive
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full, Cfg::kQBytes);
        copy(tma_q.with(smem.q_full), tQg, tQs(_, 0));
        for (; n >= n_lo; --n) {
          pipe.producer_acquire(st);
          auto* bar = pipe.producer_get_barrier(st);
          copy(tma_k.with(*bar), tKg(_, n), tKs(_, st.index()));
          copy(tma_v.with(*bar), tVg(_, n), tVs(_, st.index()));
          ++st;
        }
        ++loaded;
        ticket = next_ticket;
      }
      if constexpr (Persistent) {
        // No more tickets: tell the consumers (ticket -1), then the last CTA to finish zeroes
        // the counters for the next launch on this stream (the workspace's contract).
        if (loaded > 0) cutlass::arch::ClusterBarrier::wait(&smem.q_empty, (loaded - 1) & 1);
        smem.ticket = -1;
        cutlass::arch::ClusterBarrier::arrive(&smem.q_full);
        __threadfence();
        if (atomicAdd(a.sched + 1, 1) == static_cast<int>(gridDim.x) - 1) {
          a.sched[0] = 0;
          a.sched[1] = 0;
        }
      }
      pipe.producer_tail(st);
    }
    return;
  }

  // ---- consumers ----
  consumer_registers<Cfg::kConsumerRegs>();
  const int ctid = consumer_thread();
  const int wgc = wg - 1;
  const int lane = threadIdx.x % 32, warp = warp_in_warpgroup();
  typename Cfg::MmaQK mma_qk;
  typename Cfg::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_slice(ctid);
  auto thr_pv = mma_pv.get_slice(ctid);
  Tensor tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ));           // (MMA, 1, D/16, 1)
  Tensor tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK));           // (MMA, 1, D/16, Stages)
  Tensor tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV));           // (MMA, 1, BN/16, Stages)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<BM>, Int<BN>>{});  // ((2,2,BN/8),1,1)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<BM>, Int<D>>{});   // ((2,2,D/8),1,1)
  // P as the A operand of the RS WGMMA: the accumulator's (col pair, row half, 8-col group)
  // regrouped as ((col pair, row half, 8-col half of a 16-wide k block), 1, k block).
  Tensor tOrP = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<BN / 16>>>{});
  static_assert(size(tSrS) == BN / 2 && size(tOrO) == D / 2, "64xN fp32 accumulator fragments");
  auto S = [&](int i0, int i1, int g) -> float& {
    return tSrS(make_coord(make_coord(i0, i1, g), 0, 0));
  };
  auto O = [&](int i0, int i1, int g) -> float& {
    return tOrO(make_coord(make_coord(i0, i1, g), 0, 0));
  };

  // Logits in "s units": raw q.k (no softcap: t = s * mult is the log2-domain logit) or
  // the soft-capped logit itself (mult = log2 e).
  const bool capped = a.softcap > 0.f;
  const float mult = capped ? kLog2e : a.scale * kLog2e;
  const float cap_in = capped ? a.scale / a.softcap : 0.f;
  const int col_lane = 2 * (lane % 4);  // + 8 * g + i0

  // Ping-pong: the warpgroups take turns (cyclically) issuing their WGMMAs (named barriers),
  // so one's softmax lines up with the others' GEMMs instead of all contending at once. Every
  // warpgroup has the same number of turns per tile, so the ring runs on across tiles.
  constexpr int C = Cfg::Consumers;
  const bool pingpong = Cfg::kOverlap && a.pingpong;
  const int pp_next = kPingPongBarrier0 + (wgc + 1) % C;
  if (pingpong && wgc == C - 1) named_barrier_arrive(kPingPongBarrier0);  // warpgroup 0 first
  PipeState<Stages> st;
  int loaded = 0;

  for (int k = 0; Persistent || k < 1; ++k) {
    Block blk;
    int h, n_lo, n_hi;
    if constexpr (Persistent) {
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.q_full, loaded & 1);
      const int ticket = *static_cast<volatile int*>(&smem.ticket);
      if (ticket < 0) break;
      decode(ticket, blk, h, n_lo, n_hi);
      if (n_hi <= n_lo) {  // Q was not loaded; the producer reuses its buffer after this
        cutlass::arch::ClusterBarrier::arrive(&smem.q_empty);
        ++loaded;
      }
    } else if (!decode(blockIdx.x, blk, h, n_lo, n_hi)) {
      break;
    }
    const int offset = blk.skv - blk.sq;
    const int row_base = blk.m * BM + wgc * 64 + warp * 16 + lane / 4;  // + 8 * i1

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;

    if (n_hi > n_lo) {
      if constexpr (!Persistent)  // (persistent: waited above, before the ticket was read)
        cutlass::arch::ClusterTransactionBarrier::wait(&smem.q_full, 0);
      const int row_lo = blk.m * BM, row_hi = blk.m * BM + BM - 1;
      auto issue_qk = [&](int stage) {
        mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
        warpgroup_fence_operand(tSrS);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
          cute::gemm(mma_qk, tSrQ(_, _, kb, 0), tSrK(_, _, kb, stage), tSrS);
          mma_qk.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
      };
      auto issue_pv = [&](int stage) {
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kb = 0; kb < BN / 16; ++kb)
          cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb, stage), tOrO);
        warpgroup_commit_batch();
      };
      // Softcap, mask and online softmax of key tile n in place (S becomes P, fp32); the O
      // rescale factors go to alpha (applied once the PV WGMMA reading O has finished).
      auto softmax = [&](int n, float(&alpha)[2]) {
        if (capped) {
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) tSrS(i) = a.softcap * tanhf(tSrS(i) * cap_in);
        }
        const int col0 = n * BN;
        const bool need_mask =
            col0 + BN > blk.skv ||
            (a.window_right >= 0 && col0 + BN - 1 > row_lo + offset + a.window_right) ||
            (a.window_left >= 0 && col0 < row_hi + offset - a.window_left);
        if (need_mask) {
          CUTE_UNROLL
          for (int i1 = 0; i1 < 2; ++i1) {
            const int row = row_base + 8 * i1;
            int c_end = blk.skv;  // visible cols [c_begin, c_end)
            if (a.window_right >= 0) c_end = min(c_end, row + offset + a.window_right + 1);
            // Limits relative to this thread's first column, so that each element is one compare
            // of its compile-time offset 8g + i0 (+ a select): the softmax is issue-bound.
            const int hi = c_end - col0 - col_lane;
            if (a.window_left < 0) {  // causal / padding: the upper limit only
              CUTE_UNROLL
              for (int g = 0; g < BN / 8; ++g) CUTE_UNROLL
              for (int i0 = 0; i0 < 2; ++i0)
                if (8 * g + i0 >= hi) S(i0, i1, g) = -INFINITY;
            } else {
              const int lo = row + offset - a.window_left - col0 - col_lane;
              CUTE_UNROLL
              for (int g = 0; g < BN / 8; ++g) CUTE_UNROLL
              for (int i0 = 0; i0 < 2; ++i0)
                if (8 * g + i0 >= hi || 8 * g + i0 < lo) S(i0, i1, g) = -INFINITY;
            }
          }
        }
        CUTE_UNROLL
        for (int i1 = 0; i1 < 2; ++i1) {
          float mx = m_run[i1];
          CUTE_UNROLL
          for (int g = 0; g < BN / 8; ++g) mx = fmaxf(mx, fmaxf(S(0, i1, g), S(1, i1, g)));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // The running max moves only when the new one exceeds it by more than 2^8 in the
          // exponent (P <= 256 otherwise: fine for 16-bit P and fp32 sums; l and O share the
          // stale max, so O / l is unchanged). Most tiles then skip the O rescale. (-inf - -inf
          // is NaN: no move.)
          if (Cfg::kLazyRescale && !((mx - m_run[i1]) * mult > kRescaleLog2)) mx = m_run[i1];
          alpha[i1] = mx == m_run[i1] ? 1.f : tile::exp2_ftz((m_run[i1] - mx) * mult);
          const float m_scaled = mx == -INFINITY ? 0.f : mx * mult;
          float sum = 0.f;
          CUTE_UNROLL
          for (int g = 0; g < BN / 8; ++g) CUTE_UNROLL
          for (int i0 = 0; i0 < 2; ++i0) {
            const float p = tile::exp2_ftz(fmaf(S(i0, i1, g), mult, -m_scaled));
            S(i0, i1, g) = p;
            sum += p;
          }
          l_run[i1] = l_run[i1] * alpha[i1] + sum;
          m_run[i1] = mx;
        }
      };
      auto rescale_and_convert = [&](const float(&alpha)[2]) {
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // warp-uniform
          CUTE_UNROLL
          for (int i1 = 0; i1 < 2; ++i1) CUTE_UNROLL
          for (int g = 0; g < D / 8; ++g) {
            O(0, i1, g) *= alpha[i1];
            O(1, i1, g) *= alpha[i1];
          }
        }
        CUTE_UNROLL
        for (int g = 0; g < BN / 8; ++g) CUTE_UNROLL
        for (int i1 = 0; i1 < 2; ++i1) CUTE_UNROLL
        for (int i0 = 0; i0 < 2; ++i0)
          tOrP(make_coord(make_coord(i0, i1, g % 2), 0, g / 2)) = static_cast<T>(S(i0, i1, g));
      };

      // Overlap (Stages >= 3): tile n's QK^T is issued together with the previous tile's PV,
      // and tile n's softmax runs while that PV is in flight (one stage stays held for it).
      mma_pv.accumulate_ = GMMA::ScaleOut::One;
      float alpha[2];
      // The first (rightmost) key tile may hold no key that this warpgroup's rows see: under
      // a causal mask with BM > BN or a warpgroup below the diagonal's last tile (D = 64:
      // blocks of 192 rows over 128-key tiles, 1.5 warpgroups per block; D = 256: 64-key
      // tiles, warpgroup 0). It then only passes the stage on (and its ping-pong turn).
      int n_first = n_hi - 1;
      if (a.window_left < 0 && a.window_right >= 0 && n_hi - n_lo >= 2) {
        const int last_row = min(blk.m * BM + wgc * 64 + 63, blk.sq - 1);  // stored rows only
        const int c_end = min(blk.skv, last_row + offset + a.window_right + 1);
        if (n_first * BN >= c_end) {
          pipe.consumer_wait(st);
          if (pingpong) {
            named_barrier_sync(kPingPongBarrier0 + wgc);
            named_barrier_arrive(pp_next);
          }
          pipe.consumer_release(st);
          ++st;
          --n_first;
        }
      }
      if constexpr (!Cfg::kOverlap) {
        for (int n = n_first; n >= n_lo; --n) {
          pipe.consumer_wait(st);
          issue_qk(st.index());
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
          softmax(n, alpha);
          rescale_and_convert(alpha);
          issue_pv(st.index());
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          pipe.consumer_release(st);
          ++st;
        }
        if constexpr (Persistent)
          cutlass::arch::ClusterBarrier::arrive(&smem.q_empty);  // all QK^T done
      } else {
        // The first tile alone (nothing to overlap); then no branch between a WGMMA's issue
        // and its wait, or ptxas serializes the WGMMAs (C7513).
        pipe.consumer_wait(st);
        if (pingpong) named_barrier_sync(kPingPongBarrier0 + wgc);
        issue_qk(st.index());
        if (pingpong) named_barrier_arrive(pp_next);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        softmax(n_first, alpha);
        rescale_and_convert(alpha);
        PipeState<Stages> st_prev = st;
        ++st;
        for (int n = n_first - 1; n >= n_lo; --n) {
          pipe.consumer_wait(st);
          if (pingpong) named_barrier_sync(kPingPongBarrier0 + wgc);
          issue_qk(st.index());
          issue_pv(st_prev.index());
          if (pingpong) named_barrier_arrive(pp_next);
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
          softmax(n, alpha);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          pipe.consumer_release(st_prev);
          rescale_and_convert(alpha);
          st_prev = st;
          ++st;
        }
        if constexpr (Persistent)
          cutlass::arch::ClusterBarrier::arrive(&smem.q_empty);  // all QK^T done
        issue_pv(st_prev.index());
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        pipe.consumer_release(st_prev);
      }
      if constexpr (Persistent) ++loaded;
    }

    // ---- epilogue: normalize, join the sink, store O and lse ----
    const float sink_t = a.sinks != nullptr ? a.sinks[h] * kLog2e : -INFINITY;
    T* out = static_cast<T*>(a.out) + blk.b * a.o_sb + h * a.o_sh;
    CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) {
      float l = l_run[i1];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float m_t = m_run[i1] == -INFINITY ? -INFINITY : m_run[i1] * mult;
      const float m_fin = fmaxf(m_t, sink_t);
      float o_scale = 0.f, lse = -INFINITY;
      if (m_fin != -INFINITY) {
        const float keep = exp2f(m_t - m_fin);
        l = l * keep + exp2f(sink_t - m_fin);
        o_scale = keep / l;
        lse = (m_fin + log2f(l)) * kLn2;
      }
      const int row = row_base + 8 * i1;
      if (row >= blk.sq) continue;
      T* orow = out + (blk.q_row0 + row) * a.o_ss;
      CUTE_UNROLL
      for (int g = 0; g < D / 8; ++g) {
        const T lo = static_cast<T>(O(0, i1, g) * o_scale),
                hi = static_cast<T>(O(1, i1, g) * o_scale);
        const uint32_t packed = uint32_t{reinterpret_cast<const uint16_t&>(lo)} |
                                (uint32_t{reinterpret_cast<const uint16_t&>(hi)} << 16);
        *reinterpret_cast<uint32_t*>(orow + 8 * g + col_lane) = packed;
      }
      if (a.lse != nullptr && lane % 4 == 0)
        a.lse[blk.b * a.lse_sb + h * a.lse_sh + blk.q_row0 + row] = lse;
    }
  }  // tiles
}

// Host: a TMA view (rows, D, heads, batches) of q/k (K-major) or (D, rows, heads, batches) of
// v (MN-major for the PV WGMMA). Strides of size-1 modes are replaced by a valid one.
template <class T, bool Transposed>
auto gmem_rows(const void* p, int rows, int d, int heads, int batches, int64_t s_row,
               int64_t s_head, int64_t s_batch) {
  using namespace cute;
  const int64_t fallback = d;
  const int64_t sr = rows > 1 ? s_row : fallback, sh = heads > 1 ? s_head : fallback,
                sb = batches > 1 ? s_batch : fallback;
  const T* t = static_cast<const T*>(p);
  if constexpr (!Transposed)
    return make_tensor(make_gmem_ptr(t), make_shape(rows, d, heads, batches),
                       make_stride(sr, Int<1>{}, sh, sb));
  else
    return make_tensor(make_gmem_ptr(t), make_shape(d, rows, heads, batches),
                       make_stride(Int<1>{}, sr, sh, sb));
}

template <class T, int D, int Consumers = 2>
void launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  using Cfg = FwdConfig<T, D, Consumers>;
  const bool varlen = a.cu_q != nullptr;
  const int bt = varlen ? 1 : a.batches;
  auto tma_q = make_tma_load<1>(gmem_rows<T, false>(a.q, a.sq, D, a.hq, bt, a.q_ss, a.q_sh, a.q_sb),
                                typename Cfg::SmemQ{});
  auto tma_k = make_tma_load<1>(
      gmem_rows<T, false>(a.k, a.skv, D, a.hkv, bt, a.k_ss, a.k_sh, a.k_sb), typename Cfg::SmemK{});
  // V^T view (D, rows): the leading mode is the contiguous one.
  using namespace cute;
  auto gv = gmem_rows<T, true>(a.v, a.skv, D, a.hkv, bt, a.v_ss, a.v_sh, a.v_sb);
  auto tma_v = make_tma_load<1>(gv, typename Cfg::SmemV{});
  // TESSEL_ATTENTION_PINGPONG=0 turns the ping-pong schedule off (ablation, debugging).
  static const bool pingpong = [] {
    const char* e = std::getenv("TESSEL_ATTENTION_PINGPONG");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  FwdArgs args = a;
  args.pingpong = pingpong;
  // Virtual grid (tiles_x, Hq, batches or 1): varlen has ceil(Tq / BM) + B blocks per head
  // (every sequence's last block may be partial), padded batches ceil(Sq / BM).
  args.tiles_x =
      varlen ? (a.sq + Cfg::BM - 1) / Cfg::BM + a.batches : (a.sq + Cfg::BM - 1) / Cfg::BM;
  const int64_t blocks = int64_t{args.tiles_x} * a.hq * (varlen ? 1 : a.batches);
  // Padded batches of more blocks than SMs run persistent (H100, B4 H32 S4096, against one
  // block per CTA and, for causal, the earlier pairing of blocks p and tiles_x - 1 - p: D128
  // causal +4 %, D64 causal +5 %, D64 +3-5 %, D128 +1-2 %; docs/attention.md, session 21).
  // TESSEL_ATTENTION_SCHED=one / persistent forces either (A/B, tests).
  static const int sched_env = [] {
    const char* e = std::getenv("TESSEL_ATTENTION_SCHED");
    if (e == nullptr) return -1;
    return std::strcmp(e, "persistent") == 0 ? 1 : 0;
  }();
  bool persistent = !varlen && (sched_env == 1 || (sched_env < 0 && blocks > a.sms));
  if (persistent) {
    // Two ints of zeroed scratch (not allocated while a graph is being captured: then one
    // block per CTA).
    args.sched = static_cast<int*>(
        detail::stream_workspace(stream, 2 * sizeof(int), !detail::stream_capturing(stream)));
    persistent = args.sched != nullptr;
  }
  dim3 grid(static_cast<unsigned>(blocks));
  if (persistent) {
    // Sections of (head, batch) pairs whose K/V fit in ~16 MB of L2 (query heads sharing a
    // KV head count once). TESSEL_ATTENTION_SECTION=n overrides (A/B).
    static const int section_env = [] {
      const char* e = std::getenv("TESSEL_ATTENTION_SECTION");
      return e ? std::atoi(e) : 0;
    }();
    const int64_t kv_bytes_per_q_head =
        std::max<int64_t>(1, 2 * int64_t{a.skv} * D * int64_t{sizeof(T)} / (a.hq / a.hkv));
    args.sched_groups = static_cast<int>(std::clamp<int64_t>(
        section_env > 0 ? section_env : (int64_t{16} << 20) / kv_bytes_per_q_head, 1,
        int64_t{a.hq} * a.batches));
    grid = dim3(static_cast<unsigned>(std::min<int64_t>(blocks, std::max(a.sms, 1))));
  }
  auto go = [&](auto kernel, bool& configured) {  // configured: per instantiation
    if (!configured) {
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(Cfg::kSmemBytes));
      if (err != cudaSuccess) return;  // the launch check reports it
      configured = true;
    }
    kernel<<<grid, Cfg::Threads, Cfg::kSmemBytes, stream>>>(tma_q, tma_k, tma_v, args);
  };
  static bool configured_one = false, configured_persistent = false;
  using TQ = decltype(tma_q);
  using TK = decltype(tma_k);
  using TV = decltype(tma_v);
  if (persistent)
    go(attention_fwd_kernel<Cfg, Sched::persistent, TQ, TK, TV>, configured_persistent);
  else
    go(attention_fwd_kernel<Cfg, Sched::one, TQ, TK, TV>, configured_one);
}

template <class T>
void launch_typed(const FwdArgs& a, cudaStream_t stream) {
  switch (a.d) {
    case 64: {
      // TESSEL_ATTENTION_D64_WG=2: the 2-consumer kernel (BM 128, BN 192) at D = 64 (A/B).
      static const bool two = [] {
        const char* e = std::getenv("TESSEL_ATTENTION_D64_WG");
        return e != nullptr && std::strcmp(e, "2") == 0;
      }();
      if (two)
        launch_fwd<T, 64, 2>(a, stream);
      else
        launch_fwd<T, 64, 3>(a, stream);
      break;
    }
    case 128: launch_fwd<T, 128>(a, stream); break;
    default: launch_fwd<T, 256>(a, stream); break;
  }
}

}  // namespace tessel::attention_detail
