// tessel::gemm / tessel::bmm: float64 reference on small ragged shapes (both B layouts,
// bf16/f16 in, f32/f16/bf16 out, alpha/beta with C, pitched operands, a multi-tile shape per
// tile config), every fused epilogue (bias f32 / d's dtype, relu / gelu_tanh / gelu / silu,
// residual C, combinations), split-K (forced slice counts, bitwise determinism), strided
// batched GEMM (per-batch and shared operands, pitched batches), and argument validation (no
// GPU needed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/autotune.hpp"
#include "tessel/gemm.hpp"
#include "test_util.hpp"

namespace tessel::gemm_detail {
void set_tuning(int cfg, int splits, int group);  // src/ops/gemm/gemm.cu (tuning hook)
}

namespace tessel::test {
namespace {

// f32 output: fp32 accumulation in a different order than the float64 reference
// (K up to ~1000 terms), so a little wider than the element-wise f32 row of the table.
Tolerance gemm_tolerance(DType out) {
  return out == DType::f32 ? Tolerance{1e-4, 1e-4} : tolerance(out);
}

double act_ref(GemmActivation a, double x) {
  switch (a) {
    case GemmActivation::relu: return x > 0 ? x : 0.0;
    case GemmActivation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case GemmActivation::gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case GemmActivation::silu: return x / (1.0 + std::exp(-x));
    default: return x;
  }
}

enum class Bias { none, f32, out };

struct Case {
  int64_t m, n, k;
  DType in, out;
  BLayout layout;
  float alpha = 1.f, beta = 0.f;
  int64_t pitch_pad = 0;  // extra elements per row of a and b (multiple of 8)
  bool in_place_c = false;
  Bias bias = Bias::none;
  GemmActivation act = GemmActivation::none;
  int split_k = 0;
  // bmm: batch > 0 calls bmm with (batch, ...) tensors; shared_a / shared_b pass 2-D ones.
  int64_t batch = 0;
  bool shared_a = false, shared_b = false;
  int64_t batch_pad = 0;        // extra elements between batches of a, b, d
  bool repeat_bitwise = false;  // run twice on the same inputs: the same bits
  bool a_km = false;  // a stored transposed, (K, M) (ALayout::km); pitch M rounded up to 8
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " in=" + dtype_name(c.in) + " out=" + dtype_name(c.out) +
         (c.layout == BLayout::nk ? " B(N,K)" : " B(K,N)") + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " pad=" + std::to_string(c.pitch_pad) +
         (c.in_place_c ? " c=d" : "") +
         (c.bias == Bias::none  ? ""
          : c.bias == Bias::f32 ? " bias=f32"
                                : " bias=out") +
         " act=" + gemm_activation_name(c.act) + " split_k=" + std::to_string(c.split_k) +
         (c.batch
              ? " batch=" + std::to_string(c.batch) + (c.shared_a ? " shared_a" : "") +
                    (c.shared_b ? " shared_b" : "") + " batch_pad=" + std::to_string(c.batch_pad)
              : "") +
         (c.a_km ? " A(K,M)" : "");
}

// (batch, rows, cols) with rows `pitch` apart and batches `rows*pitch + batch_pad` apart;
// batch == 0: a 2-D (rows, cols) view.
DeviceTensor alloc_batched(DType dt, int64_t batch, int64_t rows, int64_t cols, int64_t pitch,
                           int64_t batch_pad) {
  if (batch == 0) return alloc_pitched(dt, {rows, cols}, pitch);
  return alloc_view(dt, {batch, rows, cols}, {rows * pitch + batch_pad, pitch, 1});
}

class GemmGpu : public GpuTest {
 protected:
  // Runs the case; returns the output bytes (for determinism checks).
  std::vector<uint8_t> check(const Case& c) {
    SCOPED_TRACE(describe(c));
    const bool kn = c.layout == BLayout::kn;
    const int64_t L = c.batch ? c.batch : 1;
    const int64_t La = c.batch && !c.shared_a ? c.batch : 0,
                  Lb = c.batch && !c.shared_b ? c.batch : 0;
    const int64_t b_rows = kn ? c.k : c.n, b_cols = kn ? c.n : c.k;
    std::vector<double> a = rng().uniform(static_cast<size_t>((La ? La : 1) * c.m * c.k), -1, 1);
    std::vector<double> b =
        rng().uniform(static_cast<size_t>((Lb ? Lb : 1) * b_rows * b_cols), -1, 1);
    DeviceTensor da;
    if (c.a_km) {  // the same logical A, stored (K, M): at[(l, p, i)] = a[(l, i, p)]
      std::vector<double> at(a.size());
      for (int64_t l = 0; l < (La ? La : 1); ++l)
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t p = 0; p < c.k; ++p)
            at[(l * c.k + p) * c.m + i] = a[(l * c.m + i) * c.k + p];
      da = alloc_batched(c.in, La, c.k, c.m, (c.m + 7) / 8 * 8 + c.pitch_pad, c.batch_pad);
      upload_values(da, at);  // rounds at to the input dtype: the reference takes those values
      for (int64_t l = 0; l < (La ? La : 1); ++l)
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t p = 0; p < c.k; ++p)
            a[(l * c.m + i) * c.k + p] = at[(l * c.k + p) * c.m + i];
    } else {
      da = alloc_batched(c.in, La, c.m, c.k, c.k + c.pitch_pad, c.batch_pad);
      upload_values(da, a);
    }
    DeviceTensor db = alloc_batched(c.in, Lb, b_rows, b_cols, b_cols + c.pitch_pad, c.batch_pad);
    upload_values(db, b);
    DeviceTensor dd = alloc_batched(c.out, c.batch, c.m, c.n, c.n, c.batch_pad);
    std::vector<double> cv, bias;
    DeviceTensor dc, dbias;
    GemmOptions opt;
    opt.alpha = c.alpha;
    opt.beta = c.beta;
    opt.b_layout = c.layout;
    opt.a_layout = c.a_km ? ALayout::km : ALayout::mk;
    opt.activation = c.act;
    opt.split_k = c.split_k;
    if (c.bias != Bias::none) {
      bias = rng().uniform(static_cast<size_t>(c.n), -1, 1);
      dbias = to_device(c.bias == Bias::f32 ? DType::f32 : c.out, {c.n}, bias);
      opt.bias = &dbias.t;
    }
    if (c.beta != 0.f) {
      cv = rng().uniform(static_cast<size_t>(L * c.m * c.n), -1, 1);
      if (c.in_place_c) {
        upload_values(dd, cv);
        opt.c = &dd.t;
      } else {
        dc = alloc_batched(c.out, c.batch, c.m, c.n, c.n, 0);
        upload_values(dc, cv);
        opt.c = &dc.t;
      }
    }
    if (c.batch)
      bmm(da.t, db.t, dd.t, stream(), opt);
    else
      gemm(da.t, db.t, dd.t, stream(), opt);
    sync();
    std::vector<double> ref(static_cast<size_t>(L * c.m * c.n));
    for (int64_t l = 0; l < L; ++l) {
      const double* al = a.data() + (La ? l : 0) * c.m * c.k;
      const double* bl = b.data() + (Lb ? l : 0) * b_rows * b_cols;
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double s = 0.0;
          for (int64_t p = 0; p < c.k; ++p)
            s += al[i * c.k + p] * (kn ? bl[p * c.n + j] : bl[j * c.k + p]);
          s = s * c.alpha + (bias.empty() ? 0.0 : bias[j]);
          s = act_ref(c.act, s);
          const int64_t o = (l * c.m + i) * c.n + j;
          if (c.beta != 0.f) s += double{c.beta} * cv[o];
          ref[o] = s;
        }
    }
    EXPECT_TRUE(all_close(download_values(dd), ref, gemm_tolerance(c.out)));
    EXPECT_TRUE(outside_untouched(dd));
    std::vector<uint8_t> bytes = download_bytes(dd);
    if (c.repeat_bitwise && !c.in_place_c) {
      poison(dd);
      if (c.batch)
        bmm(da.t, db.t, dd.t, stream(), opt);
      else
        gemm(da.t, db.t, dd.t, stream(), opt);
      sync();
      EXPECT_TRUE(download_bytes(dd) == bytes) << "second run differs";
    }
    return bytes;
  }
};

