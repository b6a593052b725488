// tessel::gemm / tessel::bmm: argument validation, tile-config and split-K choice, launch
// (kernel in gemm_kernel.cuh), the K = 0 path.
//
// Kernels are instantiated in gemm_bf16.cu and gemm_f16.cu (one per input dtype, so a 2-core
// build compiles them in parallel): {B (N,K), B (K,N)} x {128x256 cluster 2x1, 128x128,
// 128x64 tiles} each; output dtype, bias, activation, C, batching and split-K are run-time
// switches inside one kernel per combination. Plus, for B (N,K) only, 128x64 tiles in
// clusters of 2 along N (A multicast) and 64x128 tiles (small M).
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/gemm/gemm_run.cuh"
#include "runtime/autotune.hpp"
#include "runtime/check.hpp"
#include "runtime/workspace.hpp"
#include "tessel/gemm.hpp"
#include "tile/tile.cuh"

// The weight-streaming small-M (decode) kernel, where present; TESSEL_GEMM_NO_SMALL_M
// leaves it out (standalone builds of this family).
#if __has_include("ops/gemm/gemm_small_m.hpp") && !defined(TESSEL_GEMM_NO_SMALL_M)
#include "ops/gemm/gemm_small_m.hpp"
#define TESSEL_GEMM_HAVE_SMALL_M 1
#endif

