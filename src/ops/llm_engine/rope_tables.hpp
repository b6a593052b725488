// Device helpers of the LLM engine's GPU backend (src/llm/gpu_backend.cpp) that no public op
// covers: RoPE by caller-given cos/sin tables (the engine builds them on the host, with any
// frequency scaling, so that CPU and GPU rotate by identical angles).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessel::llm_engine {

// x: bf16 (rows, n_heads·head_dim) with row pitch ld (elements), rotated in place; cos/sin: f32
// (rows, rope_dim / 2) on the device. neox pairs (i, i + rope_dim/2), otherwise (gpt-j) pairs (2i,
// 2i + 1).
void rope_tables_bf16(void* x, int64_t rows, int64_t ld, int64_t n_heads, int64_t head_dim,
                      int64_t rope_dim, bool neox, const float* cos, const float* sin,
                      cudaStream_t stream);

// RoPE of a step's q and k heads fused with the KV-cache append (one launch instead of two).
// qk: bf16 rows of hq q heads then hkv k heads (head_dim each), pitch ld, rotated in place as
// rope_tables_bf16 does; the rotated k heads and v (hkv heads, pitch v_ld) are also written to the
// paged caches k_cache / v_cache ((pages, page_size, hkv·head_dim) bf16): row r = b·sq + s of the
// call goes to position seqlens[b] - sq + s through block_table[b·table_stride + pos / page_size]
// (rows whose position or page is out of range are not stored, as tessel::append_kv does).
struct RopeAppendArgs {
  void* qk;
  int64_t ld;
  const void* v;
  int64_t v_ld;
  int64_t rows;  // B·sq
  int hq, hkv, head_dim, rope_dim;
  bool neox;
  const float* cos;  // (rows, rope_dim / 2)
  const float* sin;
  void* k_cache;
  void* v_cache;
  int page_size, num_pages;
  const int32_t* seqlens;      // (B)
  const int32_t* block_table;  // (B, max_pages)
  int64_t table_stride;
  int max_pages;
  int sq;
};
void rope_append_bf16(const RopeAppendArgs& a, cudaStream_t stream);

}  // namespace tessel::llm_engine