// M in {1, 3, 127, 128, 300} x N, K in {8, 64, 136, 520}, both B layouts, bf16 in; output
// dtype and f16 input rotate through the cases.
TEST_F(GemmGpu, SmallShapesMatchFloat64) {
  const int64_t ms[] = {1, 3, 127, 128, 300};
  const int64_t nks[] = {8, 64, 136, 520};
  const DType outs[] = {DType::bf16, DType::f32, DType::f16};
  int i = 0;
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : ms)
      for (int64_t n : nks)
        for (int64_t k : nks) {
          const DType in = (i % 4 == 3) ? DType::f16 : DType::bf16;
          check({m, n, k, in, outs[i % 3], layout});
          ++i;
        }
}

// A stored transposed (ALayout::km: D = aᵀ·op(b), the weight-gradient form Xᵀ·dY): the
// 128x64 kernel (+ split-K) on small and ragged shapes, the 128x256 cluster tile on a large
// one, both B layouts, every output dtype, epilogues, pitches and batches.
TEST_F(GemmGpu, TransposedAMatchesFloat64) {
  const DType outs[] = {DType::bf16, DType::f32, DType::f16};
  int i = 0;
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : {1, 7, 127, 300})
      for (int64_t n : {8, 136})
        for (int64_t k : {8, 520}) {
          Case c{m, n, k, i % 4 == 3 ? DType::f16 : DType::bf16, outs[i % 3], layout};
          c.a_km = true;
          check(c);
          ++i;
        }
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    Case big{2100, 2312, 200, DType::bf16, DType::bf16, layout};  // 128x256 clusters, ragged
    big.a_km = true;
    big.repeat_bitwise = true;
    check(big);
    Case epi{300, 136, 520, DType::f16, DType::f32, layout, 0.5f, -1.5f, /*pitch_pad=*/24};
    epi.a_km = true;
    epi.bias = Bias::f32;
    epi.act = GemmActivation::gelu_tanh;
    check(epi);
    Case split{200, 136, 4104, DType::bf16, DType::f32, layout};  // few tiles, long K
    split.a_km = true;
    split.split_k = 4;
    split.repeat_bitwise = true;
    check(split);
    Case res{129, 264, 72, DType::bf16, DType::bf16, layout, 1.f, 1.f, 0, /*in_place_c=*/true};
    res.a_km = true;
    check(res);
    Case batched{130, 72, 136, DType::bf16, DType::bf16, layout};
    batched.a_km = true;
    batched.batch = 3;
    batched.batch_pad = 8;
    check(batched);
    batched.shared_a = true;
    check(batched);
  }
}

