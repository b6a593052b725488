// Hopper attention backward at head dim 256: the TMA + WGMMA dK/dV (+ dQ) kernel with the
// head dim split between the two consumer warpgroups (default atomic-dq mode).
//
// At D = 256 the D = 64 / 128 kernel's split (each warpgroup owns 64 keys and all D columns
// of their dK and dV) needs 2 x 128 f32 accumulator registers per thread for dK and dV alone.
// Here one CTA computes a 64-key block and the warpgroups split the work of every step:
//
//   warpgroup 0: S^T = K Q^T (64 keys x 64 queries, SS WGMMA), P^T = exp2(S^T scale log2e -
//                lse log2e) with the masks (and the soft-cap), P^T s' / scale (f32; s' the
//                derivative of the logit, scale (1 - tanh^2) under a soft-cap) and P^T's
//                16-bit A operand registers -> exchange buffer
//   warpgroup 1: dP^T = V dO^T (SS WGMMA), then with them dS^T = P^T (dP^T - delta) s' ->
//                exchange buffer (as its 16-bit A operand registers) and into the swizzled
//                dS tile of the dQ WGMMA
//   both       : dV[:, 128w ..] += P^T dO[:, 128w ..], dK[:, 128w ..] += dS^T Q[:, 128w ..]
//                (RS WGMMA, 64 x 128 f32 accumulators each), dQ[:, 128w ..] = dS K[:, 128w ..]
//                (SS WGMMA)
//
// The two warpgroups hold the same (key, query) accumulator coordinates in the same threads,
// so the exchange buffer is laid out by fragment slot: thread t's slot g lives at
// [g][t] (16 bytes), conflict-free and without address arithmetic. Warpgroup 0's dV WGMMA runs
// while warpgroup 1 forms dS.
//
// dQ: once both warpgroups' dV / dK WGMMAs are done, the step's Q / dO stage is dead: each
// warpgroup writes its (64 x 128) f32 half of the dQ tile into it (warpgroup 0 into Q's bytes,
// 1 into dO's, 128B-swizzled boxes of 64 rows x 32 columns: conflict-free float2 stores), and a
// writer warp of the producer warpgroup adds the tile to the f32 workspace with TMA reduce-adds
// (cp.reduce.async.bulk.tensor ... add; the copy engine un-swizzles and clips rows past the
// sequence) and then releases the stage to the TMA producer. Two stages of Q + dO, the dQ
// tile without shared memory of its own: 32 + 32 (K, V) + 2 x 64 + 8 (dS) + 24 (exchange) KB.
//
// Registers (-Xptxas -v, setmaxnreg 24 / 240): 72 bytes of spill, none in the WGMMA chains. At
// 232 ptxas serialized the WGMMAs (C7512); so it did with dQ issued behind dK (the P / dS
// operand registers still in flight) or with both dQ passes in flight at once. The dS and dQ
// stores compute their swizzled addresses from a per-thread base: cute's indexing hoisted 32
// addresses out of the loop and spilled them (364 bytes; 233 -> 384 TFLOP/s on an H100 once
// gone, B4 H16 S4096).
#pragma once

#include <cuda.h>

#include "ops/attention/attention_bwd_wgmma_kernel.cuh"

