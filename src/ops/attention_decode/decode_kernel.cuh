// Decode attention kernel shared by GQA decode (decode_attention.cu) and MLA decode
// (mla_decode.cu), plus the split-KV combine kernel and the input range check.
//
// One CTA = (batch b, KV head, block of ROWS = 16·MT query rows, KV split). The query rows of a
// CTA are all (new token s, query head g) pairs of one KV group, row = s·group + g, so the
// group's query heads share every K/V byte the CTA streams (GQA; MLA is one group of H heads).
// KV tiles of TILE tokens stream through a STAGES-deep ring in shared memory, filled by TMA boxes
// of 64 dims x box_tokens tokens (128B swizzle; one mbarrier per stage; issued by the lanes of
// warp 0) or, where no tensor map could be made, by 16-byte zero-filling cp.async copies into
// the same layout. The paged form looks each token's page up one iteration ahead into a small
// shared table (page_of), so the issue does no division or dependent global load. Per tile
// (three barriers):
//   S phase   warps take (m-tile, 16-token slab) units: S = Q·Kᵀ with mma.sync m16n8k16
//             (Q and K fragments by ldmatrix from XOR-swizzled tiles), scale / soft-cap /
//             causal + length mask, per-slab row maxima to shared memory;
//   softmax   every thread forms the new running max of its rows from the slab maxima
//             (identical in all warps), P = exp2(S − m) goes to shared memory as f16/bf16,
//             running sums stay per unit in registers;
//   PV phase  warps own DV/NW output columns: O = O·α + P·V (V fragments by ldmatrix.trans;
//             MLA reads V as the first 512 columns of the same latent tile).
// Splits write fp32 partial O (normalized) and log2-sum-exp; combine_kernel merges them.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/bulk_copy.cuh"
#include "ops/rope_rotate.cuh"
#include "ops/rows.cuh"

namespace tessel::decode {

struct KernelArgs {
  // K and V caches as 4-d tensors (dims, KV heads, tokens per unit, units), units = sequences
  // (contiguous) or pages; boxes of (64, 1, box_tokens, 1) with the 128B swizzle. tma = 0: no
  // maps (cp.async loads). tmap_v is unused for MLA (V is the latent tile).
  CUtensorMap tmap_k, tmap_v;
  int tma;         // 1: TMA loads
  int box_tokens;  // tokens per box: divides the tile and the page size
  int row_boxes;   // 1: 5-d maps whose boxes hold whole rows (every 64-dim block) of box_tokens
  const void* q0;  // dims [0, DQ0)
  const void* q1;  // dims [DQ0, DQK) (MLA q_rope), else unused
  int64_t q0_sb, q0_ss, q0_sh, q1_sb, q1_ss, q1_sh;
  const void* k;
  const void* v;
  // contiguous: (batch, token, head) strides; paged: (page, token-in-page, head) strides
  int64_t k_sb, k_st, k_sh, v_sb, v_st, v_sh;
  const int32_t* block_table;  // null: contiguous
  int64_t bt_stride;
  int page_size, num_pages;
  const int32_t* seqlens;
  int64_t capacity;      // tokens a sequence may hold
  int64_t plan_len = 0;  // host only: the lengths the split heuristic plans for (0: capacity)
  void* out;
  int64_t o_sb, o_ss, o_sh;
  float* lse;     // (B, Sq, Hq) or null (written only without splits)
  float* part_o;  // (splits, B·Sq·Hq, DV) or null: no splits
  float* part_lse;
  // Merge in the kernel (null: combine launch): one counter per (sequence, KV head, row block)
  // in the stream's zeroed workspace (runtime/workspace.hpp); the last split CTA to finish
  // merges the partials and resets its counter to zero.
  unsigned* tickets;
  int batch, sq, hq, hkv, group, rows_total, row_blocks, num_splits;
  float scale_log2;      // scale·log2(e) (no softcap)
  float scale_over_cap;  // scale / softcap
  float cap_log2;        // softcap·log2(e); 0: no softcap
  // RoPE and the cache append fused in front (the engine's decode steps; GQA only; rope_half >
  // 0): q0 holds the q rows before rotation, rotated while staged; the Sq new tokens' k (not
  // rotated) and v rows come from new_k / new_v ((b, s, KV head) strides) and are written, k
  // rotated, into the cache at positions len − Sq + s by the CTAs whose range holds them before
  // any tile is loaded — what llm_engine::rope_append writes, bit for bit (rope_rotate).
  const float* rope_cos;  // (B·Sq, rope_half) f32, row b·Sq + s
  const float* rope_sin;
  int rope_half;  // rotated pairs per head, a multiple of 8 (0: no rotation and no append)
  int rope_neox;  // 1: pairs (i, i + rope_half); 0: (2i, 2i + 1)
  const void* new_k;
  const void* new_v;
  int64_t nk_sb, nk_ss, nk_sh, nv_sb, nv_ss, nv_sh;
};

// ---- PTX wrappers ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
using ::tessel::detail::mbar_arrive_expect_tx;  // mbarriers: ops/bulk_copy.cuh
using ::tessel::detail::mbar_init;
using ::tessel::detail::mbar_init_fence;
using ::tessel::detail::mbar_wait;
// Box (c0 .. c0+63, c1, c2 .. c2+box_tokens-1, c3) of a 4-d tensor map into shared memory.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}
// Box (c0 .. c0+63, c1 .., c2 .., c3, c4) of a 5-d tensor map into shared memory.
__device__ __forceinline__ void tma_load_5d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, int c4, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
template <class T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    memcpy(&r, &h, 4);
  } else {
    __half2 h = __floats2half2_rn(x, y);
    memcpy(&r, &h, 4);
  }
  return r;
}

// 16-byte chunk index of (row, chunk) in a tile of CPR chunks per row: XOR swizzle so that the
// 8 rows one ldmatrix phase reads at the same logical chunk hit 8 different bank groups.
template <int CPR>
__device__ __forceinline__ int swz(int row, int c) {
  if constexpr (CPR % 8 == 0) {
    return row * CPR + (c ^ (row & 7));
  } else {
    static_assert(CPR == 4, "rows of 4 or a multiple of 8 chunks");
    const int l = row * CPR + c;
    return l ^ ((l >> 3) & 7);
  }
}