namespace tessel {
namespace {

using gemm_detail::GemmOperands;
using gemm_detail::GemmParams;
using tile::sm90::Act;
using tile::sm90::Major;
using tile::sm90::OutType;

using gemm_detail::kBig;
using gemm_detail::kFlat;
using gemm_detail::kMid;
using gemm_detail::kMidM2;
using gemm_detail::kSmall;
using gemm_detail::kSmallN2;
using gemm_detail::kTiny;
using gemm_detail::kTiny96;
using gemm_detail::kTinySplit;
using gemm_detail::kWide;

// Full-wave rate of the 128x192 config for the tile model in plan_for (TFLOP/s, H100 sweep).
constexpr double kWideRate = 770;

// Tuning hooks (gemm_detail::set_tuning): forced tile config / splits / raster group.
int g_force_cfg = -1, g_force_splits = 0, g_force_group = 0;

struct Plan {
  int cfg = kBig;
  int splits = 1;
  int group = 8;
};

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Tile shape, K split and raster group for (M, N, K) x L on `sms` SMs (docs/gemm.md,
// "small M" sweep):
//  * 128x256 (cluster 2x1) when its cluster tiles fill every cluster slot;
//  * else 128x128 when its tiles fill the machine;
//  * else (few output tiles), with S = min(#SMs / CTA tiles, K blocks / 16, 16) K slices:
//    B (N,K): 64x128 tiles when M <= 64 (half the MMA rows of 128x64 would be padding),
//    128x64 tiles in clusters of 2 along N sharing A when M <= 512, else 128x128;
//    B (K,N): 128x64 tiles when M <= 256, else 128x128;
//  * raster groups of 8 cluster-tile rows.
Plan plan_for(int64_t M, int64_t N, int64_t K, int64_t L, bool kn, int split_k, int sms) {
  Plan pl;
  const int64_t tm = cdiv(M, 128), kt = cdiv(K, 64);
  const int64_t cluster_tiles = cdiv(tm, 2) * cdiv(N, 256) * L;
  const int64_t t128 = tm * cdiv(N, 128) * L, t64 = tm * cdiv(N, 64) * L;
  // 128x256 tiles waste MMA on the columns past N (attention's N = head_dim = 128).
  const bool wide_ok = N % 256 == 0 || N >= 1024 || t128 < sms;
  // M > 384, B (N,K) (prefill-sized GEMMs): the tile shape with the best modelled rate = its
  // full-wave rate x its wave efficiency (tiles / (waves x slots)). Rates from the M = 512
  // sweep on the H100 (bench gemm_sweep, docs/gemm.md): 128x256 in 2x1 clusters 800, 128x128
  // 740, 64x128 580, 128x64 560 TFLOP/s. The model picked the sweep's fastest config on all 8
  // Llama-3 8B / 3.2 1B shapes, where the rules below lost up to 35% (512x4096x14336: 471 vs 725).
  // Only where some shape fills ~a wave: fewer tiles are split-K territory (below).
  if (!kn && tm >= 4 && split_k < 1 &&
      10 * std::max(t64, cdiv(M, 64) * cdiv(N, 128) * L) >= 9 * sms) {
    struct Candidate {
      int cfg;
      double rate;
      int64_t tiles, slots;
      bool ok;
      int64_t bn;
    };
    // 128x192: rate from the same kind of sweep (TESSEL_GEMM_SWEEP_SHAPES, cfg 5).
    const Candidate cands[] = {
        {kBig, 800, cluster_tiles, std::max(1, sms / 2), tm >= 2 && wide_ok, 256},
        {kMid, 740, t128, sms, true, 128},
        {kWide, kWideRate, tm * cdiv(N, 192) * L, sms, true, 192},
        {kFlat, 580, cdiv(M, 64) * cdiv(N, 128) * L, sms, true, 128},
        {kSmall, 560, t64, sms, true, 64},
    };
    double best = -1;
    for (const Candidate& c : cands) {
      if (!c.ok) continue;
      const int64_t waves = cdiv(c.tiles, c.slots);
      // x the share of the tiles' columns inside N (a 192-wide tile wastes a third of its last
      // column block at N = 4096)
      const double cols = static_cast<double>(N) / static_cast<double>(cdiv(N, c.bn) * c.bn);
      const double rate =
          c.rate * cols * static_cast<double>(c.tiles) / static_cast<double>(waves * c.slots);
      if (rate > best) best = rate, pl.cfg = c.cfg;
    }
    pl.splits = 1;
    return pl;
  }
  // M <= 256 against a weight whose 64x64 tiles fill 3/4 to 1 wave: one 64x64 CTA per tile,
  // each streaming the whole K through 13 stages, no split-K (how cuBLAS runs these, per ncu).
  // H100 sweep (TFLOP/s, 64x64 vs the rules below): 128x4096x4096 225 vs 200,
  // 256x2048x8192 392 vs 322, 128x4096x14336 319 vs 299 (docs/gemm.md, log step 13).
  const int64_t t_tiny = cdiv(M, 64) * cdiv(N, 64) * L;
  if (!kn && M <= 256 && split_k < 1 && 4 * t_tiny >= 3 * sms && t_tiny <= sms) {
    pl.cfg = kTinySplit;
    pl.splits = 1;
    return pl;
  }
  // 32 < M <= 128 against a narrow weight with a long K (split-K shapes): the same 64x64 tiles with
  // 2 or 4 K slices when that fills 3/4 to 1 wave, each slice >= 2048 deep. H100 sweep
  // (bench/results/h100/dev/gemm_sweep.splitk_m128.json): 128x1024x16384 4 slices 184 TFLOP/s
  // (0.91 of cuBLAS) vs 178 (0.88) for the 128x64 2x1-cluster, 8-slice rule below.
  if (!kn && M > 32 && M <= 128 && split_k < 1 && t_tiny < sms) {
    for (int s : {2, 4}) {
      if (4 * t_tiny * s >= 3 * sms && t_tiny * s <= sms && K / s >= 2048) {
        pl.cfg = kTinySplit;
        pl.splits = s;
        return pl;
      }
    }
  }
  // Decode-sized M (17-32, or <= 16 with TESSEL_GEMM_SMALL_M_RING=0; gemm_small_m_preferred
  // sends these here for N <= 64 x #SMs): the
  // same 64x64 tiles, K split to fill the machine (16x4096x4096: 2 splits 1635 GB/s of weight,
  // 1 split 1502, 4 splits 1289; 16x6144x4096: 1 split 1967).
  if (!kn && M <= 32 && split_k < 1 && t_tiny <= sms) {
    pl.cfg = kTinySplit;
    pl.splits = static_cast<int>(std::clamp<int64_t>(std::min(sms / t_tiny, kt / 16), 1, 4));
    return pl;
  }
  if (tm >= 2 && cluster_tiles >= sms / 2 && wide_ok) {
    pl.cfg = kBig;
  } else if (t128 >= sms) {
    pl.cfg = kMid;
  } else {
    int64_t tiles = t128;
    pl.cfg = kMid;
    if (kn) {
      if (tm <= 2) pl.cfg = kSmall, tiles = t64;
    } else if (M <= 64) {
      pl.cfg = kFlat, tiles = cdiv(N, 128) * L;
    } else if (tm <= 4) {
      pl.cfg = kSmallN2, tiles = 2 * tm * cdiv(N, 128) * L;
    }
    pl.splits =
        static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({16, sms / tiles, kt / 16})));
  }
  if (split_k >= 1 && pl.cfg != kBig) pl.splits = split_k;
  if (pl.cfg == kBig) pl.splits = 1;
  pl.splits = static_cast<int>(std::min<int64_t>(std::max(pl.splits, 1), kt));
  return pl;
}

// ---- autotuning (family "gemm") --------------------------------------------------------
// A plan is one config id for the autotuner: cfg + 16·(splits + 64·group index), group from
// kGroups. Candidates per problem: every tile config the layout can run (B (K,N): the
// MN-major 128x256 / 128x128 / 128x64 kernels), with K slices where the config can split and
// its tiles leave SMs idle, and raster groups 4 / 16 beside the default 8 for multi-wave grids
// of the large tiles; plus plan_for's choice, the deterministic fallback.
constexpr int kGroups[] = {8, 4, 16};

int plan_id(const Plan& p) {
  int gi = 0;
  for (int i = 0; i < 3; ++i)
    if (kGroups[i] == p.group) gi = i;
  return p.cfg + 16 * (std::clamp(p.splits, 1, 63) + 64 * gi);
}

Plan plan_of(int id) {
  Plan p;
  p.cfg = std::min(id % 16, gemm_detail::kNumTileCfgs - 1);
  p.splits = std::max(1, (id / 16) % 64);
  p.group = kGroups[std::clamp(id / 1024, 0, 2)];
  return p;
}

std::string plan_name(const Plan& p) {
  static const char* const names[] = {"128x256 2x1", "128x128",  "128x64",    "128x64 1x2",
                                      "64x128",      "128x192",  "64x64 2x1", "64x64",
                                      "128x128 2x1", "64x96 2x1"};
  return std::string(names[p.cfg]) + " splits " + std::to_string(p.splits) + " group " +
         std::to_string(p.group);
}

std::vector<int> tune_candidates(int64_t M, int64_t N, int64_t K, int64_t L, bool kn, bool at,
                                 int sms, double l2_bytes, const Plan& fallback) {
  struct Shape {
    int cfg, bm, bn, cm, cn;
    bool splits, nk_only;
  };
  static const Shape shapes[] = {
      {kBig, 128, 256, 2, 1, false, false},  {kMid, 128, 128, 1, 1, true, false},
      {kSmall, 128, 64, 1, 1, true, false},  {kSmallN2, 128, 64, 1, 2, true, true},
      {kFlat, 64, 128, 1, 1, true, true},    {kWide, 128, 192, 1, 1, false, true},
      {kTiny, 64, 64, 2, 1, false, true},    {kTinySplit, 64, 64, 1, 1, true, true},
      {kMidM2, 128, 128, 2, 1, false, true}, {kTiny96, 64, 96, 2, 1, false, true},
  };
  std::vector<int> ids{plan_id(fallback)};
  auto add = [&](int cfg, int splits, int group) {
    Plan p;
    p.cfg = cfg;
    p.splits = splits;
    p.group = group;
    const int id = plan_id(p);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  const int64_t kt = cdiv(K, 64);
  // Many waves of 128x128 tiles: compute-bound, where the small tiles' lower MMA rate loses.
  const bool many_waves = cdiv(M, 128) * cdiv(N, 128) * L >= 2 * int64_t{sms};
  for (const Shape& s : shapes) {
    if (kn && s.nk_only) continue;
    if (at && s.cfg != kBig && s.cfg != kSmall) continue;  // the transposed-A kernels built
    if (many_waves && s.bm * s.bn < 128 * 128) continue;
    const int64_t slots = std::max(1, sms / (s.cm * s.cn));
    const int64_t units = cdiv(M, int64_t{s.bm} * s.cm) * cdiv(N, int64_t{s.bn} * s.cn) * L;
    add(s.cfg, 1, 8);
    if (s.splits && units < slots)
      for (int k : {2, 3, 4, 6, 8, 12, 16})
        if (units * k <= 2 * slots && kt / k >= 4) add(s.cfg, k, 8);
    // Other raster groups where one wave's operand panels (g cluster-tile rows of A, the B
    // column bands of the rest of the wave) stay within 3/4 of L2: at 4096 x 128256 x 4096 a
    // group of 16 (A panels 32 MB + B bands 10 MB) won a tuning pass and then ran at 577
    // TFLOP/s against 703 with 8 (bench/results/h100/dev/session9/call1_*).
    if (units >= 2 * slots && s.bm * s.bn >= 128 * 128)
      for (int g : {4, 16}) {
        const int64_t rows = std::min<int64_t>(g, cdiv(M, int64_t{s.bm} * s.cm));
        const int64_t bands = cdiv(slots, rows);
        const double panel = 2.0 * static_cast<double>(K);  // bytes per operand row
        const double ws = panel * (static_cast<double>(rows * s.bm * s.cm) +
                                   static_cast<double>(bands * s.bn * s.cn));
        if (ws <= 0.75 * l2_bytes) add(s.cfg, 1, g);
      }
  }
  return ids;
}

// L2 size of the current device (bytes).
double l2_bytes() {
  int dev = 0, l2 = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
    cudaGetLastError();
    return 50e6;
  }
  return static_cast<double>(l2);
}

// The autotuner keeps plan_for's choice unless a candidate measures this much faster.
constexpr double kStickToPlan = 0.03;

// Problems below this many flops run plan_for's choice untuned: launch latency dominates.
constexpr double kMinTuneFlops = 5e7;

// K == 0: D = act(bias) + beta * C.
template <class TD>
__global__ void k0_kernel(TD* d, int64_t ldd, int64_t bsd, const TD* c, int64_t ldc, int64_t bsc,
                          const void* bias, bool bias_f32, Act act, int m, int n, int batches,
                          float beta) {
  const int64_t per = int64_t{m} * n, total = per * batches;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t l = i / per, r = (i % per) / n, col = i % n;
    float v = 0.f;
    if (bias)
      v = bias_f32 ? static_cast<const float*>(bias)[col]
                   : tile::to_f32(static_cast<const TD*>(bias)[col]);
    v = tile::sm90::activate(v, act);
    if (c) v += beta * tile::to_f32(c[l * bsc + r * ldc + col]);
    d[l * bsd + r * ldd + col] = tile::from_f32<TD>(v);
  }
}