TEST_F(GemmGpu, AlphaBetaWithC) {
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    check({300, 136, 520, DType::bf16, DType::f32, layout, 0.5f, -1.5f});
    check({127, 64, 136, DType::f16, DType::f16, layout, -2.f, 0.25f});
    check({128, 520, 64, DType::bf16, DType::bf16, layout, 1.f, 1.f, 0, /*in_place_c=*/true});
  }
}

TEST_F(GemmGpu, PitchedOperands) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    check({300, 136, 520, DType::bf16, DType::bf16, layout, 1.f, 0.f, /*pitch_pad=*/24});
}

// Enough tiles for the 128x256 config (>= #SMs tiles) and ragged edges in M, N, K.
TEST_F(GemmGpu, LargeTileConfig) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    check({2100, 2312, 200, DType::bf16, DType::bf16, layout});
  check({2100, 2312, 72, DType::f16, DType::f32, BLayout::nk});
  Case c{2100, 2312, 136, DType::bf16, DType::bf16, BLayout::nk, 0.5f, 1.f};
  c.bias = Bias::f32;
  c.act = GemmActivation::gelu_tanh;
  check(c);
  // 128x128 tiles (>= #SMs of them, N = 136 too narrow for 128x256) with bias: both consumer
  // warpgroups share the tile's staged bias
  Case mid{8451, 136, 72, DType::bf16, DType::bf16, BLayout::nk};
  mid.bias = Bias::out;
  mid.act = GemmActivation::relu;
  check(mid);
}