// 16-byte chunk index of (token t, chunk c) in a K or V stage tile: blocks of 64 dims (8 chunks)
// of TILE rows of 128 bytes, chunk c % 8 at (c % 8) ^ (t % 8) — the layout a TMA box with the
// 128B swizzle writes (block bases 1024-byte aligned), conflict-free for ldmatrix.
// SUB < TILE (paged caches of 16-token boxes): the tile is TILE / SUB sub-blocks of SUB tokens,
// each holding all CPR / 8 blocks of 64 dims, [token / SUB][c / 8][token % SUB] — what one TMA box
// of SUB tokens x the whole row writes (set_kv_maps' 5-d map); the same swizzle.
template <int TILE, int SUB = TILE, int CPR = 8>
__device__ __forceinline__ int kv_idx(int t, int c) {
  if constexpr (SUB == TILE)
    return (c >> 3) * (TILE * 8) + t * 8 + ((c & 7) ^ (t & 7));
  else
    return (t / SUB) * (SUB * CPR) + (c >> 3) * (SUB * 8) + (t % SUB) * 8 + ((c & 7) ^ (t & 7));
}

template <class T_, int DQK_, int DQ0_, int DV_, bool KV_SHARED_, int MT_, int NW_, int TILE_,
          int STAGES_, bool PAGED_, int KSPLIT_ = 1, int SUB_ = 0>
struct Cfg {
  using T = T_;
  static constexpr int DQK = DQK_, DQ0 = DQ0_, DV = DV_, MT = MT_, NW = NW_, TILE = TILE_,
                       STAGES = STAGES_;
  static constexpr bool KV_SHARED = KV_SHARED_, PAGED = PAGED_;
  static constexpr int ROWS = 16 * MT, THREADS = 32 * NW;
  static constexpr int CPR_K = DQK / 8, CPR_V = DV / 8, CPR_P = TILE / 8;
  static constexpr int SLABS = TILE / 16, UNITS = SLABS * MT, UPW = (UNITS + NW - 1) / NW;
  static constexpr int COLS = DV / NW, NT_PV = COLS / 8;
  // KSPLIT > 1: fewer S units than warps; every warp takes 1/KSPLIT of the QK dims of one unit
  // and the partial S fragments meet in shared memory (MLA: 576 dims, 2 units, 8 warps).
  static constexpr int KSPLIT = KSPLIT_;
  // SUB_ > 0 (paged GQA): K / V tiles in sub-blocks of SUB tokens (kv_idx), one TMA box per
  // sub-block and cache; the host sets this configuration's maps for SUB-token boxes.
  static constexpr int SUB = SUB_ > 0 ? SUB_ : TILE;
  static constexpr int STAGE_CHUNKS = TILE * (CPR_K + (KV_SHARED ? 0 : CPR_V));
  // Q | stages | P | slab reductions | page table | S partials | stage barriers | flag. Q and
  // every stage are multiples of 1024 bytes (the TMA swizzle's alignment).
  static constexpr size_t SMEM = 16ull * (ROWS * CPR_K + STAGES * STAGE_CHUNKS + ROWS * CPR_P) +
                                 4ull * SLABS * ROWS + (PAGED ? 8ull * STAGES * TILE : 0) +
                                 4ull * (KSPLIT - 1) * UNITS * 8 * 32 + 8ull * STAGES + 8;
  static_assert((ROWS * CPR_K) % 64 == 0 && STAGE_CHUNKS % 64 == 0);
  static_assert(CPR_K % 8 == 0 && CPR_V % 8 == 0 && TILE % 16 == 0);
  static_assert(!PAGED || TILE <= THREADS);
  static_assert(DQK % 16 == 0 && DV % 16 == 0 && TILE % 16 == 0 && NT_PV % 2 == 0);
  static_assert(!KV_SHARED || DV <= DQK);
  static_assert(KSPLIT == 1 || (UNITS * KSPLIT == NW && DQK / 16 >= KSPLIT));
  static_assert(SUB == TILE || (PAGED && !KV_SHARED && TILE % SUB == 0 && SUB % 8 == 0));
};

// (page, slot in page) of token pos of sequence b; page -1 past the end of the range (the load
// zero-fills) or for an out-of-range block-table entry (which also sets `bad`).
__device__ __forceinline__ int2 page_of(const KernelArgs& a, int b, int pos, int end, bool& bad) {
  int2 r = make_int2(-1, 0);
  if (pos < end) {
    const int j = pos / a.page_size;
    const int pg = a.block_table[b * a.bt_stride + j];
    if (pg < 0 || pg >= a.num_pages)
      bad = true;
    else
      r = make_int2(pg, pos - j * a.page_size);
  }
  return r;
}

// The tokens [begin, end) of KV split `split` of sequence b in tiles of TILE tokens, and the
// order the tiles are processed in: the i-th is tile (i + rot) mod ntiles of the range. Every
// decode kernel uses it, so that every KV head / row block of (b, split), paged and contiguous
// caches and every kernel see the same tiles in the same order (bit-identical results); the
// hashed start spreads the concurrent CTAs over the cache instead of walking all sequences in
// lockstep at the same offset (equal offsets of power-of-two sized sequences collide in the
// same DRAM channels). `bad`: a length below Sq or above the capacity (no tiles then).
template <int TILE>
struct SplitRange {
  int len_ok, begin, end, ntiles, rot;
  bool bad;
  // First token of the i-th processed tile; `end` (nothing valid) for i >= ntiles.
  __device__ __forceinline__ int start(int i) const {
    if (i >= ntiles) return end;
    int t = i + rot;
    if (t >= ntiles) t -= ntiles;
    return begin + t * TILE;
  }
};
template <int TILE>
__device__ __forceinline__ SplitRange<TILE> split_range(const KernelArgs& a, int b, int split) {
  SplitRange<TILE> r;
  const int len = a.seqlens[b];
  r.bad = len < a.sq || static_cast<int64_t>(len) > a.capacity;
  r.len_ok = r.bad ? 0 : len;
  const int per_split = (r.len_ok + a.num_splits - 1) / a.num_splits;
  const int chunk = (per_split + TILE - 1) / TILE * TILE;
  r.begin = split * chunk;
  r.end = min(r.begin + chunk, r.len_ok);
  r.ntiles = r.end > r.begin ? (r.end - r.begin + TILE - 1) / TILE : 0;
  r.rot = 0;
  if (r.ntiles > 1)
    r.rot = static_cast<int>(((static_cast<uint32_t>(b) * 0x9E3779B1u) ^
                              (static_cast<uint32_t>(split) * 0x85EBCA77u)) >>
                             8) %
            r.ntiles;
  return r;
}