// A (batch, rows, cols) view of a 2-D or 3-D argument: last stride 1, row pitch and batch
// stride multiples of 8 elements (batch stride 0: the same matrix for every batch).
struct View {
  int64_t batch = 1, rows = 0, cols = 0, pitch = 0, bstride = 0;
};

View view_of(const detail::OpCheck& chk, const char* arg, const Tensor& t) {
  View v;
  const int r = t.ndim;
  v.rows = t.shape[r - 2];
  v.cols = t.shape[r - 1];
  v.batch = r == 3 ? t.shape[0] : 1;
  if (t.numel() == 0) return v;
  if (v.cols > 1 && t.strides[r - 1] != 1)
    chk.fail(arg, "unit stride on the last axis", "stride " + std::to_string(t.strides[r - 1]));
  v.pitch = v.rows > 1 ? t.strides[r - 2] : v.cols;
  v.bstride = r == 3 && v.batch > 1 ? t.strides[0] : 0;
  if (v.rows > 1 && (v.pitch % 8 != 0 || v.pitch < v.cols))
    chk.fail(arg, "row pitch a multiple of 8 elements, >= the row length",
             "pitch " + std::to_string(v.pitch));
  if (v.bstride % 8 != 0 || v.bstride < 0)
    chk.fail(arg, "batch stride a non-negative multiple of 8 elements",
             "batch stride " + std::to_string(v.bstride));
  if (!detail::aligned(t.data, 16))
    chk.fail(arg, "data pointer aligned to 16 bytes", "misaligned pointer");
  return v;
}