namespace tessel::attention_detail {

namespace bwd_wgmma_d256 {

using namespace tessel::tile::sm90;
using bwd_wgmma::dq_barrier_arrive;
using bwd_wgmma::dq_barrier_sync;
using bwd_wgmma::KeyBlock;
using bwd_wgmma::pack_pair;

template <class T_>
struct Config {
  using T = T_;
  static constexpr int D = 256;
  static constexpr int Half = D / 2;  // columns of dK / dV / dQ per warpgroup
  static constexpr int Bc = 64;       // keys per CTA
  static constexpr int Br = 64;       // query rows per step
  static constexpr int Stages = 2;
  static constexpr int Consumers = 2;
  static constexpr int Threads = kWarpgroupThreads * (1 + Consumers);
  using SmemK = SmemLayout<T, Major::K, Bc, D, 1>;         // K, V: A of S^T / dP^T
  using SmemKt = SmemLayout<T, Major::MN, D, Bc, 1>;       // the same bytes: B of dQ = dS K
  using SmemQ = SmemLayout<T, Major::K, Br, D, Stages>;    // Q, dO: B of S^T / dP^T
  using SmemQt = SmemLayout<T, Major::MN, D, Br, Stages>;  // the same bytes: B of dK / dV
  using SmemDS = SmemLayout<T, Major::MN, Br, Bc, 1>;      // dS (query-contiguous), A of dQ
  // One warpgroup's S^T or dP^T (64 x Br).
  using MmaSdP = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<Br>, cute::Int<D>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  // dV / dK (64 x D): the two warpgroups split N.
  using MmaKV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<Half>, cute::Int<Br>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{}));
  // dQ (Br x D): each warpgroup computes its 128 columns as two 64-column passes (a 64 x 128
  // f32 accumulator beside dK and dV made ptxas serialize the WGMMAs and spill).
  static constexpr int DqCols = 64;
  using MmaDQ = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float,
                                       cute::Shape<cute::_64, cute::Int<DqCols>, cute::Int<Bc>>,
                                       cute::GMMA::Major::MN, cute::GMMA::Major::MN>()));
  using Pipeline = TmaPipeline<Stages>;
  struct Smem {
    alignas(1024) T k[cute::cosize_v<SmemK>];
    alignas(1024) T v[cute::cosize_v<SmemK>];
    alignas(1024) T q[cute::cosize_v<SmemQ>];
    alignas(1024) T dout[cute::cosize_v<SmemQ>];
    alignas(1024) T ds[cute::cosize_v<SmemDS>];
    // Slots 0-7: P^T s' / scale (f32: P^T, times 1 - tanh^2 under a soft-cap), 8-11: P^T as
    // 16-bit A-operand pairs; then slots 0-3: dS^T as 16-bit A-operand pairs.
    alignas(16) float4 xchg[12][kWarpgroupThreads];
    alignas(16) float lse2[2][Br];   // lse log2 e, by step parity
    alignas(16) float delta[2][Br];  // scale * delta, by step parity
    alignas(16) typename Pipeline::SharedStorage pipe;
    alignas(8) uint64_t kv_full;
  };
  static_assert(Br * Half * sizeof(float) == stage_bytes<T, SmemQ>,
                "a warpgroup's f32 dQ half fills one Q (or dO) stage");
  static constexpr uint32_t kQBytes = 2 * stage_bytes<T, SmemQ>;  // Q and dO
  static constexpr uint32_t kKVBytes = 2 * stage_bytes<T, SmemK>;
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + slack to align the base
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

// Named barriers (0 is __syncthreads).
constexpr int kPReady = 1;     // warpgroup 0 -> 1: P^T is in the exchange buffer
constexpr int kDsReady = 2;    // warpgroup 1 -> 0: dS^T is in the exchange buffer and sdS
constexpr int kStageDone = 3;  // both: every WGMMA reading the step's Q / dO has completed
constexpr int kDqFull0 = 4;    // + step parity: consumers -> dQ writer warp
constexpr int kDqThreads = 2 * kWarpgroupThreads + 32;