// Whether a page of the range's tokens is out of range in the block table (thread `tid` of
// `threads` checks every threads-th page; the caller reduces over the CTA).
template <int TILE>
__device__ __forceinline__ bool range_has_bad_page(const KernelArgs& a, int b,
                                                   const SplitRange<TILE>& r, int tid,
                                                   int threads) {
  bool bad = false;
  if (r.end > r.begin)
    for (int j = r.begin / a.page_size + tid; j <= (r.end - 1) / a.page_size; j += threads) {
      const int pg = a.block_table[b * a.bt_stride + j];
      if (pg < 0 || pg >= a.num_pages) bad = true;
    }
  return bad;
}

template <class T, int DV>
__device__ __forceinline__ void combine_row_serial(const KernelArgs& a, int64_t row_id, int lane);

// True in the last of the num_splits CTAs that share a ticket (a threadfence reduction: each
// releases its partials and takes a ticket; the last one resets the ticket for the next call,
// or graph replay, and acquires the others' partials). `sync` joins the CTA's threads that
// wrote partials (__syncthreads, or a named barrier of the consumer warps); `flag` is the shared
// word the leader thread publishes through; `ticket()` gives the ticket's address, computed by
// the leader only (an address formed before the fence stayed live across it: +16 bytes of
// spill in the D = 64 decode kernel).
template <class Flag, class Sync, class Ticket>
__device__ __forceinline__ bool last_split_arrives(int num_splits, bool leader, Flag* flag,
                                                   Sync sync, Ticket ticket) {
  __threadfence();
  sync();
  if (leader) {
    unsigned* t = ticket();
    const bool last = atomicAdd(t, 1u) == static_cast<unsigned>(num_splits - 1);
    if (last) *t = 0u;
    *flag = last;
  }
  sync();
  if (!*flag) return false;
  __threadfence();
  return true;
}

// 16-byte chunk c of a head row (`head`: its first element) of call row `row` (b·Sq + s), rotated
// by a.rope_cos / a.rope_sin where it holds rotary dims (the fused RoPE, see KernelArgs).
template <class T>
__device__ __forceinline__ uint4 rope_chunk(const KernelArgs& a, const T* head, int c,
                                            int64_t row) {
  const uint4 x = __ldg(reinterpret_cast<const uint4*>(head + c * 8));
  if (c * 8 >= 2 * a.rope_half) return x;
  const float* cs = a.rope_cos + row * a.rope_half;
  const float* sn = a.rope_sin + row * a.rope_half;
  uint4 r;
  const T* xv = reinterpret_cast<const T*>(&x);
  T* rv = reinterpret_cast<T*>(&r);
  if (a.rope_neox) {
    const int hc = a.rope_half / 8;
    const bool first = c < hc;  // pairs (i, i + rope_half): the partner is hc chunks away
    const int pc = first ? c + hc : c - hc;
    const uint4 pr = __ldg(reinterpret_cast<const uint4*>(head + pc * 8));
    const T* pv = reinterpret_cast<const T*>(&pr);
    const int i0 = (first ? c : pc) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float cc = __ldg(cs + i0 + j), ss = __ldg(sn + i0 + j);
      const float xs = static_cast<float>(xv[j]), xp = static_cast<float>(pv[j]);
      rv[j] = static_cast<T>(first ? ::tessel::detail::rope_rotate(xs, xp, cc, ss).x
                                   : ::tessel::detail::rope_rotate(xp, xs, cc, ss).y);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = c * 4 + j;
      const float2 y = ::tessel::detail::rope_rotate(static_cast<float>(xv[2 * j]),
                                                     static_cast<float>(xv[2 * j + 1]),
                                                     __ldg(cs + i), __ldg(sn + i));
      rv[2 * j] = static_cast<T>(y.x);
      rv[2 * j + 1] = static_cast<T>(y.y);
    }
  }
  return r;
}