std::string dim_name(const char* what, int64_t v) {
  return std::string(what) + " = " + std::to_string(v);
}

Act to_act(GemmActivation a) { return static_cast<Act>(static_cast<int>(a)); }

void gemm_impl(const char* op, bool batched, const Tensor& a, const Tensor& b, Tensor& d,
               cudaStream_t stream, const GemmOptions& opt) {
  detail::OpCheck chk(op);
  const bool kn = opt.b_layout == BLayout::kn;
  const bool at = opt.a_layout == ALayout::km;
  const Tensor* c = opt.beta != 0.f ? opt.c : nullptr;
  // dtype
  chk.dtype_in("a", a, {DType::bf16, DType::f16});
  chk.same_dtype("b", b, "a", a);
  chk.dtype_in("d", d, {DType::f32, DType::f16, DType::bf16});
  if (opt.beta != 0.f && opt.c == nullptr)
    chk.fail("c", "a tensor when beta != 0", "none (beta = " + std::to_string(opt.beta) + ")");
  if (c) chk.same_dtype("c", *c, "d", d);
  if (opt.bias) {
    chk.valid_layout("bias", *opt.bias);
    if (opt.bias->dtype != DType::f32 && opt.bias->dtype != d.dtype)
      chk.fail("bias", std::string("dtype f32 or ") + dtype_name(d.dtype) + " (d's)",
               dtype_name(opt.bias->dtype));
  }
  if (opt.b_layout != BLayout::nk && opt.b_layout != BLayout::kn)
    chk.fail("b_layout", "nk (0) or kn (1)", std::to_string(static_cast<int>(opt.b_layout)));
  if (opt.a_layout != ALayout::mk && opt.a_layout != ALayout::km)
    chk.fail("a_layout", "mk (0) or km (1)", std::to_string(static_cast<int>(opt.a_layout)));
  if (static_cast<int>(opt.activation) < 0 || static_cast<int>(opt.activation) > 4)
    chk.fail("activation", "none/relu/gelu_tanh/gelu/silu (0..4)",
             std::to_string(static_cast<int>(opt.activation)));
  if (opt.split_k < 0)
    chk.fail("split_k", "0 (automatic) or a positive slice count", std::to_string(opt.split_k));
  // rank / shape
  chk.rank_in("a", a, 2, batched ? 3 : 2);
  chk.rank_in("b", b, 2, batched ? 3 : 2);
  chk.rank_in("d", d, batched ? 3 : 2, batched ? 3 : 2);
  if (c) chk.rank_in("c", *c, d.ndim, d.ndim);
  const int64_t L = batched ? d.shape[0] : 1;
  const int64_t M = a.shape[a.ndim - (at ? 1 : 2)], K = a.shape[a.ndim - (at ? 2 : 1)];
  const int64_t N = kn ? b.shape[b.ndim - 1] : b.shape[b.ndim - 2];
  const int64_t Kb = kn ? b.shape[b.ndim - 2] : b.shape[b.ndim - 1];
  if (batched && a.ndim == 3 && a.shape[0] != L)
    chk.fail("a", "batch " + std::to_string(L) + " (d's) or a 2-D matrix", a.shape_string());
  if (batched && b.ndim == 3 && b.shape[0] != L)
    chk.fail("b", "batch " + std::to_string(L) + " (d's) or a 2-D matrix", b.shape_string());
  if (Kb != K)
    chk.fail("b",
             std::string(kn ? "(K, N) with K = " : "(N, K) with K = ") + std::to_string(K) +
                 (at ? " (a's rows, a_layout km)" : " (a's columns)"),
             b.shape_string());
  if (d.shape[d.ndim - 2] != M || d.shape[d.ndim - 1] != N)
    chk.fail("d",
             batched ? "(batch, M, N) with (M, N) = (" + std::to_string(M) + ", " +
                           std::to_string(N) + ")"
                     : "(M, N) = (" + std::to_string(M) + ", " + std::to_string(N) + ")",
             d.shape_string());
  if (c) chk.same_shape("c", *c, "d", d);
  if (opt.bias && !(opt.bias->ndim == 1 && opt.bias->shape[0] == N))
    chk.fail("bias", "shape (" + std::to_string(N) + ",) (N)", opt.bias->shape_string());
  if (N % 8 != 0) chk.fail("b", "N a multiple of 8", dim_name("N", N));
  if (K % 8 != 0) chk.fail("a", "K a multiple of 8", dim_name("K", K));
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (M >= kMaxDim || N >= kMaxDim || K >= kMaxDim || L >= kMaxDim)
    chk.fail("a", "M, N, K, batch < 2^31",
             "(" + std::to_string(M) + ", " + std::to_string(N) + ", " + std::to_string(K) + ", " +
                 std::to_string(L) + ")");
  // strides / alignment
  const View av = view_of(chk, "a", a), bv = view_of(chk, "b", b), dv = view_of(chk, "d", d);
  const View cv = c ? view_of(chk, "c", *c) : View{};
  if (opt.bias && opt.bias->numel() > 0) {
    if (N > 1 && opt.bias->strides[0] != 1)
      chk.fail("bias", "a contiguous vector", "stride " + std::to_string(opt.bias->strides[0]));
    if (!detail::aligned(opt.bias->data, 2 * dtype_size(opt.bias->dtype)))
      chk.fail("bias", "data pointer aligned to two elements", "misaligned pointer");
  }
  if (L > 1 && M > 0 && N > 0 && dv.bstride == 0)
    chk.fail("d", "a non-zero batch stride (batches must not overlap)", "batch stride 0");
  if (M == 0 || N == 0 || L == 0) return;
  chk.device_pointer("a", a);
  chk.device_pointer("b", b);
  chk.device_pointer("d", d);
  if (c) chk.device_pointer("c", *c);
  if (opt.bias) chk.device_pointer("bias", *opt.bias);

#ifdef TESSEL_GEMM_HAVE_SMALL_M
  // (It implements alpha/beta/C only: fused bias / activation stay on the kernel below.)
  if (!batched && !at && M <= 32 && K > 0 && opt.bias == nullptr &&
      detail::gemm_small_m_preferred(M, N, kn, detail::current_sm_count()) &&
      opt.activation == GemmActivation::none && detail::gemm_small_m(a, b, d, opt, stream))
    return;
#endif

  const int64_t ldd = dv.pitch, ldc = c ? cv.pitch : 0;
  const int64_t bsd = L > 1 ? dv.bstride : ldd * M, bsc = c && L > 1 ? cv.bstride : 0;
  if (K == 0) {
    const int64_t total = M * N * L;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
    const void* bias = opt.bias ? opt.bias->data : nullptr;
    const bool bias_f32 = opt.bias && opt.bias->dtype == DType::f32;
    const Act act = to_act(opt.activation);
    const int m = static_cast<int>(M), n = static_cast<int>(N), l = static_cast<int>(L);
    switch (d.dtype) {
      case DType::f32:
        k0_kernel<float><<<grid, 256, 0, stream>>>(
            static_cast<float*>(d.data), ldd, bsd, c ? static_cast<const float*>(c->data) : nullptr,
            ldc, bsc, bias, bias_f32, act, m, n, l, opt.beta);
        break;
      case DType::f16:
        k0_kernel<__half>
            <<<grid, 256, 0, stream>>>(static_cast<__half*>(d.data), ldd, bsd,
                                       c ? static_cast<const __half*>(c->data) : nullptr, ldc, bsc,
                                       bias, bias_f32, act, m, n, l, opt.beta);
        break;
      default:
        k0_kernel<__nv_bfloat16>
            <<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(d.data), ldd, bsd,
                                       c ? static_cast<const __nv_bfloat16*>(c->data) : nullptr,
                                       ldc, bsc, bias, bias_f32, act, m, n, l, opt.beta);
        break;
    }
    TESSEL_CUDA_CHECK(cudaGetLastError());
    return;
  }

  const int sms = detail::current_sm_count();
  const bool forced = g_force_cfg >= 0 || g_force_splits > 0 || g_force_group > 0;
  Plan pl = plan_for(M, N, K, L, kn, opt.split_k, sms);
  if (at && pl.cfg != kBig) {  // transposed A: 128x256 clusters or 128x64 (+ split-K) only
    if (pl.cfg != kSmall && opt.split_k < 1)
      pl.splits = static_cast<int>(std::clamp<int64_t>(
          std::min<int64_t>(sms / std::max<int64_t>(1, cdiv(M, 128) * cdiv(N, 64) * L),
                            cdiv(K, 64) / 16),
          1, 16));
    pl.cfg = kSmall;
  }
  if (g_force_cfg >= 0) pl.cfg = g_force_cfg;
  if (g_force_splits > 0)
    pl.splits = static_cast<int>(std::min<int64_t>(g_force_splits, cdiv(K, 64)));
  if (g_force_group > 0) pl.group = g_force_group;

  GemmParams p;
  p.m = static_cast<int>(M);
  p.n = static_cast<int>(N);
  p.k = static_cast<int>(K);
  p.batches = static_cast<int>(L);
  p.epi.alpha = opt.alpha;
  p.epi.bias = opt.bias ? opt.bias->data : nullptr;
  p.epi.bias_f32 = opt.bias && opt.bias->dtype == DType::f32;
  p.epi.act = to_act(opt.activation);
  p.epi.out = d.dtype == DType::f32   ? OutType::f32
              : d.dtype == DType::f16 ? OutType::f16
                                      : OutType::bf16;
  GemmOperands ops;
  ops.a = a.data;
  ops.lda = av.pitch;
  ops.batch_a = a.ndim == 3 ? av.bstride : 0;
  ops.b = b.data;
  ops.ldb = bv.pitch;
  ops.batch_b = b.ndim == 3 ? bv.bstride : 0;

  // One launch of plan `plan` writing `out` (row pitch ld_out, batch stride bs_out).
  auto launch_plan = [&](const Plan& plan, void* out, int64_t ld_out, int64_t bs_out) {
    GemmParams q = p;
    q.group = plan.group;
    q.splits = static_cast<int>(std::min<int64_t>(plan.splits, cdiv(K, 64)));
    q.epi.c = c ? c->data : nullptr;
    q.epi.ldc = ldc;
    q.epi.c_batch = bsc;
    q.epi.beta = c ? opt.beta : 0.f;
    q.epi.d = out;
    q.epi.ldd = ld_out;
    q.epi.d_batch = bs_out;
    CUtensorMap tma_d;
    const CUtensorMapDataType dt = d.dtype == DType::f32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : d.dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUresult cr = tile::sm90::make_tma_store_desc(
        &tma_d, out, dt, static_cast<int>(dtype_size(d.dtype)), M, N, ld_out, L, bs_out);
    if (cr != CUDA_SUCCESS)
      throw Error(TESSEL_ERROR_CUDA, std::string("tessel::") + op +
                                         ": cuTensorMapEncodeTiled failed (CUresult " +
                                         std::to_string(static_cast<int>(cr)) + ")");
    if (at)
      (a.dtype == DType::bf16 ? gemm_detail::run_at_bf16 : gemm_detail::run_at_f16)(
          plan.cfg, kn, ops, tma_d, q, sms, stream);
    else if (a.dtype == DType::bf16)
      gemm_detail::run_bf16(plan.cfg, kn, ops, tma_d, q, sms, stream);
    else
      gemm_detail::run_f16(plan.cfg, kn, ops, tma_d, q, sms, stream);
  };

  // The autotuner's plan: measured on first use of the problem's key (family "gemm"), unless
  // the caller fixed the K slices, a tuning hook forces a config, or the problem is tiny.
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) *
                       static_cast<double>(K) * static_cast<double>(L);
  if (!forced && opt.split_k < 1 && flops >= kMinTuneFlops && autotune::enabled()) {
    int dev = 0;
    TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
    // The epilogue is part of the key: a residual or an activation changes the best tile.
    const int epi =
        (opt.bias ? 1 : 0) | (opt.activation != GemmActivation::none ? 2 : 0) | (c ? 4 : 0);
    using MemoKey = std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int64_t, int>;
    static std::mutex memo_mu;
    static std::map<MemoKey, int> memo;
    const MemoKey mk{dev,
                     static_cast<int>(a.dtype),
                     static_cast<int>(d.dtype),
                     (kn ? 1 : 0) | (at ? 2 : 0),
                     M,
                     N,
                     K,
                     L,
                     epi};
    int id = -1;
    {
      std::lock_guard<std::mutex> lock(memo_mu);
      if (auto it = memo.find(mk); it != memo.end()) id = it->second;
    }
    if (id < 0) {
      const std::string layout = std::string(at ? "km-" : "") + (kn ? "kn" : "nk") +
                                 (L > 1 ? "-b" + std::to_string(autotune::bucket(L)) : "") +
                                 (epi & 1 ? "+bias" : "") + (epi & 2 ? "+act" : "") +
                                 (epi & 4 ? "+c" : "");
      const std::string key = autotune::make_key(
          "gemm", autotune::current_gpu_name(),
          std::string(dtype_name(a.dtype)) + "->" + dtype_name(d.dtype), layout, M, N, K);
      // Candidates run the call's own epilogue (C only read) into a scratch output: d may be
      // C and must not be clobbered. plan_for's choice wins unless another candidate is
      // kStickToPlan faster: the heuristic was fitted to sweeps, and one tuning pass (5 timed
      // runs per candidate) carries ~1-3 % of clock noise.
      const int fallback = plan_id(pl);
      DeviceBuffer scratch;
      auto measure = [&](int cand) -> double {
        if (scratch.data() == nullptr)
          scratch = DeviceBuffer(static_cast<size_t>(L * M * N) * dtype_size(d.dtype));
        const double ms = autotune::time_on_stream(
            stream, [&] { launch_plan(plan_of(cand), scratch.data(), N, M * N); });
        return cand == fallback ? ms * (1.0 - kStickToPlan) : ms;
      };
      // A winner other than plan_for's choice must also win when the two are timed
      // alternately (4 rounds of 3 runs each): one pass picked plans up to 20 % slower in the
      // suite (mlp-down with a residual, 512x512x32768 split-K).
      auto confirm = [&](int best, int plan) {
        std::vector<double> tb, tp;
        for (int r = 0; r < 4; ++r) {
          for (int c : {best, plan})
            (c == best ? tb : tp)
                .push_back(autotune::time_on_stream(
                    stream, [&] { launch_plan(plan_of(c), scratch.data(), N, M * N); }, 0, 3));
        }
        std::sort(tb.begin(), tb.end());
        std::sort(tp.begin(), tp.end());
        return 0.5 * (tb[1] + tb[2]) < (1.0 - kStickToPlan) * 0.5 * (tp[1] + tp[2]) ? best : plan;
      };
      id = autotune::select_for_stream(stream, key,
                                       tune_candidates(M, N, K, L, kn, at, sms, l2_bytes(), pl),
                                       fallback, measure, confirm);
      if (!detail::stream_capturing(stream)) {
        std::lock_guard<std::mutex> lock(memo_mu);
        memo[mk] = id;
      }
    }
    pl = plan_of(id);
  }
  launch_plan(pl, d.data, ldd, bsd);
}