// The 128x192 config (B (N,K)), forced through the tuning hook on ragged shapes with every
// output dtype and the LLM epilogues, and chosen by the tile model where 128 tiles of 128x192
// make one wave on 132 SMs (M = 509, N = 6328: neither 128x128 nor 128x256 fills a wave).
TEST_F(GemmGpu, WideTileConfig) {
  struct Reset {
    ~Reset() { gemm_detail::set_tuning(-1, 0, 0); }
  } reset;
  gemm_detail::set_tuning(5, 0, 0);
  check({300, 392, 200, DType::bf16, DType::bf16, BLayout::nk});
  check({129, 200, 72, DType::f16, DType::f32, BLayout::nk});
  Case c{385, 584, 136, DType::bf16, DType::f16, BLayout::nk, 0.5f, 1.f};
  c.bias = Bias::f32;
  c.act = GemmActivation::gelu_tanh;
  check(c);
  Case r{257, 392, 264, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f};
  r.bias = Bias::out;
  r.in_place_c = true;
  check(r);
  gemm_detail::set_tuning(-1, 0, 0);
  check({509, 6328, 136, DType::bf16, DType::bf16, BLayout::nk});
}

// 128x128 tiles in 2x1 clusters (cfg 8, B multicast), forced: ragged M (the cluster's second
// CTA partly or wholly past M), N and K, every output dtype, bias + activation, in-place
// residual; B (K,N) runs the unclustered 128x128 kernel instead.
TEST_F(GemmGpu, ClusteredMidTileConfig) {
  struct Reset {
    ~Reset() { gemm_detail::set_tuning(-1, 0, 0); }
  } reset;
  gemm_detail::set_tuning(8, 0, 0);
  check({300, 392, 200, DType::bf16, DType::bf16, BLayout::nk});
  check({100, 264, 72, DType::f16, DType::f32, BLayout::nk});
  Case c{385, 584, 136, DType::bf16, DType::f16, BLayout::nk, 0.5f, 1.f};
  c.bias = Bias::f32;
  c.act = GemmActivation::gelu_tanh;
  check(c);
  Case r{513, 392, 1032, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f};
  r.bias = Bias::out;
  r.in_place_c = true;
  check(r);
  check({257, 200, 264, DType::bf16, DType::bf16, BLayout::kn});
}

// 64x64 tiles: in 2x1 clusters (cfg 6, B multicast) and unclustered with split-K (cfg 7);
// ragged M / N / K, every output dtype, bias + activation, residual; a B (K,N) problem under the
// forced config runs the 128x64 kernel instead. Then the automatic plan on a shape that picks
// 64x64 tiles (M <= 256, 3/4..1 wave of them), at a ragged size.
TEST_F(GemmGpu, TinyTileConfigs) {
  struct Reset {
    ~Reset() { gemm_detail::set_tuning(-1, 0, 0); }
  } reset;
  for (int cfg : {6, 7}) {
    gemm_detail::set_tuning(cfg, cfg == 7 ? 3 : 0, 0);
    check({33, 72, 200, DType::bf16, DType::bf16, BLayout::nk});
    check({129, 200, 1032, DType::f16, DType::f32, BLayout::nk});
    Case c{65, 136, 136, DType::bf16, DType::f16, BLayout::nk, 0.5f, 1.f};
    c.bias = Bias::f32;
    c.act = GemmActivation::silu;
    check(c);
    Case r{200, 264, 520, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f};
    r.bias = Bias::out;
    r.in_place_c = true;
    check(r);
    check({70, 136, 200, DType::bf16, DType::bf16, BLayout::kn});
  }
  gemm_detail::set_tuning(-1, 0, 0);
  check({127, 4096, 264, DType::bf16, DType::bf16, BLayout::nk});
  // Decode rows with a weight of <= one wave of 64x64 tiles: gemm runs M = 17-32 here (split-K
  // 2 and 1); M <= 16 goes to the small-M ring kernel (gemm_small_m_preferred).
  check({16, 4104, 2056, DType::bf16, DType::bf16, BLayout::nk});
  check({32, 2056, 1032, DType::f16, DType::f32, BLayout::nk, 1.f, 0.5f});
  check({9, 4096, 520, DType::bf16, DType::bf16, BLayout::nk});
}