template <class Cfg, class TmaQ, class TmaK>
__global__ void __launch_bounds__(Cfg::Threads, 1)
    attention_bwd_d256_wgmma(const __grid_constant__ TmaQ tma_q,
                             const __grid_constant__ TmaQ tma_do,
                             const __grid_constant__ TmaK tma_k, const __grid_constant__ TmaK tma_v,
                             const __grid_constant__ CUtensorMap dq_desc,
                             const __grid_constant__ BwdArgs a) {
  using namespace cute;
  using T = typename Cfg::T;
  constexpr int Bc = Cfg::Bc, Br = Cfg::Br, D = Cfg::D, Half = Cfg::Half, Stages = Cfg::Stages;

  KeyBlock kb;
  if (!bwd_wgmma::find_key_block<Bc>(a, kb)) return;  // varlen grids have spare CTAs
  const int hk = kb.hk, group = a.hq / a.hkv;
  const int j0 = kb.blk * Bc;
  const int offset = kb.skv - kb.sq;
  const bool varlen = a.cu_q != nullptr;
  const int bt = varlen ? 0 : kb.b;  // batch coordinate of the views
  int m_lo, nm;
  bwd_wgmma::visible_query_blocks<Bc, Br>(a, kb, j0, m_lo, nm);
  const int iters = nm * group;

  extern __shared__ char smem_raw[];
  const uint32_t base = cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Cfg::Smem*>(smem_raw + ((1024 - base % 1024) % 1024));
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Cfg::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Cfg::SmemK{});
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout), typename Cfg::SmemQ{});
  constexpr int kStageElems = cute::cosize_v<typename Cfg::SmemQ> / Stages;

  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  // The stage is released by the dQ writer (one thread), after the copy engine read the dQ.
  auto pipe = make_tma_pipeline<Stages, 1>(smem.pipe, wg == 0, Cfg::kQBytes, 1);
  cluster_sync<1>();

  if (wg == 0) {  // ---- producer ----
    producer_registers<24>();
    const int pwarp = warp_in_warpgroup();  // before any divergence (a full-warp shuffle)
    if (pwarp == 0 && elect_one() && iters > 0) {
      bwd_wgmma::produce_steps<Cfg>(tma_q, tma_do, tma_k, tma_v, a, kb, hk, group, m_lo, nm,
                                    smem.kv_full, pipe, sK, sV, sQ, sdO);
    } else if (pwarp == 1 && iters > 0) {
      // dQ writer: each step's tile (both halves, 8 boxes) by TMA reduce-adds, then the stage
      // goes back to the producer once the copy engine has read it.
      PipeState<Stages> rst;
      const bool leader = elect_one();
      for (int it = 0; it < iters; ++it) {
        const int h = hk * group + it / nm, i0 = (m_lo + it % nm) * Br;
        const int s = rst.index();
        dq_barrier_sync<kDqThreads>(kDqFull0 + it % 2);
        if (leader) {
          CUTE_UNROLL
          for (int w = 0; w < 2; ++w) {
            const float* half =
                reinterpret_cast<const float*>(w == 0 ? smem.q : smem.dout) + s * (kStageElems / 2);
            CUTE_UNROLL
            for (int box = 0; box < Half / 32; ++box)
              SM90_TMA_REDUCE_ADD_4D::copy(&dq_desc, half + box * 64 * 32, w * Half + box * 32,
                                           static_cast<int>(kb.q_row0) + i0, h, bt);
          }
          tma_store_arrive();
          tma_store_wait<0>();  // the copy engine has read the tile
          pipe.consumer_release(rst);
        }
        ++rst;
        __syncwarp();
      }
    }
    return;
  }

  // ---- consumers ----
  consumer_registers<240>();
  const int ctid = consumer_thread();
  const int wgc = wg - 1;
  const int wtid = ctid % kWarpgroupThreads;
  typename Cfg::MmaSdP mma_sdp;
  typename Cfg::MmaKV mma_kv;
  typename Cfg::MmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_slice(wtid);
  auto thr_kv = mma_kv.get_slice(ctid);
  auto thr_dq = mma_dq.get_slice(wtid);
  Tensor sQt = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout), typename Cfg::SmemQt{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename Cfg::SmemKt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds), typename Cfg::SmemDS{});

  // Warpgroup 0 multiplies K by Q, warpgroup 1 V by dO: the same code on other operands.
  Tensor tSrA = thr_sdp.make_fragment_A(thr_sdp.partition_A(wgc == 0 ? sK : sV));
  Tensor tSrB = thr_sdp.make_fragment_B(thr_sdp.partition_B(wgc == 0 ? sQ : sdO));
  Tensor tKVrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt));  // (MMA, 1, Br/16, Stages)
  Tensor tKVrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt));
  Tensor tdQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS));  // (MMA, 1, Bc/16, 1)
  // K^T columns of this warpgroup's two dQ passes.
  Tensor tdQrK0 = thr_dq.make_fragment_B(thr_dq.partition_B(
      local_tile(sKt(_, _, 0), Shape<Int<Cfg::DqCols>, Int<Bc>>{}, make_coord(2 * wgc, 0))));
  Tensor tdQrK1 = thr_dq.make_fragment_B(thr_dq.partition_B(
      local_tile(sKt(_, _, 0), Shape<Int<Cfg::DqCols>, Int<Bc>>{}, make_coord(2 * wgc + 1, 0))));

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<Bc>, Int<Br>>{});  // S^T or dP^T
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<Int<Bc>, Int<D>>{});  // this half
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<Int<Bc>, Int<D>>{});
  Tensor tKVrP = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<Br / 16>>>{});
  Tensor tKVrdS = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<Br / 16>>>{});
  static_assert(size(tSrS) == 32 && size(tdVrdV) == Half / 2, "64xN fp32 accumulators");
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<Bc>, Int<Br>>{}));
  Tensor tKVc = thr_kv.partition_C(make_identity_tensor(Shape<Int<Bc>, Int<D>>{}));
  // Per-thread parts of the swizzled shared-memory addresses (see the dS and dQ stores).
  const int lane = wtid % 32, warp = wtid / 32, rq = lane / 4;
  char* const ds_bytes = reinterpret_cast<char*>(smem.ds) + warp * 2048 + rq * 128 + 4 * (lane % 4);
  const int ds_xor = rq * 16;
  const int dq_base = (16 * warp + rq) * 32 + 2 * (lane % 2);
  const int dq_xor = ((lane % 4) / 2) ^ rq;
  uint32_t* ds_words = reinterpret_cast<uint32_t*>(tKVrdS.data());  // 16 pairs
  uint32_t* p_words = reinterpret_cast<uint32_t*>(tKVrP.data());
  // 16 operand words (16-bit pairs) of this thread to / from exchange slots slot0 .. slot0 + 3.
  auto send_words = [&](int slot0, const uint32_t* w) __attribute__((always_inline)) {
    CUTE_UNROLL
    for (int g = 0; g < 4; ++g)
      reinterpret_cast<uint4&>(smem.xchg[slot0 + g][wtid]) =
          make_uint4(w[4 * g], w[4 * g + 1], w[4 * g + 2], w[4 * g + 3]);
  };
  auto receive_words = [&](int slot0, uint32_t* w) __attribute__((always_inline)) {
    CUTE_UNROLL
    for (int g = 0; g < 4; ++g) {
      const uint4 v = reinterpret_cast<const uint4&>(smem.xchg[slot0 + g][wtid]);
      w[4 * g] = v.x, w[4 * g + 1] = v.y, w[4 * g + 2] = v.z, w[4 * g + 3] = v.w;
    }
  };
  // dV[:, this half] += P^T dO[:, this half] (RS WGMMA) on the step's stage.
  auto dv_issue = [&](int stage) __attribute__((always_inline)) {
    warpgroup_fence_operand(tKVrP);
    warpgroup_fence_operand(tdVrdV);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < Br / 16; ++k)
      cute::gemm(mma_kv, tKVrP(_, _, k), tKVrdOt(_, _, k, stage), tdVrdV);
    warpgroup_commit_batch();
  };

  CUTE_UNROLL
  for (int i = 0; i < size(tdVrdV); ++i) tdVrdV(i) = tdKrdK(i) = 0.f;

  const bool capped = a.softcap > 0.f;
  const float mult = a.scale * kLog2e, cap_in = capped ? a.scale / a.softcap : 0.f;
  // Round the f32 accumulator layout to the 16-bit A operand layout (see attention_fwd_kernel.cuh:
  // (col pair, row half, 8-col group) regrouped by 16-wide k blocks).
  auto to_a_operand = [&](auto& dst, const auto& src) {
    CUTE_UNROLL
    for (int g = 0; g < Br / 8; ++g) CUTE_UNROLL
    for (int i1 = 0; i1 < 2; ++i1) CUTE_UNROLL
    for (int i0p = 0; i0p < 2; ++i0p)
      dst(make_coord(make_coord(i0p, i1, g % 2), 0, g / 2)) =
          static_cast<T>(src(make_coord(make_coord(i0p, i1, g), 0, 0)));
  };

  if (iters > 0) {
    cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_full, 0);
    PipeState<Stages> st;
    mma_kv.accumulate_ = GMMA::ScaleOut::One;
    // This warpgroup's per-row value of a step (warpgroup 0: lse, 1: delta), loaded a step
    // ahead into registers and stored into shared memory (by parity) before the step's
    // kStageDone barrier; rows past the sequence: lse = +inf (P = 0), delta = 0.
    auto load_row = [&](int step) {
      float v = wgc == 0 ? -INFINITY : 0.f;
      const int hs = hk * group + step / nm, is = (m_lo + step % nm) * Br + wtid;
      if (step < iters && wtid < Br && is < kb.sq) {
        const int64_t at = kb.b * a.lse_sb + hs * a.lse_sh + kb.q_row0 + is;
        v = wgc == 0 ? a.lse[at] : a.delta[at];
      }
      return v;
    };
    auto store_row = [&](int buf, float v) {
      if (wtid < Br) {
        if (wgc == 0)
          smem.lse2[buf][wtid] = v == -INFINITY ? INFINITY : v * kLog2e;
        else
          smem.delta[buf][wtid] = v * a.scale;
      }
    };
    store_row(0, load_row(0));
    float row_next = load_row(1);
    dq_barrier_sync<2 * kWarpgroupThreads>(kStageDone);
    for (int it = 0; it < iters; ++it) {
      const int i0 = (m_lo + it % nm) * Br;
      const int par = it % 2;
      pipe.consumer_wait(st);
      const int s = st.index();
      // S^T = K Q^T (warpgroup 0) or dP^T = V dO^T (warpgroup 1).
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrA); ++k) {
        cute::gemm(mma_sdp, tSrA(_, _, k, 0), tSrB(_, _, k, s), tSrS);
        mma_sdp.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      // This thread's query columns' lse (warpgroup 0) or scale * delta (1) while the WGMMAs
      // run: q = 8 g + 2 (lane % 4) + {0, 1} for accumulator element e = 4 g + 2 i1 + {0, 1}.
      float rowv[Br / 8][2];
      {
        const float* rows = (wgc == 0 ? smem.lse2[par] : smem.delta[par]) + 2 * (lane % 4);
        CUTE_UNROLL
        for (int g = 0; g < Br / 8; ++g) {
          const float2 v = *reinterpret_cast<const float2*>(rows + 8 * g);
          rowv[g][0] = v.x, rowv[g][1] = v.y;
        }
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);

      if (wgc == 0) {
        // P^T in place, masked only on blocks that straddle a boundary.
        const bool need_mask =
            j0 + Bc > kb.skv ||
            (a.window_right >= 0 && j0 + Bc - 1 > i0 + offset + a.window_right) ||
            (a.window_left >= 0 && j0 < i0 + Br - 1 + offset - a.window_left);
        // Straight-line code per (soft-cap, mask) case (a per-element branch on either
        // tripled the D = 128 kernel's instructions); each group of 4 is sent as it is formed.
        auto probs = [&](auto capped_c, auto masked_c) {
          constexpr bool kCapped = decltype(capped_c)::value;
          constexpr bool kMasked = decltype(masked_c)::value;
          CUTE_UNROLL
          for (int g = 0; g < 8; ++g) {
            float gv[4];
            CUTE_UNROLL
            for (int u = 0; u < 4; ++u) {
              const int e = 4 * g + u;
              float p, th = 0.f;
              if constexpr (kCapped) {
                th = tanhf(tSrS(e) * cap_in);
                p = tile::exp2_ftz(fmaf(a.softcap * th, kLog2e, -rowv[g][u % 2]));
              } else {
                p = tile::exp2_ftz(fmaf(tSrS(e), mult, -rowv[g][u % 2]));
              }
              if constexpr (kMasked) {
                const int i = i0 + get<1>(tScS(e)), j = j0 + get<0>(tScS(e));
                bool vis = j < kb.skv;
                if (a.window_right >= 0) vis = vis && j <= i + offset + a.window_right;
                if (a.window_left >= 0) vis = vis && j >= i + offset - a.window_left;
                if (!vis) p = 0.f;
              }
              tSrS(e) = p;
              gv[u] = kCapped ? p * (1.f - th * th) : p;
            }
            smem.xchg[g][wtid] = make_float4(gv[0], gv[1], gv[2], gv[3]);
          }
        };
        using False = cute::false_type;
        using True = cute::true_type;
        if (capped) {
          if (need_mask)
            probs(True{}, True{});
          else
            probs(True{}, False{});
        } else if (need_mask) {
          probs(False{}, True{});
        } else {
          probs(False{}, False{});
        }
        to_a_operand(tKVrP, tSrS);
        send_words(8, p_words);
        named_barrier_arrive(kPReady);
        dv_issue(s);
        named_barrier_sync(kDsReady);
        receive_words(0, ds_words);
      } else {
        // dS^T = P^T (dP^T - delta) s' = [P^T s' / scale] (scale dP^T - scale delta), the
        // bracket and P^T's A operand from warpgroup 0.
        named_barrier_sync(kPReady);
        CUTE_UNROLL
        for (int g = 0; g < 8; ++g) {
          const float4 p = smem.xchg[g][wtid];
          const float pv[4] = {p.x, p.y, p.z, p.w};
          CUTE_UNROLL
          for (int u = 0; u < 4; ++u) {
            const int e = 4 * g + u;
            tSrS(e) = pv[u] * fmaf(tSrS(e), a.scale, -rowv[g][u % 2]);
          }
        }
        receive_words(8, p_words);
        to_a_operand(tKVrdS, tSrS);
        send_words(0, ds_words);
        // dS (query pairs, 4 bytes) into the swizzled A tile of dQ = dS K: element (q, key) at
        // byte (key / 8) 1024 + (key % 8) 128 + ((q / 8) ^ (key % 8)) 16 + (q % 8) 2 (MN-major
        // 128B swizzle). With key = 16 warp + lane / 4 + 8 i1 and q = 2 (lane % 4) + 8 g + {0, 1}
        // (the accumulator's layout) that is a per-thread base, a constant and one XOR; cute's
        // own indexing kept 16 swizzled addresses live across the loop (spilled).
        CUTE_UNROLL
        for (int g = 0; g < Br / 8; ++g) CUTE_UNROLL
        for (int i1 = 0; i1 < 2; ++i1) {
          const int e = 2 * i1 + 4 * g;
          *reinterpret_cast<uint32_t*>(ds_bytes + i1 * 1024 + ((g * 16) ^ ds_xor)) =
              pack_pair<T>(tSrS(e), tSrS(e + 1));
        }
        cutlass::arch::fence_view_async_shared();  // sdS: read by the async proxy (WGMMA)
        named_barrier_arrive(kDsReady);
        dv_issue(s);
      }
      warpgroup_fence_operand(tKVrdS);
      warpgroup_fence_operand(tdKrdK);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < Br / 16; ++k)
        cute::gemm(mma_kv, tKVrdS(_, _, k), tKVrQt(_, _, k, s), tdKrdK);
      warpgroup_commit_batch();
      // dQ = dS K in two 64-column passes once dV / dK are done (their P / dS operand
      // registers in flight beside both dQ accumulators made ptxas serialize the WGMMAs).
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      Tensor tdQrdQ0 = partition_fragment_C(mma_dq, Shape<Int<Br>, Int<Cfg::DqCols>>{});
      Tensor tdQrdQ1 = partition_fragment_C(mma_dq, Shape<Int<Br>, Int<Cfg::DqCols>>{});
      auto dq_issue = [&](const auto& tdQrK, auto& tdQrdQ) {
        warpgroup_fence_operand(tdQrdQ);
        warpgroup_arrive();
        mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tdQrdS); ++k) {
          cute::gemm(mma_dq, tdQrdS(_, _, k, 0), tdQrK(_, _, k), tdQrdQ);
          mma_dq.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
      };
      dq_issue(tdQrK0, tdQrdQ0);
      store_row(par ^ 1, row_next);  // the next step's rows
      row_next = load_row(it + 2);
      // The dQ tile goes into the dead Q / dO stage once both warpgroups' WGMMAs are done
      // with it. Element (r, c) of a warpgroup's half: box c / 32 (64 x 32 f32, 8 KB), row r,
      // 16-byte chunk ((c % 32) / 4) ^ (r % 8); with r = 16 warp + lane / 4 + 8 i1 and
      // c = 64 pass + 8 g + 2 (lane % 4) + {0, 1}: a per-thread base, a constant and the XOR
      // of 2 (g % 4).
      float* half = reinterpret_cast<float*>(wgc == 0 ? smem.q : smem.dout) + s * (kStageElems / 2);
      auto dq_store = [&](auto& tdQrdQ, int pass) {
        warpgroup_fence_operand(tdQrdQ);
        CUTE_UNROLL
        for (int g = 0; g < Cfg::DqCols / 8; ++g) CUTE_UNROLL
        for (int i1 = 0; i1 < 2; ++i1) {
          const int e = 2 * i1 + 4 * g;
          float* dst = half + dq_base + (2 * pass + g / 4) * (64 * 32) + i1 * 8 * 32 +
                       (((2 * (g % 4)) ^ dq_xor) * 4);
          *reinterpret_cast<float2*>(dst) = make_float2(tdQrdQ(e), tdQrdQ(e + 1));
        }
      };
      warpgroup_wait<0>();
      dq_barrier_sync<2 * kWarpgroupThreads>(kStageDone);
      dq_store(tdQrdQ0, 0);
      dq_issue(tdQrK1, tdQrdQ1);
      warpgroup_wait<0>();
      dq_store(tdQrdQ1, 1);
      cutlass::arch::fence_view_async_shared();  // visible to the copy engine
      dq_barrier_arrive<kDqThreads>(kDqFull0 + par);
      ++st;
    }
  }

  // ---- epilogue: this warpgroup's columns of dK, dV (zeros for keys no query sees) ----
  bwd_wgmma::store_dk_dv<T>(a, kb, hk, j0, tKVc, tdKrdK, tdVrdV);
}

