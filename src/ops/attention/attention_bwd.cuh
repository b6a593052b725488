// Internal interface of the attention backward (include/tessel/attention_backward.hpp): the
// resolved arguments shared by the host launcher (attention_bwd.cu) and the tensor-core
// kernels (attention_bwd_kernel.cuh, one TU per dtype).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessel::attention_detail {

struct BwdArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;    // (B, Hq, Sq) or (Hq, Tq), contiguous
  const float* delta = nullptr;  // rowsum(dout * out), laid out like lse (workspace)
  float* dq_accum = nullptr;     // f32 workspace (below); nullptr: deterministic mode
  bool dq_blocked = false;       // dq_accum in the blocked layout (the D = 64 / 128 WGMMA
                                 // kernel), else (rows, Hq, D)
  // The D = 64 / 128 WGMMA kernel's key-block CTAs that have finished, per (sequence, kv head)
  // (b * hkv + hk; zeroed with the dq workspace). Non-null: the blocked convert kernel is
  // launched as a programmatic dependent of that kernel (it may start while the last key blocks
  // run) and converts a tile once its (sequence, kv head) is complete.
  int* kv_done = nullptr;
  // Non-null: the blocked workspace is not zeroed beforehand. Per workspace tile ((tile, q head),
  // the tile's index in the workspace), a ticket count: the WGMMA kernel's key block that takes
  // ticket 0 stores its dQ tile (bulk copy) instead of adding it, then sets kDqTileReady (release)
  // once the store is complete; the others wait for that bit before they add. Zeroed with
  // kv_done; a tile nobody touched (rows that see no key) is converted as zeros.
  int* dq_tickets = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  const int* cu_q = nullptr;  // varlen (both or neither), B+1 offsets
  const int* cu_k = nullptr;
  // Element strides of (batch, sequence, head); batch strides are 0 for varlen.
  int64_t q_sb = 0, q_ss = 0, q_sh = 0;
  int64_t k_sb = 0, k_ss = 0, k_sh = 0;
  int64_t v_sb = 0, v_ss = 0, v_sh = 0;
  int64_t do_sb = 0, do_ss = 0, do_sh = 0;
  int64_t dq_sb = 0, dq_ss = 0, dq_sh = 0;
  int64_t dk_sb = 0, dk_ss = 0, dk_sh = 0;
  int64_t dv_sb = 0, dv_ss = 0, dv_sh = 0;
  int64_t lse_sb = 0, lse_sh = 0;  // lse / delta element (b, h, global q row r)
  int batches = 0, hq = 0, hkv = 0, d = 0;
  int sq = 0, skv = 0;    // padded: the lengths; varlen: the row totals Tq, Tk
  float scale = 0.f;      // resolved (> 0)
  float softcap = 0.f;    // 0: none
  int window_left = -1;   // < 0: unlimited
  int window_right = -1;  // < 0: unlimited (causal folded in as 0)
  bool vec = false;       // q/k/v/dout 16-byte aligned bases and strides: 16-byte async copies
  // WGMMA kernels, padded batches: 0 = the grid's own order (key block fastest); G > 0 = the
  // launch order walks sections of G (kv head, sequence) pairs, key block slowest within one
  // (causal: the longest key blocks of every pair first, the shortest last).
  int order_pairs = 0;
};

// The blocked dq workspace of the D = 64 / 128 WGMMA kernel: tiles of kDqTileRows query rows
// x D f32 per head, tile t of head h at float (t * Hq + h) * kDqTileRows * D, so that a
// step's dQ is one contiguous bulk reduce-add. Within a tile, 64-column chunk w (4096 floats)
// holds the WGMMA accumulator order of the warpgroup that computed it: float 4 (t + 128 g) +
// 2 i1 + j is row 16 (t / 32) + (t % 32) / 4 + 8 i1, column 64 w + 8 g + 2 (t % 4) + j.
// Query block m of sequence b is tile dq_tile0(b) + m; varlen sequences start at tile
// (cu_q[b] + kDqTileRows b) / kDqTileRows, which never overlaps the previous one's tiles.
constexpr int kDqTileRows = 64;
constexpr int kDqKeyBlock = 128;       // keys per CTA of that kernel (kv_done's unit)
constexpr int kDqTileReady = 1 << 30;  // BwdArgs::dq_tickets: the first dQ tile is stored
#ifdef __CUDACC__
__host__ __device__
#endif
    inline int64_t
    dq_tile0(const BwdArgs& a, int b, int64_t q_row0) {
  return a.cu_q != nullptr ? (q_row0 + int64_t{kDqTileRows} * b) / kDqTileRows
                           : int64_t{b} * ((a.sq + kDqTileRows - 1) / kDqTileRows);
}
// Tiles per head of the blocked workspace (varlen: an upper bound).
inline int64_t dq_blocked_tiles(const BwdArgs& a) {
  return a.cu_q != nullptr ? (int64_t{a.sq} + kDqTileRows - 1) / kDqTileRows + a.batches + 1
                           : int64_t{a.batches} * ((a.sq + kDqTileRows - 1) / kDqTileRows);
}

// The three steps after the preprocess (delta): dk/dv by key blocks (with dq atomics into
// dq_accum unless deterministic), then dq by query blocks (deterministic mode only).
void launch_bwd_bf16(const BwdArgs& a, cudaStream_t stream);
void launch_bwd_f16(const BwdArgs& a, cudaStream_t stream);

// The TMA + WGMMA dk/dv kernel (attention_bwd_wgmma_kernel.cuh): default (atomic dq) mode,
// D = 64 / 128 / 256, TMA-aligned q/k/v/dout and 4-byte aligned dk/dv; the
// mma.sync kernels above take every other case. bwd_wgmma_supported() says which.
bool bwd_wgmma_supported(const BwdArgs& a);
void launch_bwd_wgmma_bf16(const BwdArgs& a, cudaStream_t stream);
void launch_bwd_wgmma_f16(const BwdArgs& a, cudaStream_t stream);
// D = 256: the head-dim-split WGMMA kernel (attention_bwd_wgmma_d256_kernel.cuh).
void launch_bwd_wgmma_d256_bf16(const BwdArgs& a, cudaStream_t stream);
void launch_bwd_wgmma_d256_f16(const BwdArgs& a, cudaStream_t stream);

// Tests: force BwdArgs::order_pairs for causal-like masks on the WGMMA kernels (n > 0: sections
// of n pairs; 0: the grid's own order); -1 restores the automatic choice.
void set_bwd_order_pairs(int n);

}  // namespace tessel::attention_detail