// 64x96 tiles in 2x1 clusters (cfg 9, B multicast), forced: ragged M / N / K, every output
// dtype (16-bit outputs store the last 32 columns of each tile from registers, f32 fills three
// 32-column boxes), bias + activation, in-place residual, a batch; B (K,N) runs the 128x64
// kernel instead.
TEST_F(GemmGpu, Tiny96TileConfig) {
  struct Reset {
    ~Reset() { gemm_detail::set_tuning(-1, 0, 0); }
  } reset;
  gemm_detail::set_tuning(9, 0, 0);
  check({128, 6144, 520, DType::bf16, DType::bf16, BLayout::nk});
  check({33, 104, 200, DType::bf16, DType::bf16, BLayout::nk});
  check({129, 200, 1032, DType::f16, DType::f32, BLayout::nk});
  check({65, 296, 136, DType::f16, DType::f16, BLayout::nk, -0.5f});
  Case c{65, 392, 136, DType::bf16, DType::f16, BLayout::nk, 0.5f, 1.f};
  c.bias = Bias::f32;
  c.act = GemmActivation::gelu_tanh;
  check(c);
  Case r{200, 264, 520, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f};
  r.bias = Bias::out;
  r.in_place_c = true;
  check(r);
  Case s{100, 200, 72, DType::bf16, DType::bf16, BLayout::nk, 1.f, 0.5f};
  s.act = GemmActivation::silu;
  check(s);
  Case bt{100, 200, 136, DType::bf16, DType::f16, BLayout::nk, 1.f, 0.5f, 8};
  bt.batch = 3;
  bt.batch_pad = 8;
  check(bt);
  check({70, 136, 200, DType::bf16, DType::bf16, BLayout::kn});
}