// ---- ahead-of-time tuning (`tessel tune --family gemm`) ---------------------------------

void pretune_gemm(const std::vector<std::vector<int64_t>>& shapes_in,
                  std::vector<std::string>& report) {
  std::vector<std::vector<int64_t>> shapes = shapes_in;
  if (shapes.empty()) {
    // The Llama-3-8B linears at prefill / batched sizes, and the squares of the bench.
    const int64_t nk[][2] = {
        {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    for (int64_t m : {128, 512, 4096})
      for (const auto& x : nk) shapes.push_back({m, x[0], x[1]});
    shapes.push_back({8192, 8192, 8192});
  }
  if (!autotune::enabled()) {
    report.push_back("TESSEL_AUTOTUNE=0: tuning is off, nothing to do");
    return;
  }
  cudaStream_t stream = nullptr;
  TESSEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Guard {
    cudaStream_t s;
    ~Guard() { cudaStreamDestroy(s); }
  } guard{stream};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    std::string line =
        std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " bf16 nk: ";
    if (M < 1 || N % 8 != 0 || K % 8 != 0 || K < 8 ||
        2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) <
            kMinTuneFlops) {
      report.push_back(line + "not tuned (needs N, K multiples of 8 and >= " +
                       std::to_string(static_cast<int64_t>(kMinTuneFlops)) + " flops)");
      continue;
    }
    DeviceBuffer a(size_t(M * K) * 2), b(size_t(N * K) * 2), d(size_t(M * N) * 2);
    TESSEL_CUDA_CHECK(cudaMemsetAsync(a.data(), 0x3C, a.bytes(), stream));
    TESSEL_CUDA_CHECK(cudaMemsetAsync(b.data(), 0x3C, b.bytes(), stream));
    const Tensor ta = Tensor::contiguous(a.data(), DType::bf16, {M, K});
    const Tensor tb = Tensor::contiguous(b.data(), DType::bf16, {N, K});
    Tensor td = Tensor::contiguous(d.data(), DType::bf16, {M, N});
    gemm_impl("gemm", false, ta, tb, td, stream, GemmOptions{});
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string key =
        autotune::make_key("gemm", autotune::current_gpu_name(), "bf16->bf16", "nk", M, N, K);
    const auto e = autotune::global_cache().find(key);
    report.push_back(
        line + (e ? plan_name(plan_of(e->config)) + " (" + std::to_string(e->ms * 1e3) + " us)"
                  : std::string("no entry (the small-M kernel runs it: tessel tune "
                                "--family gemm_small_m)")));
  }
}

