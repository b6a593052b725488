// tessel decode attention: a few new query tokens per sequence against a long KV cache
// (contiguous or paged), the KV append that fills the cache, and DeepSeek-V2 MLA decode in the
// absorbed form over the compressed latent cache.
//
// Layouts (last axis contiguous; other strides any non-negative multiple of 8 elements;
// every data pointer 16-byte aligned; dtype f16 or bf16, the same for q, caches and out):
//   q            (B, Sq, Hq, D)      the Sq newest tokens of each sequence
//   out          (B, Sq, Hq, D)
//   seqlens      (B,) i32 on the device: length of each sequence INCLUDING its Sq new tokens
//   contiguous   k_cache, v_cache (B, Smax, Hkv, D): token p of sequence b at [b, p]
//   paged        k_cache, v_cache (num_pages, page_size, Hkv, D) and
//                block_table (B, max_pages) i32 on the device: token p of sequence b at
//                [block_table[b, p / page_size], p % page_size] (any page_size >= 1)
//   lse          optional (B, Sq, Hq) f32, dense: natural-log log-sum-exp of each row's
//                (scaled, soft-capped) scores
// GQA: Hq % Hkv == 0, query head h reads KV head h / (Hq / Hkv). D in {64, 128, 256}.
// New token s (0-based among the Sq) sits at position seqlens[b] - Sq + s and attends causally
// to positions 0 .. seqlens[b] - Sq + s. score = scale · q·k, then, if softcap > 0,
// softcap · tanh(score / softcap); out = softmax(score) · V, in fp32, rounded once.
//
// Bad device-side inputs (a seqlen outside [Sq, capacity], capacity = Smax or
// max_pages · page_size; a block_table entry outside [0, num_pages) among the first
// ceil(seqlen / page_size) of its row):
//  * check_inputs = false (default, no sync, graph-capturable): nothing is read or written out
//    of bounds; the rows of the affected sequence are written as NaN (and their lse NaN).
//  * check_inputs = true: a device-side range check runs first, the call SYNCHRONIZES the
//    stream and throws tessel::Error (INVALID_ARGUMENT) naming the first bad batch row / page
//    entry and its value; nothing is written.
// Work split: the KV range of each (sequence, KV head) is split across CTAs (split-KV) when the
// batch alone does not fill the GPU (heuristic from the SM count), followed by a log-sum-exp
// combine kernel; partials live in a per-stream scratch buffer owned by tessel.
#pragma once

#include <cstdint>

#include "tessel/tensor.hpp"

namespace tessel {

struct DecodeParams {
  double scale = 0.0;    // 0: 1 / sqrt(D) (MLA: 1 / sqrt(512 + 64))
  double softcap = 0.0;  // 0: off
  // Paged cache when non-null: (B, max_pages) i32 device table; caches are then
  // (num_pages, page_size, Hkv, D) (MLA: (num_pages, page_size, 576)).
  const Tensor* block_table = nullptr;
  int num_splits = 0;  // KV splits per sequence; 0: heuristic from the SM count
  // The longest sequence the caller knows of (host side; 0: the cache capacity). Only the split
  // heuristic reads it, to size splits for the tokens actually cached: a short sequence in a
  // long cache then still spreads over the SMs. A wrong value costs speed, never correctness.
  int64_t max_seqlen = 0;
  bool check_inputs = false;  // range-check seqlens / block_table on the device and sync
};

void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& seqlens, Tensor& out, Tensor* lse, const DecodeParams& params,
                      cudaStream_t stream);

// Writes k_new/v_new (B, Sq, Hkv, D) into the caches at positions seqlens[b] - Sq + s (seqlens:
// lengths after the append, the same tensor decode_attention then reads). Caches contiguous
// (B, Smax, Hkv, D) or paged (num_pages, page_size, Hkv, D) with block_table (B, max_pages).
// Any D that is a multiple of 8. Out-of-range positions / pages are skipped (nothing written
// out of bounds); check_inputs = true range-checks, synchronizes and throws instead.
void append_kv(const Tensor& k_new, const Tensor& v_new, Tensor& k_cache, Tensor& v_cache,
               const Tensor* block_table, const Tensor& seqlens, bool check_inputs,
               cudaStream_t stream);

// MLA (DeepSeek-V2) decode, absorbed form, one latent "KV head" shared by all H query heads:
//   q_latent (B, Sq, H, 512), q_rope (B, Sq, H, 64), out (B, Sq, H, 512)
//   latent cache: paged (num_pages, page_size, 576) with params.block_table, or contiguous
//   (B, Smax, 576); each row is [c (512) | k_rope (64)].
//   score = scale · (q_latent·c + q_rope·k_rope); out = softmax(score) · c (the 512 latent dims).
// Causal among the Sq new tokens as in decode_attention, so Sq > 1 is also the (absorbed,
// compute-heavy but exact) MLA prefill of a chunk against the cache.
void mla_decode(const Tensor& q_latent, const Tensor& q_rope, const Tensor& latent_cache,
                const Tensor& seqlens, Tensor& out, Tensor* lse, const DecodeParams& params,
                cudaStream_t stream);

// Writes c_new (B, Sq, 576) into the latent cache (as append_kv, one tensor).
void append_latent(const Tensor& c_new, Tensor& latent_cache, const Tensor* block_table,
                   const Tensor& seqlens, bool check_inputs, cudaStream_t stream);

}  // namespace tessel
