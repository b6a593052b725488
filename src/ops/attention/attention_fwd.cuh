// Internal interface of the attention forward (include/tessel/attention.hpp): the resolved
// arguments shared by the host launcher (attention_fwd.cu) and the two kernel paths.
//   WGMMA path (attention_fwd_kernel.cuh, one TU per dtype): TMA + WGMMA, warp-specialized,
//             for 16-byte aligned bases and strides, D in {64, 128, 256}
//   SIMT path (attention_fwd.cu): one warp per query row, fp32 CUDA cores; every other
//             layout, empty key sets, and TESSEL_ATTENTION_PATH=simt (tests, debugging)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessel::attention_detail {

struct FwdArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;          // optional
  const float* sinks = nullptr;  // optional, per q head
  const int* cu_q = nullptr;     // varlen (both or neither), B+1 offsets
  const int* cu_k = nullptr;
  // Element strides of (batch, sequence, head); batch strides are 0 for varlen.
  int64_t q_sb = 0, q_ss = 0, q_sh = 0;
  int64_t k_sb = 0, k_ss = 0, k_sh = 0;
  int64_t v_sb = 0, v_ss = 0, v_sh = 0;
  int64_t o_sb = 0, o_ss = 0, o_sh = 0;
  // lse element (b, h, global q row r): lse[b*lse_sb + h*lse_sh + r]
  int64_t lse_sb = 0, lse_sh = 0;
  int batches = 0, hq = 0, hkv = 0, d = 0;
  // Padded: the sequence lengths. Varlen: the row totals Tq, Tk of q and k/v.
  int sq = 0, skv = 0;
  float scale = 0.f;      // resolved (> 0)
  float softcap = 0.f;    // 0: none
  int window_left = -1;   // < 0: unlimited
  int window_right = -1;  // < 0: unlimited (causal already folded in as 0)
  bool pingpong = true;   // WGMMA path: warpgroup ping-pong (set by the launcher)
  int tiles_x = 0;        // WGMMA path: query blocks per (head, batch)
  // WGMMA path, persistent schedule (padded batches): one CTA per SM takes query blocks from
  // a ticket counter; sched points at [tickets, finished CTAs] in the stream workspace (zero
  // on entry, zeroed again by the last CTA). Blocks run in sections of sched_groups (head,
  // batch) pairs, longest first within a section.
  int* sched = nullptr;
  int sms = 0;  // the device's SM count (set by the launcher)
  int sched_groups = 0;
};

// The WGMMA path; returns false (nothing launched) when the layout does not qualify.
bool wgmma_supported(const FwdArgs& a, bool is_bf16);
void launch_wgmma_bf16(const FwdArgs& a, cudaStream_t stream);
void launch_wgmma_f16(const FwdArgs& a, cudaStream_t stream);

}  // namespace tessel::attention_detail