[[maybe_unused]] const bool g_pretune_registered = [] {
  autotune::register_pretune("gemm", pretune_gemm);
  return true;
}();

}  // namespace

namespace gemm_detail {
// Split-K partial sums: per (device, stream) scratch owned by gemm (grows, never shrinks;
// stream-ordered reuse, so concurrent streams never share one).
float* splitk_partials(cudaStream_t stream, size_t bytes, bool may_allocate) {
  struct Slot {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Slot> slots;
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Slot& s = slots[{dev, stream}];
  if (s.bytes < bytes) {
    if (!may_allocate) return nullptr;
    if (s.ptr) {
      TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
      TESSEL_CUDA_CHECK(cudaFree(s.ptr));
      s = Slot{};
    }
    TESSEL_CUDA_CHECK(cudaMalloc(&s.ptr, bytes));
    s.bytes = bytes;
  }
  return static_cast<float*>(s.ptr);
}

// Tuning hooks for benchmarks (not public API): cfg 0 = 128x256 cluster, 1 = 128x128,
// 2 = 128x64, 3 = 128x64 in clusters of 2 along N, 4 = 64x128, 5 = 128x192, 6 = 64x64 in
// clusters of 2 along M, 7 = 64x64, 8 = 128x128 in clusters of 2 along M (3..8: B (N,K);
// B (K,N) runs 2 for 3, 4, 6, 7 and 1 for 5, 8) (-1: heuristic / autotuner); splits (0: heuristic);
// cluster-tile rows per raster group (0: default 8).
void set_tuning(int cfg, int splits, int group) {
  g_force_cfg = cfg >= 0 && cfg < gemm_detail::kNumTileCfgs ? cfg : -1;
  g_force_splits = splits > 0 ? splits : 0;
  g_force_group = group > 0 ? group : 0;
}
void set_raster_group(int group) { g_force_group = group > 0 ? group : 0; }
}  // namespace gemm_detail

const char* gemm_activation_name(GemmActivation act) {
  switch (act) {
    case GemmActivation::none: return "none";
    case GemmActivation::relu: return "relu";
    case GemmActivation::gelu_tanh: return "gelu_tanh";
    case GemmActivation::gelu: return "gelu";
    case GemmActivation::silu: return "silu";
  }
  return "unknown";
}

void gemm(const Tensor& a, const Tensor& b, Tensor& d, cudaStream_t stream,
          const GemmOptions& opt) {
  gemm_impl("gemm", false, a, b, d, stream, opt);
}

void bmm(const Tensor& a, const Tensor& b, Tensor& d, cudaStream_t stream, const GemmOptions& opt) {
  gemm_impl("bmm", true, a, b, d, stream, opt);
}

}  // namespace tessel