template <class C>
__global__ void __launch_bounds__(C::THREADS) decode_kernel(const __grid_constant__ KernelArgs a) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  using T = typename C::T;
  constexpr int ROWS = C::ROWS, MT = C::MT, NW = C::NW, TILE = C::TILE, STAGES = C::STAGES;
  constexpr int CPR_K = C::CPR_K, CPR_V = C::CPR_V, CPR_P = C::CPR_P, SLABS = C::SLABS;
  constexpr int UNITS = C::UNITS, UPW = C::UPW, NT_PV = C::NT_PV;
  extern __shared__ __align__(1024) uint4 smem[];
  uint4* s_q = smem;
  uint4* s_kv = s_q + ROWS * CPR_K;
  uint4* s_p = s_kv + STAGES * C::STAGE_CHUNKS;
  float* s_red = reinterpret_cast<float*>(s_p + ROWS * CPR_P);
  // Paged: (page, slot) of every token of the tiles in flight, resolved one iteration before
  // the tile's loads are issued (the block-table latency hides behind a tile of compute).
  int2* s_pg = reinterpret_cast<int2*>(s_red + SLABS * ROWS);
  float* s_spart = reinterpret_cast<float*>(s_pg + (C::PAGED ? STAGES * TILE : 0));
  constexpr int KSPLIT = C::KSPLIT;
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_spart + (KSPLIT - 1) * UNITS * 8 * 32);
  bool* s_last = reinterpret_cast<bool*>(s_full + STAGES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rb = blockIdx.x % a.row_blocks, split = blockIdx.x / a.row_blocks;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const SplitRange<TILE> range = split_range<TILE>(a, b, split);
  bool bad = range.bad;
  const int len_ok = range.len_ok, begin = range.begin, end = range.end, ntiles = range.ntiles;
  // TMA for ranges of >= 4 tiles (the stream of a long cache); a range of 1-3 tiles (engine
  // decode: one tile per split) is latency-bound and keeps cp.async. The boxes need the stages
  // 1024-byte aligned (so without static shared memory; cp.async stays correct otherwise).
  const bool use_tma = a.tma != 0 && ntiles >= 4 && (smem_u32(smem) & 1023u) == 0;
  auto tile_start = [&](int i) { return range.start(i); };

  // ---- Q rows of this CTA into shared memory (zero rows past rows_total) ----
  for (int idx = tid; idx < ROWS * CPR_K; idx += C::THREADS) {
    const int r = idx / CPR_K, c = idx - r * CPR_K;
    const int grow = rb * ROWS + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (grow < a.rows_total) {
      const int s = grow / a.group, hq = kvh * a.group + (grow - s * a.group);
      const T* src;
      if (c < C::DQ0 / 8)
        src = static_cast<const T*>(a.q0) + b * a.q0_sb + s * a.q0_ss + hq * a.q0_sh + c * 8;
      else
        src = static_cast<const T*>(a.q1) + b * a.q1_sb + s * a.q1_ss + hq * a.q1_sh +
              (c - C::DQ0 / 8) * 8;
      if (!C::KV_SHARED && a.rope_half > 0)
        v = rope_chunk<T>(a, src - c * 8, c, static_cast<int64_t>(b) * a.sq + s);
      else
        v = __ldg(reinterpret_cast<const uint4*>(src));
    }
    s_q[swz<CPR_K>(r, c)] = v;
  }
  if constexpr (!C::KV_SHARED) {
    // The fused append: this range's new tokens (positions len − Sq .. len − 1) into the cache,
    // k rotated, before the loads below read them back (visible to them at the barrier below;
    // the fence orders the stores before TMA reads too).
    const int first_new = len_ok - a.sq;
    const int p0 = max(begin, max(first_new, 0));
    const int n_new = a.rope_half > 0 && end > p0 ? end - p0 : 0;
    for (int idx = tid; idx < n_new * 2 * CPR_K; idx += C::THREADS) {
      const int pos = p0 + idx / (2 * CPR_K), rem = idx % (2 * CPR_K);
      const bool isv = rem >= CPR_K;
      const int c = isv ? rem - CPR_K : rem, s = pos - first_new;
      T* dst;
      if constexpr (C::PAGED) {
        const int j = pos / a.page_size;
        const int pg = a.block_table[b * a.bt_stride + j];
        if (pg < 0 || pg >= a.num_pages) continue;  // (`bad` is set by the tile's page lookup)
        dst = const_cast<T*>(static_cast<const T*>(isv ? a.v : a.k)) +
              pg * (isv ? a.v_sb : a.k_sb) + (pos - j * a.page_size) * (isv ? a.v_st : a.k_st) +
              kvh * (isv ? a.v_sh : a.k_sh);
      } else {
        dst = const_cast<T*>(static_cast<const T*>(isv ? a.v : a.k)) + b * (isv ? a.v_sb : a.k_sb) +
              static_cast<int64_t>(pos) * (isv ? a.v_st : a.k_st) + kvh * (isv ? a.v_sh : a.k_sh);
      }
      const uint4 val =
          isv ? __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.new_v) + b * a.nv_sb +
                                                     s * a.nv_ss + kvh * a.nv_sh + c * 8))
              : rope_chunk<T>(
                    a, static_cast<const T*>(a.new_k) + b * a.nk_sb + s * a.nk_ss + kvh * a.nk_sh,
                    c, static_cast<int64_t>(b) * a.sq + s);
      *reinterpret_cast<uint4*>(dst + c * 8) = val;
    }
    if (n_new > 0) {
      __threadfence();
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
  }
  if (use_tma && tid == 0) {
    for (int st = 0; st < STAGES; ++st) mbar_init(s_full + st, 32);  // warp 0's lanes arrive
    mbar_init_fence();
  }

  auto load_tile = [&](int stage, int t0) {
    uint4* sk = s_kv + stage * C::STAGE_CHUNKS;
    const int2* pg = s_pg + stage * TILE;
    if (use_tma) {
      // Warp 0's lanes issue the boxes (64 dims x box_tokens tokens) of the tile's K and V
      // blocks; boxes wholly past the end (or on a bad page) are skipped, their rows zeroed
      // after the wait. Each lane announces its bytes before its copies.
      if (warp != 0) return;
      constexpr int HK = C::DQK / 64, HV = C::KV_SHARED ? 0 : C::DV / 64;
      const int bt = a.box_tokens, per_half = TILE / bt, nb = per_half * (HK + HV);
      auto box_at = [&](int u, int& c2, int& c3) {  // false: nothing to load
        if constexpr (C::PAGED) {
          const int2 e = pg[u * bt];
          c2 = e.y;
          c3 = e.x;
          return e.x >= 0;
        } else {
          c2 = t0 + u * bt;
          c3 = b;
          return c2 < end;
        }
      };
      if (C::SUB < TILE || (!C::KV_SHARED && a.row_boxes)) {
        // One box per sub-block and cache: SUB tokens x every 64-dim block of the row (SUB =
        // TILE without sub-blocks: one box per cache, landing in the same layout as the
        // 64-dim boxes).
        constexpr int kPer = TILE / C::SUB, kBoxes = 2 * kPer;
        uint32_t sub_bytes = 0;
        for (int j = lane; j < kBoxes; j += 32) {
          int c2, c3;
          if (box_at(j % kPer, c2, c3))
            sub_bytes += static_cast<uint32_t>(C::SUB) * 16u * (j < kPer ? CPR_K : CPR_V);
        }
        mbar_arrive_expect_tx(s_full + stage, sub_bytes);
        char* sub_base = reinterpret_cast<char*>(sk);
        for (int j = lane; j < kBoxes; j += 32) {
          const int u = j % kPer;
          const bool isv = j >= kPer;
          int c2, c3;
          if (!box_at(u, c2, c3)) continue;
          tma_load_5d(
              sub_base + (isv ? TILE * CPR_K * 16 : 0) + u * C::SUB * (isv ? CPR_V : CPR_K) * 16,
              isv ? &a.tmap_v : &a.tmap_k, 0, c2, 0, kvh, c3, s_full + stage);
        }
        return;
      }
      uint32_t bytes = 0;
      for (int j = lane; j < nb; j += 32) {
        int c2, c3;
        if (box_at(j % per_half, c2, c3)) bytes += static_cast<uint32_t>(bt) * 128u;
      }
      mbar_arrive_expect_tx(s_full + stage, bytes);
      char* base = reinterpret_cast<char*>(sk);
      for (int j = lane; j < nb; j += 32) {
        const int u = j % per_half, hh = j / per_half;
        int c2, c3;
        if (!box_at(u, c2, c3)) continue;
        const bool isv = hh >= HK;
        const int h = isv ? hh - HK : hh;
        tma_load_4d(base + (isv ? TILE * CPR_K * 16 : 0) + h * TILE * 128 + u * bt * 128,
                    isv ? &a.tmap_v : &a.tmap_k, h * 64, kvh, c2, c3, s_full + stage);
      }
      return;
    }
    // Row start of token t of the tile in a cache (nullptr: zero-fill).
    auto row_of = [&](const void* base, int64_t sb, int64_t st, int64_t sh, int t) -> const T* {
      if constexpr (C::PAGED) {
        const int2 e = pg[t];
        if (e.x < 0) return nullptr;
        return static_cast<const T*>(base) + e.x * sb + e.y * st + kvh * sh;
      } else {
        if (t0 + t >= end) return nullptr;
        return static_cast<const T*>(base) + b * sb + static_cast<int64_t>(t0 + t) * st + kvh * sh;
      }
    };
    constexpr int kRowsPerPass = C::THREADS / CPR_K;
    if constexpr (!C::KV_SHARED && CPR_K == CPR_V && C::THREADS % CPR_K == 0 &&
                  TILE % kRowsPerPass == 0) {
      // K and V rows of the same token in one pass: each thread keeps its 16-byte column c and
      // resolves each of its tokens (page entry, bounds) once for both caches — the same
      // chunk-to-thread map as the two loops below, fewer shared loads and address math.
      const int c = tid % CPR_K;
      uint4* sv = sk + TILE * CPR_K;
#pragma unroll
      for (int t = tid / CPR_K; t < TILE; t += kRowsPerPass) {
        const T* krow;
        const T* vrow;
        if constexpr (C::PAGED) {
          const int2 e = pg[t];
          krow = e.x < 0 ? nullptr
                         : static_cast<const T*>(a.k) + e.x * a.k_sb + e.y * a.k_st + kvh * a.k_sh;
          vrow = e.x < 0 ? nullptr
                         : static_cast<const T*>(a.v) + e.x * a.v_sb + e.y * a.v_st + kvh * a.v_sh;
        } else {
          const bool in = t0 + t < end;
          const int64_t pos = t0 + t;
          krow =
              in ? static_cast<const T*>(a.k) + b * a.k_sb + pos * a.k_st + kvh * a.k_sh : nullptr;
          vrow =
              in ? static_cast<const T*>(a.v) + b * a.v_sb + pos * a.v_st + kvh * a.v_sh : nullptr;
        }
        cp_async16(sk + kv_idx<TILE, C::SUB, CPR_K>(t, c), krow ? krow + c * 8 : a.k,
                   krow != nullptr);
        cp_async16(sv + kv_idx<TILE, C::SUB, CPR_V>(t, c), vrow ? vrow + c * 8 : a.v,
                   vrow != nullptr);
      }
    } else if constexpr (C::KV_SHARED && C::THREADS % TILE == 0 &&
                         CPR_K % (C::THREADS / TILE) == 0) {
      // One latent tile (MLA): kThreadsPerToken threads per token, each resolving its token's
      // row once and copying every kThreadsPerToken-th chunk (each group of 8 lanes covers
      // 128 contiguous bytes of one row), instead of a page lookup and address per chunk.
      constexpr int kThreadsPerToken = C::THREADS / TILE;
      const int t = tid / kThreadsPerToken;
      const T* row = row_of(a.k, a.k_sb, a.k_st, a.k_sh, t);
#pragma unroll
      for (int c = tid % kThreadsPerToken; c < CPR_K; c += kThreadsPerToken)
        cp_async16(sk + kv_idx<TILE, C::SUB, CPR_K>(t, c), row ? row + c * 8 : a.k, row != nullptr);
    } else {
      for (int idx = tid; idx < TILE * CPR_K; idx += C::THREADS) {
        const int t = idx / CPR_K, c = idx - t * CPR_K;
        const T* row = row_of(a.k, a.k_sb, a.k_st, a.k_sh, t);
        cp_async16(sk + kv_idx<TILE, C::SUB, CPR_K>(t, c), row ? row + c * 8 : a.k, row != nullptr);
      }
      if constexpr (!C::KV_SHARED) {
        uint4* sv = sk + TILE * CPR_K;
        for (int idx = tid; idx < TILE * CPR_V; idx += C::THREADS) {
          const int t = idx / CPR_V, c = idx - t * CPR_V;
          const T* row = row_of(a.v, a.v_sb, a.v_st, a.v_sh, t);
          cp_async16(sv + kv_idx<TILE, C::SUB, CPR_V>(t, c), row ? row + c * 8 : a.v,
                     row != nullptr);
        }
      }
    }
  };

  // Causal limit (inclusive) of this thread's rows: row mt*16 + lane/4 + 8h.
  int limit[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int grow = rb * ROWS + mt * 16 + (lane >> 2) + 8 * h;
      limit[mt][h] = grow < a.rows_total ? len_ok - a.sq + grow / a.group : -1;
    }

  float m_run[MT][2], o[MT][NT_PV][4], l_part[UPW][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT_PV; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
#pragma unroll
  for (int u = 0; u < UPW; ++u) l_part[u][0] = l_part[u][1] = 0.f;

  if constexpr (C::PAGED) {  // pages of tiles 0 .. STAGES-1 (slot = tile % STAGES)
    for (int idx = tid; idx < STAGES * TILE; idx += C::THREADS)
      s_pg[idx] = page_of(a, b, tile_start(idx / TILE) + idx % TILE, end, bad);
  }
  __syncthreads();  // page table, stage barriers
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < ntiles) load_tile(st, tile_start(st));
    cp_async_commit();
  }

  const int lrow = lane & 7, lmat = lane >> 3;
  for (int it = 0; it < ntiles; ++it) {
    const int t0 = tile_start(it);
    if (use_tma) {
      mbar_wait(s_full + it % STAGES, (it / STAGES) & 1);
      // V rows past the end hold stale bytes (skipped boxes, or the rest of a box): zeros, so
      // that P = 0 times them stays 0 (K rows past the end are masked in S).
      const int valid = end - t0;
      if (valid < TILE) {
        uint4* sv = s_kv + (it % STAGES) * C::STAGE_CHUNKS + (C::KV_SHARED ? 0 : TILE * CPR_K);
        for (int idx = tid; idx < (TILE - valid) * CPR_V; idx += C::THREADS)
          sv[kv_idx<TILE, C::SUB, CPR_V>(valid + idx / CPR_V, idx % CPR_V)] =
              make_uint4(0, 0, 0, 0);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before the next TMA
      }
    } else {
      cp_async_wait<STAGES - 2>();
    }
    __syncthreads();  // tile `it` visible; tile it-1 fully consumed
    {
      const int nx = it + STAGES - 1;
      if (nx < ntiles) load_tile(nx % STAGES, tile_start(nx));
      cp_async_commit();
    }
    // Pages of tile it + STAGES: looked up now, stored after this tile's compute into the slot
    // of tile `it` (its loads were issued long ago).
    int2 next_pg = make_int2(-1, 0);
    if (C::PAGED && tid < TILE) next_pg = page_of(a, b, tile_start(it + STAGES) + tid, end, bad);
    const uint4* s_k = s_kv + (it % STAGES) * C::STAGE_CHUNKS;
    const uint4* s_v = C::KV_SHARED ? s_k : s_k + TILE * CPR_K;

    // ---- S phase ----
    float sacc[UPW][2][4];
#pragma unroll
    for (int u = 0; u < UPW; ++u) {
      const int unit = KSPLIT > 1 ? warp % UNITS : warp + u * NW;
      if (KSPLIT == 1 && UNITS % NW != 0 && unit >= UNITS) continue;
      const int ks = KSPLIT > 1 ? warp / UNITS : 0;
      const int slab = unit % SLABS, mt = unit / SLABS;
      int lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int l0 = limit[0][h];
#pragma unroll
        for (int j = 1; j < MT; ++j)
          if (j == mt) l0 = limit[j][h];
        lim[h] = l0;
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
        sacc[u][n][0] = sacc[u][n][1] = sacc[u][n][2] = sacc[u][n][3] = 0.f;
      constexpr int KSTEPS = C::DQK / 16;
#pragma unroll 4
      for (int kk = ks * KSTEPS / KSPLIT; kk < (ks + 1) * KSTEPS / KSPLIT; ++kk) {
        uint32_t kb[4], qa[4];
        ldsm_x4(kb, s_k + kv_idx<TILE, C::SUB, CPR_K>(slab * 16 + (lmat >> 1) * 8 + lrow,
                                                      2 * kk + (lmat & 1)));
        ldsm_x4(qa, s_q + swz<CPR_K>(mt * 16 + (lmat & 1) * 8 + lrow, 2 * kk + (lmat >> 1)));
        mma16816<T>(sacc[u][0], qa, kb[0], kb[1]);
        mma16816<T>(sacc[u][1], qa, kb[2], kb[3]);
      }
      if constexpr (KSPLIT > 1) {  // warps ks > 0 hand their partial S to the unit's warp ks = 0
        if (ks > 0) {
          float* dst = s_spart + ((ks - 1) * UNITS + unit) * 256 + lane;
#pragma unroll
          for (int e = 0; e < 8; ++e) dst[e * 32] = sacc[u][e >> 2][e & 3];
        }
        __syncthreads();
        if (ks > 0) continue;
#pragma unroll
        for (int j = 1; j < KSPLIT; ++j) {
          const float* src = s_spart + ((j - 1) * UNITS + unit) * 256 + lane;
#pragma unroll
          for (int e = 0; e < 8; ++e) sacc[u][e >> 2][e & 3] += src[e * 32];
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          const int pos = t0 + slab * 16 + n * 8 + 2 * (lane & 3) + (e & 1);
          float x = sacc[u][n][e];
          x = a.cap_log2 > 0.f ? a.cap_log2 * tanhf(x * a.scale_over_cap) : x * a.scale_log2;
          if (pos > lim[h] || pos >= end) x = -INFINITY;
          sacc[u][n][e] = x;
          mx[h] = fmaxf(mx[h], x);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if ((lane & 3) == 0) s_red[slab * ROWS + mt * 16 + (lane >> 2) + 8 * h] = mx[h];
      }
    }
    __syncthreads();  // slab maxima visible

    // ---- running max, P, rescale ----
    float alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mt * 16 + (lane >> 2) + 8 * h;
        float tm = -INFINITY;
#pragma unroll
        for (int sl = 0; sl < SLABS; ++sl) tm = fmaxf(tm, s_red[sl * ROWS + row]);
        const float mn = fmaxf(m_run[mt][h], tm);
        alpha[mt][h] = mn == -INFINITY ? 1.f : tile::exp2_ftz(m_run[mt][h] - mn);
        m_run[mt][h] = mn;
      }
#pragma unroll
    for (int u = 0; u < UPW; ++u) {
      const int unit = warp + u * NW;
      if (UNITS % NW != 0 && unit >= UNITS) continue;
      const int slab = unit % SLABS, mt = unit / SLABS;
      float mrow[2], arow[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mrow[h] = m_run[0][h];
        arow[h] = alpha[0][h];
#pragma unroll
        for (int j = 1; j < MT; ++j)
          if (j == mt) {
            mrow[h] = m_run[j][h];
            arow[h] = alpha[j][h];
          }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m = mrow[h] == -INFINITY ? 0.f : mrow[h];
        const int row = mt * 16 + (lane >> 2) + 8 * h;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float p0 = tile::exp2_ftz(sacc[u][n][2 * h] - m),
                      p1 = tile::exp2_ftz(sacc[u][n][2 * h + 1] - m);
          sum += p0 + p1;
          const int tok = slab * 16 + n * 8 + 2 * (lane & 3);
          uint32_t* dst =
              reinterpret_cast<uint32_t*>(s_p + swz<CPR_P>(row, tok >> 3)) + ((tok & 7) >> 1);
          *dst = pack2<T>(p0, p1);
        }
        l_part[u][h] = l_part[u][h] * arow[h] + sum;
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT_PV; ++n) {
        o[mt][n][0] *= alpha[mt][0];
        o[mt][n][1] *= alpha[mt][0];
        o[mt][n][2] *= alpha[mt][1];
        o[mt][n][3] *= alpha[mt][1];
      }
    __syncthreads();  // P visible

    // ---- PV phase: this warp's DV/NW columns ----
#pragma unroll
    for (int j = 0; j < TILE / 16; ++j) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4(pa[mt], s_p + swz<CPR_P>(mt * 16 + (lmat & 1) * 8 + lrow, 2 * j + (lmat >> 1)));
#pragma unroll
      for (int np = 0; np < NT_PV / 2; ++np) {
        uint32_t vb[4];
        const int c0 = warp * (C::COLS / 8) + 2 * np;
        ldsm_x4_t(vb, s_v + kv_idx<TILE, C::SUB, CPR_V>(16 * j + (lmat & 1) * 8 + lrow,
                                                        c0 + (lmat >> 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o[mt][2 * np], pa[mt], vb[0], vb[1]);
          mma16816<T>(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    if (C::PAGED && tid < TILE) s_pg[(it % STAGES) * TILE + tid] = next_pg;
  }
  cp_async_wait<0>();

  // ---- row sums across slabs ----
#pragma unroll
  for (int u = 0; u < UPW; ++u) {
    const int unit = warp + u * NW;
    if (UNITS % NW != 0 && unit >= UNITS) continue;
    const int slab = unit % SLABS, mt = unit / SLABS;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_part[u][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if ((lane & 3) == 0) s_red[slab * ROWS + mt * 16 + (lane >> 2) + 8 * h] = l;
    }
  }
  bad = __syncthreads_or(bad);

  const int rows_global = a.batch * a.sq * a.hq;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mt * 16 + (lane >> 2) + 8 * h;
      const int grow = rb * ROWS + row;
      if (grow >= a.rows_total) continue;
      float l = 0.f;
#pragma unroll
      for (int sl = 0; sl < SLABS; ++sl) l += s_red[sl * ROWS + row];
      const int s = grow / a.group, hq = kvh * a.group + (grow - s * a.group);
      const int64_t row_id = (static_cast<int64_t>(b) * a.sq + s) * a.hq + hq;
      const float inv = bad ? __int_as_float(0x7fffffff) : (l > 0.f ? 1.f / l : 0.f);
      const float lse2 =
          bad ? __int_as_float(0x7fffffff) : (l > 0.f ? m_run[mt][h] + log2f(l) : -INFINITY);
      if (a.part_o == nullptr) {
        T* dst = static_cast<T*>(a.out) + b * a.o_sb + s * a.o_ss + hq * a.o_sh;
#pragma unroll
        for (int n = 0; n < NT_PV; ++n) {
          const int col = warp * C::COLS + n * 8 + 2 * (lane & 3);
          *reinterpret_cast<uint32_t*>(dst + col) =
              pack2<T>(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        }
        if (a.lse != nullptr && warp == 0 && (lane & 3) == 0)
          a.lse[row_id] = lse2 * 0.69314718055994531f;
      } else {
        const int64_t prow = static_cast<int64_t>(split) * rows_global + row_id;
        float* dst = a.part_o + prow * C::DV;
        if (!(lse2 == -INFINITY)) {
#pragma unroll
          for (int n = 0; n < NT_PV; ++n) {
            const int col = warp * C::COLS + n * 8 + 2 * (lane & 3);
            *reinterpret_cast<float2*>(dst + col) =
                make_float2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
          }
        }
        if (warp == 0 && (lane & 3) == 0) a.part_lse[prow] = lse2;
      }
    }
  if (a.part_o == nullptr || a.tickets == nullptr) return;
  // The last of the num_splits CTAs of (b, kvh, rb) merges their partials.
  if (!last_split_arrives(
          a.num_splits, tid == 0, s_last, [] { __syncthreads(); },
          [&] { return a.tickets + (static_cast<int64_t>(b) * a.hkv + kvh) * a.row_blocks + rb; }))
    return;
  for (int row = warp; row < ROWS; row += NW) {
    const int grow = rb * ROWS + row;
    if (grow >= a.rows_total) break;
    const int s = grow / a.group, hq = kvh * a.group + (grow - s * a.group);
    combine_row_serial<T, C::DV>(a, (static_cast<int64_t>(b) * a.sq + s) * a.hq + hq, lane);
  }
}

// Writes output row `row_id` (and its lse) from the merged sums of one warp (combine_row,
// combine_row_serial).
template <class T, int DV>
__device__ __forceinline__ void store_merged_row(const KernelArgs& a, int64_t row_id, int lane,
                                                 const float (&acc)[DV / 32], float wsum, float mx,
                                                 bool nan) {
  constexpr int PER = DV / 32;
  const float inv = (nan || !(wsum > 0.f)) ? __int_as_float(0x7fffffff) : 1.f / wsum;
  const int hq = static_cast<int>(row_id % a.hq);
  const int64_t bs = row_id / a.hq;
  const int s = static_cast<int>(bs % a.sq), b = static_cast<int>(bs / a.sq);
  T* dst = static_cast<T*>(a.out) + b * a.o_sb + s * a.o_ss + hq * a.o_sh;
#pragma unroll
  for (int j = 0; j < PER; j += 2)
    *reinterpret_cast<uint32_t*>(dst + 2 * lane + 32 * j) =
        pack2<T>(acc[j] * inv, acc[j + 1] * inv);
  if (a.lse != nullptr && lane == 0)
    a.lse[row_id] = (nan || !(wsum > 0.f)) ? __int_as_float(0x7fffffff)
                                           : (mx + log2f(wsum)) * 0.69314718055994531f;
}

// One warp merges row `row_id` split after split (the attention kernels' in-kernel merges: few
// registers; the same bits as combine_row).
template <class T, int DV>
__device__ __forceinline__ void combine_row_serial(const KernelArgs& a, int64_t row_id, int lane) {
  constexpr int PER = DV / 32;
  const int64_t rows_global = static_cast<int64_t>(a.batch) * a.sq * a.hq;
  float mx = -INFINITY;
  bool nan = false;
  for (int i = 0; i < a.num_splits; ++i) {
    const float l = __ldcg(a.part_lse + i * rows_global + row_id);
    nan |= isnan(l);
    mx = fmaxf(mx, l);
  }
  float acc[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) acc[j] = 0.f;
  float wsum = 0.f;
  for (int i = 0; i < a.num_splits && !nan; ++i) {
    const float l = __ldcg(a.part_lse + i * rows_global + row_id);
    if (l == -INFINITY) continue;
    const float w = exp2f(l - mx);
    wsum += w;
    const float* src = a.part_o + (i * rows_global + row_id) * DV;
#pragma unroll
    for (int j = 0; j < PER; j += 2) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(src + 2 * lane + 32 * j));
      acc[j] += w * v.x;
      acc[j + 1] += w * v.y;
    }
  }
  store_merged_row<T, DV>(a, row_id, lane, acc, wsum, mx, nan);
}

// One warp merges the splits' (normalized O, log2-sum-exp) pairs of output row `row_id`, in
// split order (the same bits whichever CTA runs it). Latency-bound at batch 1 (one row per warp,
// 16 splits of one tile each): the loads are issued in rounds rather than split after split —
// the log2-sum-exps of 32 splits per round (lane i: split i), then the partial rows of CH
// splits per round, so a merge of S splits waits for 1 + ceil(S / CH) L2 round trips instead of
// up to two per split (H200, engine decode at batch 1: 1B +1.1 %, 8B +0.5 %; docs/engine_gpu.md,
// session 25).
// (combine_kernel only: inlined into the attention kernels' in-kernel merges, the rows in flight
// raised their registers — the 1B decode kernel 60 -> 72 — so those keep combine_row_serial.)
template <class T, int DV>
__device__ __forceinline__ void combine_row(const KernelArgs& a, int64_t row_id, int lane) {
  constexpr int PER = DV / 32;
  constexpr int CH = PER >= 16 ? 2 : 32 / PER;  // splits whose rows are in flight together
  const int64_t rows_global = static_cast<int64_t>(a.batch) * a.sq * a.hq;
  const int S = a.num_splits;
  float mx = -INFINITY;
  bool nan = false;
  float acc[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) acc[j] = 0.f;
  float wsum = 0.f;
  for (int i0 = 0; i0 < S; i0 += 32) {
    const float l =
        i0 + lane < S ? __ldcg(a.part_lse + (i0 + lane) * rows_global + row_id) : -INFINITY;
    nan |= isnan(l);
    mx = fmaxf(mx, l);
  }
  nan = __any_sync(0xffffffffu, nan);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  for (int i0 = 0; i0 < S && !nan; i0 += CH) {
    float l[CH];
    float2 v[CH][PER / 2];
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      const int i = i0 + u;
      l[u] = i < S ? __ldcg(a.part_lse + i * rows_global + row_id) : -INFINITY;
      const float* src = a.part_o + (int64_t{i < S ? i : 0} * rows_global + row_id) * DV;
#pragma unroll
      for (int j = 0; j < PER; j += 2)
        v[u][j / 2] = i < S ? __ldcg(reinterpret_cast<const float2*>(src + 2 * lane + 32 * j))
                            : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      if (l[u] == -INFINITY) continue;  // an empty split (or past S)
      const float w = exp2f(l[u] - mx);
      wsum += w;
#pragma unroll
      for (int j = 0; j < PER; j += 2) {
        acc[j] += w * v[u][j / 2].x;
        acc[j + 1] += w * v[u][j / 2].y;
      }
    }
  }
  store_merged_row<T, DV>(a, row_id, lane, acc, wsum, mx, nan);
}