// Host: the TMA reduce-add descriptor of the f32 dq workspace ((rows, Hq, D) per batch, rows
// Hq * D apart), boxes of 32 columns x 64 rows, 128B swizzle.
inline bool make_dq_reduce_desc(CUtensorMap* map, const BwdArgs& a) {
  const bool varlen = a.cu_q != nullptr;
  const int64_t rows = a.sq;  // varlen: Tq (one batch)
  const int64_t bt = varlen ? 1 : a.batches;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(a.d), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(a.hq), static_cast<cuuint64_t>(bt)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(int64_t{a.hq} * a.d * 4),
                                 static_cast<cuuint64_t>(int64_t{a.d} * 4),
                                 static_cast<cuuint64_t>(rows * a.hq * a.d * 4)};
  const cuuint32_t box[4] = {32, 64, 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  return CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
             map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, a.dq_accum, dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class T>
void launch(const BwdArgs& a, cudaStream_t stream) {
  using Cfg = Config<T>;
  auto [tma_q, tma_do, tma_k, tma_v] = bwd_wgmma::make_step_tmas<Cfg>(a);
  CUtensorMap dq_desc;
  if (!make_dq_reduce_desc(&dq_desc, a)) return;  // the launch check reports nothing ran
  auto kernel = attention_bwd_d256_wgmma<Cfg, decltype(tma_q), decltype(tma_k)>;
  static bool configured = false;  // per instantiation: the attribute outlives the call
  if (!configured) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Cfg::kSmemBytes));
    if (err != cudaSuccess) return;  // the launch check reports it
    configured = true;
  }
  kernel<<<bwd_wgmma::key_block_grid<Cfg>(a), Cfg::Threads, Cfg::kSmemBytes, stream>>>(
      tma_q, tma_do, tma_k, tma_v, dq_desc, a);
}

}  // namespace bwd_wgmma_d256

}  // namespace tessel::attention_detail
