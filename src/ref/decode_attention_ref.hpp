// float64 CPU references of decode attention, the KV append and MLA decode
// (include/tessel/decode_attention.hpp). Plain C++, dense row-major host arrays.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessel::ref {

struct DecodeRefConfig {
  int64_t batch = 0, sq = 0, hq = 0, hkv = 0;
  int64_t dqk = 0, dv = 0;  // score dims, value dims
  int64_t smax = 0;         // cache tokens per sequence (k, v below)
  double scale = 1.0;
  double softcap = 0.0;  // 0: off
};

// q (B, Sq, Hq, Dqk), k (B, Smax, Hkv, Dqk), v (B, Smax, Hkv, Dv); seqlens (B) include the Sq
// new tokens; new token s attends to positions 0 .. seqlens[b] - Sq + s. out (B, Sq, Hq, Dv),
// lse (B, Sq, Hq) natural log. Query head h reads KV head h / (Hq / Hkv).
void decode_attention(std::span<const double> q, std::span<const double> k,
                      std::span<const double> v, std::span<const int64_t> seqlens,
                      const DecodeRefConfig& cfg, std::vector<double>& out,
                      std::vector<double>& lse);

// Paged cache (num_pages, page_size, row) -> contiguous (B, max_pages · page_size, row) through
// block_table (B, max_pages); entries outside [0, num_pages) give zero rows.
std::vector<double> gather_pages(std::span<const double> pages, int64_t num_pages,
                                 int64_t page_size, int64_t row,
                                 std::span<const int64_t> block_table, int64_t batch,
                                 int64_t max_pages);

// MLA absorbed decode: q_latent (B, Sq, H, 512), q_rope (B, Sq, H, 64), cache (B, Smax, 576)
// rows [c | k_rope]; out (B, Sq, H, 512), lse (B, Sq, H).
void mla_decode(std::span<const double> q_latent, std::span<const double> q_rope,
                std::span<const double> cache, std::span<const int64_t> seqlens, int64_t batch,
                int64_t sq, int64_t heads, int64_t smax, double scale, std::vector<double>& out,
                std::vector<double>& lse);

// KV append: cache (B, Smax, H, D) (contiguous form; the paged form is checked through
// gather_pages) gets new (B, Sq, H, D) at positions seqlens[b] - Sq + s (skipped if outside
// [0, Smax)).
void append_kv(std::span<const double> new_rows, std::vector<double>& cache,
               std::span<const int64_t> seqlens, int64_t batch, int64_t sq, int64_t smax,
               int64_t row);

}  // namespace tessel::ref