// A decode-shaped gemm (M = 16: the small-M family; its ring kernel's workspace cannot be
// allocated under capture, so the register kernel with one split runs) captured into a CUDA
// graph on a fresh stream; the replays match float64.
TEST_F(GemmGpu, DecodeShapeUnderGraphCapture) {
  const int64_t m = 16, n = 4104, k = 2056;
  std::vector<double> a = rng().uniform(static_cast<size_t>(m * k), -1, 1);
  std::vector<double> b = rng().uniform(static_cast<size_t>(n * k), -1, 1);
  DeviceTensor da = to_device(DType::bf16, {m, k}, a);
  DeviceTensor db = to_device(DType::bf16, {n, k}, b);
  DeviceTensor dd = alloc(DType::f32, {m, n});
  std::vector<double> ref(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[j * k + p];
      ref[i * n + j] = s;
    }
  cudaStream_t s = nullptr;
  TESSEL_TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TESSEL_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  try {
    gemm(da.t, db.t, dd.t, s, GemmOptions{});
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw under capture: " << e.what();
  }
  TESSEL_TEST_CUDA(cudaStreamEndCapture(s, &graph));
  TESSEL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    poison(dd);
    TESSEL_TEST_CUDA(cudaGraphLaunch(exec, s));
    TESSEL_TEST_CUDA(cudaStreamSynchronize(s));
    EXPECT_TRUE(all_close(download_values(dd), ref, gemm_tolerance(DType::f32)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// Every activation with and without bias (f32 and d's dtype) and residual, per output dtype.
TEST_F(GemmGpu, FusedEpilogues) {
  const GemmActivation acts[] = {GemmActivation::none, GemmActivation::relu,
                                 GemmActivation::gelu_tanh, GemmActivation::gelu,
                                 GemmActivation::silu};
  int i = 0;
  for (DType out : {DType::bf16, DType::f16, DType::f32})
    for (GemmActivation act : acts)
      for (Bias bias : {Bias::none, Bias::f32, Bias::out}) {
        Case c{i % 2 ? 127 : 300,
               136,
               200,
               out == DType::f16 ? DType::f16 : DType::bf16,
               out,
               i % 3 == 2 ? BLayout::kn : BLayout::nk};
        c.bias = bias;
        c.act = act;
        if (i % 4 == 1) {  // residual
          c.beta = 1.f;
          c.in_place_c = i % 8 == 1;
        }
        check(c);
        ++i;
      }
}

// The LLM combinations: bias + GELU (MLP up), bias + residual (projections), SiLU (gate).
TEST_F(GemmGpu, LlmCombinations) {
  Case up{256, 520, 264, DType::bf16, DType::bf16, BLayout::nk};
  up.bias = Bias::out;
  up.act = GemmActivation::gelu_tanh;
  check(up);
  Case proj{256, 264, 520, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f};
  proj.bias = Bias::out;
  check(proj);
  proj.in_place_c = true;
  check(proj);
  Case gate{33, 264, 256, DType::f16, DType::f16, BLayout::nk};
  gate.act = GemmActivation::silu;
  check(gate);
}

// Forced K slices, odd counts and uneven K blocks, every output dtype, with epilogues; two
// runs give the same bits.
TEST_F(GemmGpu, SplitK) {
  int i = 0;
  for (int s : {2, 3, 5})
    for (int64_t m : {1, 127, 300})
      for (BLayout layout : {BLayout::nk, BLayout::kn}) {
        const DType out = i % 3 == 0 ? DType::bf16 : i % 3 == 1 ? DType::f32 : DType::f16;
        Case c{m, i % 2 ? 520 : 136, 1000, DType::bf16, out, layout};
        c.split_k = s;
        if (i % 4 == 1) {
          c.bias = Bias::f32;
          c.act = GemmActivation::gelu_tanh;
        }
        if (i % 4 == 2) c.beta = 1.f;
        check(c);
        ++i;
      }
  // automatic choice on a long-K, small-M·N shape, f16 in
  check({128, 264, 4096, DType::f16, DType::f32, BLayout::nk});
  // bias + activation with K slices on the B (N,K) small-M configs (64x128 for M <= 128;
  // 128x64 in clusters of 2 along N for M <= 512, where the last cluster's second tile lies
  // past N = 264)
  for (int64_t m : {64, 127, 300, 509}) {
    Case c{m, 264, 1000, DType::bf16, m % 2 ? DType::bf16 : DType::f32, BLayout::nk};
    c.split_k = 3;
    c.bias = m < 300 ? Bias::f32 : Bias::out;
    c.act = GemmActivation::silu;
    check(c);
  }
}

TEST_F(GemmGpu, SplitKIsDeterministic) {
  for (int s : {4, 7}) {
    Case c{200, 520, 2048, DType::bf16, DType::f32, BLayout::nk};
    c.split_k = s;
    c.repeat_bitwise = true;
    check(c);
  }
}

// Keys of the "gemm" family in the process's autotuner cache.
std::vector<std::string> gemm_keys() {
  std::vector<std::string> keys;
  for (const auto& [key, e] : autotune::global_cache().entries())
    if (key.rfind("gemm|", 0) == 0) keys.push_back(key);
  return keys;
}

// The autotuner of the TMA/WGMMA kernels (family "gemm"), on a fresh cache file: every shape
// above the tuning threshold gets a cache entry; the tuned plan computes the right result
// (candidates are measured into scratch, so an in-place C = D is read intact afterwards);
// the choice is sticky (bitwise equal second call); bmm keys carry the batch; with
// TESSEL_AUTOTUNE=0 nothing is measured or stored. Shapes are ones no other test uses (the
// choice is memoized per process and exact problem).
TEST_F(GemmGpu, AutotunedPlans) {
  std::random_device rd;
  const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                      ("tessel-gemm-tune-" + std::to_string(rd()) + ".json");
  ScopedEnv path("TESSEL_AUTOTUNE_CACHE", cache.c_str());
  ScopedEnv on("TESSEL_AUTOTUNE", nullptr);
  ASSERT_TRUE(gemm_keys().empty());
  Case r{296, 1048, 264, DType::bf16, DType::bf16, BLayout::nk, 0.5f, 1.f};
  r.bias = Bias::f32;
  r.act = GemmActivation::gelu_tanh;
  r.in_place_c = true;
  check(r);
  ASSERT_EQ(gemm_keys().size(), 1u);
  Case twice{232, 1304, 392, DType::f16, DType::f32, BLayout::kn};
  twice.repeat_bitwise = true;
  check(twice);
  Case batched{184, 344, 528, DType::bf16, DType::bf16, BLayout::nk};
  batched.batch = 3;
  check(batched);
  const std::vector<std::string> keys = gemm_keys();
  ASSERT_EQ(keys.size(), 3u);
  int with_batch = 0;
  for (const std::string& k : keys) with_batch += k.find("|nk-b3|") != std::string::npos;
  EXPECT_EQ(with_batch, 1);
  EXPECT_TRUE(std::filesystem::exists(cache));
  {
    ScopedEnv off("TESSEL_AUTOTUNE", "0");
    check({168, 1064, 536, DType::bf16, DType::bf16, BLayout::nk});
  }
  EXPECT_EQ(gemm_keys().size(), 3u) << "TESSEL_AUTOTUNE=0 stored a choice";
  // Below the threshold (launch-bound): the deterministic plan, no entry.
  check({40, 72, 136, DType::bf16, DType::bf16, BLayout::nk});
  EXPECT_EQ(gemm_keys().size(), 3u);
  std::error_code ec;
  std::filesystem::remove(cache, ec);
}

TEST_F(GemmGpu, BatchedMatchesFloat64) {
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    Case c{127, 136, 200, DType::bf16, DType::bf16, layout};
    c.batch = 3;
    check(c);
    c.shared_b = true;  // one weight for every batch
    check(c);
    c.shared_b = false;
    c.shared_a = true;
    check(c);
    c.shared_a = false;
    c.batch_pad = 40;  // batches further apart than dense
    c.pitch_pad = 8;
    c.out = DType::f32;
    check(c);
  }
  Case e{64, 264, 136, DType::f16, DType::f16, BLayout::nk, 0.5f, 1.f};
  e.batch = 5;
  e.bias = Bias::f32;
  e.act = GemmActivation::silu;
  check(e);
  Case s{3, 136, 1000, DType::bf16, DType::f32, BLayout::kn};
  s.batch = 4;
  s.split_k = 3;
  check(s);
  Case one{130, 8, 8, DType::bf16, DType::bf16, BLayout::nk};
  one.batch = 1;
  check(one);
  // many batches of small matrices (attention-like)
  Case many{64, 64, 64, DType::bf16, DType::bf16, BLayout::kn};
  many.batch = 48;
  check(many);
}

TEST_F(GemmGpu, ZeroK) {
  Case c{5, 16, 0, DType::bf16, DType::f32, BLayout::nk, 1.f, 2.f};
  check(c);
  c.bias = Bias::f32;
  c.act = GemmActivation::gelu;
  check(c);
  c.batch = 2;
  check(c);
}

// ---- validation (CPU only: errors are raised before any device access) -----------------
Tensor fake(DType dt, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(reinterpret_cast<void*>(uintptr_t{1} << 20), dt, shape);
}

void expect_error(const Tensor& a, const Tensor& b, Tensor d, const GemmOptions& opt,
                  const std::string& arg, const std::string& needle, bool batched = false) {
  const char* op = batched ? "bmm" : "gemm";
  try {
    if (batched)
      bmm(a, b, d, nullptr, opt);
    else
      gemm(a, b, d, nullptr, opt);
    ADD_FAILURE() << "expected tessel::Error mentioning " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT) << msg;
    EXPECT_NE(msg.find(op), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + arg + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(GemmErrors, RejectsBadArguments) {
  const GemmOptions nk{};
  GemmOptions kn;
  kn.b_layout = BLayout::kn;
  // N or K not a multiple of 8
  expect_error(fake(DType::bf16, {16, 12}), fake(DType::bf16, {16, 12}),
               fake(DType::bf16, {16, 16}), nk, "a", "multiple of 8");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {12, 16}),
               fake(DType::bf16, {16, 12}), nk, "b", "multiple of 8");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 20}),
               fake(DType::bf16, {16, 20}), kn, "b", "multiple of 8");
  // dtype mismatch / unsupported
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::f16, {16, 16}), fake(DType::bf16, {16, 16}),
               nk, "b", "bf16");
  expect_error(fake(DType::f32, {16, 16}), fake(DType::f32, {16, 16}), fake(DType::f32, {16, 16}),
               nk, "a", "f32");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}), fake(DType::i32, {16, 16}),
               nk, "d", "i32");
  // shape mismatch
  expect_error(fake(DType::bf16, {16, 32}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), nk, "b", "K = 32");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {24, 16}),
               fake(DType::bf16, {16, 16}), nk, "d", "(16, 24)");
  // beta without c, c of the wrong dtype / shape
  GemmOptions beta;
  beta.beta = 1.f;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), beta, "c", "beta");
  Tensor c32 = fake(DType::f32, {16, 16});
  beta.c = &c32;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), beta, "c", "f32");
  Tensor c_small = fake(DType::bf16, {8, 16});
  beta.c = &c_small;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), beta, "c", "(8, 16)");
  // rank
  expect_error(fake(DType::bf16, {2, 16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), nk, "a", "3");
  // bias: wrong length, rank, dtype
  GemmOptions bo;
  Tensor bias_short = fake(DType::f32, {8});
  bo.bias = &bias_short;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {24, 16}),
               fake(DType::bf16, {16, 24}), bo, "bias", "(24,)");
  Tensor bias_2d = fake(DType::f32, {1, 24});
  bo.bias = &bias_2d;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {24, 16}),
               fake(DType::bf16, {16, 24}), bo, "bias", "(24,)");
  Tensor bias_f16 = fake(DType::f16, {24});
  bo.bias = &bias_f16;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {24, 16}),
               fake(DType::bf16, {16, 24}), bo, "bias", "f16");
  // activation / split_k out of range
  GemmOptions bad_act;
  bad_act.activation = static_cast<GemmActivation>(9);
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), bad_act, "activation", "9");
  GemmOptions bad_a;
  bad_a.a_layout = static_cast<ALayout>(3);
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), bad_a, "a_layout", "3");
  // a_layout km: a is (K, M); K taken from its rows
  GemmOptions km;
  km.a_layout = ALayout::km;
  expect_error(fake(DType::bf16, {32, 16}), fake(DType::bf16, {24, 16}),
               fake(DType::bf16, {16, 24}), km, "b", "K = 32 (a's rows");
  expect_error(fake(DType::bf16, {16, 40}), fake(DType::bf16, {24, 16}),
               fake(DType::bf16, {16, 24}), km, "d", "(40, 24)");
  GemmOptions bad_split;
  bad_split.split_k = -2;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               fake(DType::bf16, {16, 16}), bad_split, "split_k", "-2");
  // pitch not a multiple of 8
  Tensor a_pitch = fake(DType::bf16, {16, 16});
  a_pitch.strides[0] = 20;
  expect_error(a_pitch, fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}), nk, "a", "pitch");
}