// One warp per output row (a separate launch; decode_kernel merges in its last split CTA when
// a.tickets is set).
template <class T, int DV>
__global__ void __launch_bounds__(256) combine_kernel(const __grid_constant__ KernelArgs a) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  const int64_t rows_global = static_cast<int64_t>(a.batch) * a.sq * a.hq;
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row_id >= rows_global) return;
  combine_row<T, DV>(a, row_id, threadIdx.x & 31);
}

// Range check of seqlens (Sq <= len <= capacity) and of the block-table entries a sequence
// uses. first_bad[0] = B - b of the first bad seqlen, first_bad[1] = B·max_pages - flat index
// of the first bad entry (0: none); atomicMax keeps the first.
template <class = void>
__global__ void check_inputs_kernel(const int32_t* seqlens, const int32_t* block_table,
                                    int64_t bt_stride, int batch, int max_pages, int page_size,
                                    int num_pages, int sq, int64_t capacity,
                                    unsigned long long* first_bad) {
  const int b = blockIdx.x;
  const int len = seqlens[b];
  if (len < sq || static_cast<int64_t>(len) > capacity) {
    if (threadIdx.x == 0) atomicMax(first_bad, static_cast<unsigned long long>(batch - b));
    return;
  }
  if (block_table == nullptr) return;
  const int used = (len + page_size - 1) / page_size;
  for (int j = threadIdx.x; j < used; j += blockDim.x) {
    const int pg = block_table[b * bt_stride + j];
    if (pg < 0 || pg >= num_pages)
      atomicMax(first_bad + 1,
                static_cast<unsigned long long>(static_cast<int64_t>(batch) * max_pages -
                                                (static_cast<int64_t>(b) * max_pages + j)));
  }
}

}  // namespace tessel::decode