TEST(GemmErrors, RejectsBadBatchedArguments) {
  const GemmOptions nk{};
  // d must be 3-D
  expect_error(fake(DType::bf16, {2, 16, 16}), fake(DType::bf16, {2, 16, 16}),
               fake(DType::bf16, {16, 16}), nk, "d", "3-D", true);
  // batch mismatch
  expect_error(fake(DType::bf16, {3, 16, 16}), fake(DType::bf16, {2, 16, 16}),
               fake(DType::bf16, {2, 16, 16}), nk, "a", "batch 2", true);
  expect_error(fake(DType::bf16, {2, 16, 16}), fake(DType::bf16, {3, 16, 16}),
               fake(DType::bf16, {2, 16, 16}), nk, "b", "batch 2", true);
  // batch stride not a multiple of 8
  Tensor a_odd = fake(DType::bf16, {2, 16, 16});
  a_odd.strides[0] = 260;
  expect_error(a_odd, fake(DType::bf16, {2, 16, 16}), fake(DType::bf16, {2, 16, 16}), nk, "a",
               "batch stride", true);
  // overlapping output batches
  Tensor d_bcast = fake(DType::bf16, {2, 16, 16});
  d_bcast.strides[0] = 0;
  expect_error(fake(DType::bf16, {2, 16, 16}), fake(DType::bf16, {2, 16, 16}), d_bcast, nk, "d",
               "batch stride", true);
  // rank 4
  expect_error(fake(DType::bf16, {1, 2, 16, 16}), fake(DType::bf16, {2, 16, 16}),
               fake(DType::bf16, {2, 16, 16}), nk, "a", "4-D", true);
}

TEST(GemmErrors, EmptyIsNoOp) {
  Tensor a = Tensor::contiguous(nullptr, DType::bf16, {0, 16});
  Tensor b = Tensor::contiguous(nullptr, DType::bf16, {16, 16});
  Tensor d = Tensor::contiguous(nullptr, DType::bf16, {0, 16});
  EXPECT_NO_THROW(gemm(a, b, d, nullptr));
  Tensor a3 = Tensor::contiguous(nullptr, DType::bf16, {0, 4, 16});
  Tensor d3 = Tensor::contiguous(nullptr, DType::bf16, {0, 4, 16});
  EXPECT_NO_THROW(bmm(a3, b, d3, nullptr));
}

TEST(GemmErrors, ActivationNames) {
  EXPECT_STREQ(gemm_activation_name(GemmActivation::gelu_tanh), "gelu_tanh");
  EXPECT_STREQ(gemm_activation_name(GemmActivation::silu), "silu");
}

}  // namespace
}  // namespace tessel::test
