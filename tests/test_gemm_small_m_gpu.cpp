// Small-M GEMM (tessel::detail::gemm_small_m, the decode path for M = 1…32): float64
// reference over M ∈ {1,2,3,7,16,17,32} × N ∈ {8,136,4104} × K ∈ {8,520,4096} for B (N,K),
// the same grid (thinned) for B (K,N); bf16/f16 in, f32/bf16/f16 out; alpha/beta with C
// (separate and in place); pitched operands; every autotuner config; determinism; CUDA
// graph capture; the same problems through tessel::gemm; the SwiGLU-fused down GEMM; the
// RMSNorm-fused projection (gemm_small_m_rms).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/gemm/gemm_small_m.hpp"
#include "tessel/activation.hpp"
#include "tessel/gemm.hpp"
#include "test_util.hpp"

namespace tessel::test {
namespace {

// f32 output: fp32 accumulation (up to 4096 terms, MMA + split-K order) against float64.
Tolerance small_m_tolerance(DType out) {
  return out == DType::f32 ? Tolerance{5e-5, 1e-4} : tolerance(out);
}

enum class Path { detail, gemm, config };

struct Case {
  int64_t m, n, k;
  DType in, out;
  BLayout layout;
  float alpha = 1.f, beta = 0.f;
  int64_t pitch_pad = 0;  // extra elements per row of a, b and d (multiple of 8)
  bool in_place_c = false;
  Path path = Path::detail;
  int config = -1;  // Path::config
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " in=" + dtype_name(c.in) + " out=" + dtype_name(c.out) +
         (c.layout == BLayout::nk ? " B(N,K)" : " B(K,N)") + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " pad=" + std::to_string(c.pitch_pad) +
         (c.in_place_c ? " c=d" : "") +
         (c.path == Path::gemm     ? " via tessel::gemm"
          : c.path == Path::config ? " config " + std::to_string(c.config)
                                   : "");
}

// Host inputs and reference of one problem, reusable across configs.
struct Problem {
  std::vector<double> a, b, cv, ref;
};

class GemmSmallMGpu : public GpuTest {
 protected:
  Problem make(const Case& c) {
    const bool kn = c.layout == BLayout::kn;
    Problem p;
    p.a = rng().uniform(static_cast<size_t>(c.m * c.k), -1, 1);
    p.b = rng().uniform(static_cast<size_t>(c.n * c.k), -1, 1);
    p.a = ref::quantize(storage(c.in), p.a);
    p.b = ref::quantize(storage(c.in), p.b);
    if (c.beta != 0.f) {
      p.cv = rng().uniform(static_cast<size_t>(c.m * c.n), -1, 1);
      p.cv = ref::quantize(storage(c.out), p.cv);
    }
    // float64 reference; B(K,N) is read through its (N,K) transpose for locality.
    std::vector<double> bt(p.b.size());
    for (int64_t j = 0; j < c.n; ++j)
      for (int64_t q = 0; q < c.k; ++q) bt[j * c.k + q] = kn ? p.b[q * c.n + j] : p.b[j * c.k + q];
    p.ref.assign(static_cast<size_t>(c.m * c.n), 0.0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        const double* ar = &p.a[i * c.k];
        const double* br = &bt[j * c.k];
        double s = 0.0;
        for (int64_t q = 0; q < c.k; ++q) s += ar[q] * br[q];
        s *= c.alpha;
        if (c.beta != 0.f) s += double{c.beta} * p.cv[i * c.n + j];
        p.ref[i * c.n + j] = s;
      }
    return p;
  }

  // Runs the case on fresh device buffers; returns the output bytes (for determinism).
  std::vector<uint8_t> run(const Case& c, Problem& p, bool expect_handled = true) {
    SCOPED_TRACE(describe(c));
    const bool kn = c.layout == BLayout::kn;
    const int64_t b_rows = kn ? c.k : c.n, b_cols = kn ? c.n : c.k;
    DeviceTensor da = alloc_pitched(c.in, {c.m, c.k}, c.k + c.pitch_pad);
    DeviceTensor db = alloc_pitched(c.in, {b_rows, b_cols}, b_cols + c.pitch_pad);
    upload_values(da, p.a);
    upload_values(db, p.b);
    DeviceTensor dd = alloc_pitched(c.out, {c.m, c.n}, c.n + c.pitch_pad);
    DeviceTensor dc;
    GemmOptions opt;
    opt.alpha = c.alpha;
    opt.beta = c.beta;
    opt.b_layout = c.layout;
    if (c.beta != 0.f) {
      if (c.in_place_c) {
        upload_values(dd, p.cv);
        opt.c = &dd.t;
      } else {
        dc = alloc(c.out, {c.m, c.n});
        upload_values(dc, p.cv);
        opt.c = &dc.t;
      }
    }
    bool handled = true;
    switch (c.path) {
      case Path::detail: handled = detail::gemm_small_m(da.t, db.t, dd.t, opt, stream()); break;
      case Path::gemm: gemm(da.t, db.t, dd.t, stream(), opt); break;
      case Path::config:
        handled = detail::gemm_small_m_with_config(da.t, db.t, dd.t, opt, stream(), c.config);
        break;
    }
    sync();
    EXPECT_EQ(handled, expect_handled);
    if (!handled) return {};
    EXPECT_TRUE(all_close(download_values(dd), p.ref, small_m_tolerance(c.out)));
    if (c.pitch_pad != 0) EXPECT_TRUE(outside_untouched(dd));
    return download_bytes(dd);
  }

  void check(const Case& c) {
    Problem p = make(c);
    run(c, p);
  }
};

// The full grid for B (N,K), bf16 in; output dtype rotates f32 / bf16 / f16, f16 input on
// every fourth case.
TEST_F(GemmSmallMGpu, GridNKMatchesFloat64) {
  const int64_t ms[] = {1, 2, 3, 7, 16, 17, 32};
  const int64_t ns[] = {8, 136, 4096 + 8};
  const int64_t ks[] = {8, 520, 4096};
  const DType outs[] = {DType::f32, DType::bf16, DType::f16};
  int i = 0;
  for (int64_t m : ms)
    for (int64_t n : ns)
      for (int64_t k : ks) {
        const DType in = (i % 4 == 3) ? DType::f16 : DType::bf16;
        check({m, n, k, in, outs[i % 3], BLayout::nk});
        ++i;
      }
}

// B (K,N): every (N, K) pair, M rotating through the list.
TEST_F(GemmSmallMGpu, GridKNMatchesFloat64) {
  const int64_t ms[] = {1, 2, 3, 7, 16, 17, 32};
  const int64_t ns[] = {8, 136, 4096 + 8};
  const int64_t ks[] = {8, 520, 4096};
  int i = 0;
  for (int64_t n : ns)
    for (int64_t k : ks) {
      for (int r = 0; r < 2; ++r, ++i) {
        const DType in = (i % 3 == 2) ? DType::f16 : DType::bf16;
        check({ms[(3 * i + r) % 7], n, k, in, i % 2 ? DType::bf16 : DType::f32, BLayout::kn});
      }
    }
}

TEST_F(GemmSmallMGpu, AlphaBetaWithC) {
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    check({7, 136, 520, DType::bf16, DType::f32, layout, 0.5f, -1.5f});
    check({17, 4104, 4096, DType::bf16, DType::bf16, layout, -2.f, 0.25f});
    check({32, 136, 4096, DType::f16, DType::f16, layout, 1.f, 1.f, 0, /*in_place_c=*/true});
    check({1, 4104, 520, DType::bf16, DType::bf16, layout, 1.25f, 0.5f, 0, /*in_place_c=*/true});
  }
}

TEST_F(GemmSmallMGpu, PitchedOperands) {
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    check({3, 136, 520, DType::bf16, DType::bf16, layout, 1.f, 0.f, /*pitch_pad=*/24});
    check({32, 4104, 4096, DType::bf16, DType::f32, layout, 1.f, 0.f, /*pitch_pad=*/8});
  }
}

// Every config the autotuner may pick is correct (ragged N and K, several token tiles, one
// or many splits, partial phases of A).
TEST_F(GemmSmallMGpu, EveryConfigMatchesFloat64) {
  const Case shapes[] = {
      {17, 136, 4096, DType::bf16, DType::f32, BLayout::nk, 0.75f, 0.5f},
      {3, 4104, 520, DType::bf16, DType::bf16, BLayout::nk},
      {32, 136, 4096, DType::bf16, DType::f32, BLayout::kn, 1.f, -1.f},
      {9, 4104, 520, DType::f16, DType::f16, BLayout::kn},
      // M <= 8, B (N,K): the ring kernel's configs too — slabs cut across CTAs (one stage per
      // CTA; ~2 per CTA with a 56-stage K), and runs of whole slabs (small_m_ring_slab_runs)
      // on every SM for 8200 rows (513 slabs on 114-132 SMs) and on fewer CTAs for 3080 rows
      // (193 slabs: 97 CTAs on 132 SMs), ragged last slab and K tail.
      {1, 136, 4096, DType::bf16, DType::f32, BLayout::nk, 0.75f, 0.5f},
      {8, 264, 14336, DType::f16, DType::f32, BLayout::nk},
      {5, 8200, 4104, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f, 0, /*in_place_c=*/true},
      {2, 3080, 2056, DType::bf16, DType::bf16, BLayout::nk, 1.f, 0.5f},
      // M = 9 ... 32, B (N,K): the ring kernel with 2 and 4 token tiles (the first one
      // ragged: 17 above, 9 and 13 here) and 16-, 32- and 64-row stages; whole-slab runs on
      // every SM and on fewer CTAs, slabs cut between CTAs (264 rows, 14336 k).
      {16, 8200, 4104, DType::bf16, DType::bf16, BLayout::nk, 1.f, 1.f, 0, /*in_place_c=*/true},
      {32, 3080, 2056, DType::f16, DType::f32, BLayout::nk, 1.f, 0.5f},
      {9, 264, 14336, DType::bf16, DType::f32, BLayout::nk},
      {13, 4104, 1032, DType::f16, DType::bf16, BLayout::nk, -0.5f, 0.25f},
  };
  for (Case c : shapes) {
    Problem p = make(c);
    c.path = Path::config;
    for (int cfg = 0; cfg < detail::gemm_small_m_num_configs(); ++cfg) {
      c.config = cfg;
      run(c, p);
    }
  }
}

// Same inputs, same config: bit-identical output (split-K reduced in fixed order).
TEST_F(GemmSmallMGpu, Deterministic) {
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    Case c{16, 4104, 4096, DType::bf16, DType::f32, layout};
    Problem p = make(c);
    c.path = Path::config;
    c.config = 7;  // 16 splits
    const std::vector<uint8_t> first = run(c, p);
    EXPECT_EQ(first, run(c, p));
    c.config = -1;  // the autotuner's choice, twice
    const std::vector<uint8_t> tuned = run(c, p);
    EXPECT_EQ(tuned, run(c, p));
  }
}

// Problems the small-M path does not take are refused without touching the output.
TEST_F(GemmSmallMGpu, RefusesWhatItDoesNotHandle) {
  DeviceTensor a = alloc(DType::bf16, {33, 64});
  DeviceTensor b = alloc(DType::bf16, {64, 64});
  DeviceTensor d = alloc(DType::bf16, {33, 64});
  EXPECT_FALSE(detail::gemm_small_m(a.t, b.t, d.t, GemmOptions{}, stream()));  // M = 33
  DeviceTensor a0 = alloc(DType::bf16, {4, 0});
  DeviceTensor b0 = alloc(DType::bf16, {64, 0});
  DeviceTensor d0 = alloc(DType::bf16, {4, 64});
  EXPECT_FALSE(detail::gemm_small_m(a0.t, b0.t, d0.t, GemmOptions{}, stream()));  // K = 0
  sync();
  for (const DeviceTensor* t : {&d, &d0})
    for (uint8_t byte : download_buffer(*t)) ASSERT_EQ(byte, 0xFF) << "output written";
}

// Through the public entry point (the main GEMM engineer routes M <= 32 here; before that
// the general kernel answers, and this still checks the shapes).
TEST_F(GemmSmallMGpu, ThroughTesselGemm) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : {1, 16, 32}) {
      Case c{m, 4104, 520, DType::bf16, DType::bf16, layout, 1.f, 0.5f};
      c.path = Path::gemm;
      check(c);
    }
}

// Captured into a CUDA graph on a fresh stream (no workspace, nothing tuned for it): no
// tuning and no allocation happen during capture; replays give the reference result.
TEST_F(GemmSmallMGpu, GraphCapture) {
  const Case c{16, 4104, 4096, DType::bf16, DType::f32, BLayout::nk};
  Problem p = make(c);
  DeviceTensor da = alloc(c.in, {c.m, c.k});
  DeviceTensor db = alloc(c.in, {c.n, c.k});
  upload_values(da, p.a);
  upload_values(db, p.b);
  DeviceTensor dd = alloc(c.out, {c.m, c.n});
  cudaStream_t s = nullptr;
  TESSEL_TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TESSEL_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  bool handled = false;
  try {
    handled = detail::gemm_small_m(da.t, db.t, dd.t, GemmOptions{}, s);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw under capture: " << e.what();
  }
  TESSEL_TEST_CUDA(cudaStreamEndCapture(s, &graph));
  EXPECT_TRUE(handled);
  TESSEL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    poison(dd);
    TESSEL_TEST_CUDA(cudaGraphLaunch(exec, s));
    TESSEL_TEST_CUDA(cudaStreamSynchronize(s));
    EXPECT_TRUE(all_close(download_values(dd), p.ref, small_m_tolerance(c.out)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// gemm_small_m_swiglu (the engine's fused SwiGLU down projection) equals tessel::swiglu
// followed by gemm_small_m bit for bit, and both match float64 on the rounded activation.
TEST_F(GemmSmallMGpu, SwigluFusedEqualsUnfused) {
  struct S {
    int64_t m, n, k;
    DType dt;
  };
  for (const S& c :
       {S{1, 2048, 8192, DType::bf16}, S{2, 4104, 14336, DType::f16}, S{7, 136, 520, DType::bf16},
        S{16, 4104, 1024, DType::f16}, S{32, 264, 4096, DType::bf16}, S{3, 8, 8, DType::bf16}}) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) +
                 " K=" + std::to_string(c.k) + " " + dtype_name(c.dt));
    // gate_up: (M, 2K) [gate | up] with a padded row pitch, gate values wide enough to cover
    // both tails of silu.
    std::vector<double> gu = rng().uniform(static_cast<size_t>(c.m * 2 * c.k), -6, 6);
    std::vector<double> w = rng().uniform(static_cast<size_t>(c.n * c.k), -1, 1);
    DeviceTensor dgu = alloc_pitched(c.dt, {c.m, 2 * c.k}, 2 * c.k + 8);
    DeviceTensor dw = alloc(c.dt, {c.n, c.k});
    upload_values(dgu, gu);
    upload_values(dw, w);
    Tensor gate = dgu.t, up = dgu.t;
    gate.shape[1] = up.shape[1] = c.k;
    up.data = static_cast<char*>(dgu.t.data) + c.k * dtype_size(c.dt);
    DeviceTensor act = alloc(c.dt, {c.m, c.k});
    DeviceTensor d_ref = alloc(c.dt, {c.m, c.n});
    DeviceTensor d_fused = alloc(c.dt, {c.m, c.n});
    swiglu(gate, up, act.t, stream());
    // The autotuner's choices (tuned separately for the fused problem: float64 check below),
    // then every config (the ring kernel's included) bit for bit against the unfused GEMM with
    // the same config.
    std::vector<int> configs = {-1};
    for (int cfg = 0; cfg < detail::gemm_small_m_num_configs(); ++cfg)
      if (cfg % 5 == 0 || detail::gemm_small_m_is_ring_config(cfg)) configs.push_back(cfg);
    for (int cfg : configs) {
      SCOPED_TRACE("config " + std::to_string(cfg));
      ASSERT_TRUE(
          detail::gemm_small_m_with_config(act.t, dw.t, d_ref.t, GemmOptions{}, stream(), cfg));
      if (!detail::gemm_small_m_swiglu(dgu.t, dw.t, d_fused.t, GemmOptions{}, stream(), cfg)) {
        // Refused only where the ring kernel would run the plain problem (forced, or the
        // plain problem's choice for -1) but its SwiGLU prologue cannot (more than
        // 2048 / stage_k tokens).
        EXPECT_TRUE((cfg < 0 || detail::gemm_small_m_is_ring_config(cfg)) && c.m > 1);
        continue;
      }
      sync();
      if (cfg >= 0) EXPECT_EQ(download_bytes(d_fused), download_bytes(d_ref));
    }
    // float64 GEMM of the rounded activation (what both consumed).
    const std::vector<double> a = download_values(act);
    std::vector<double> ref(static_cast<size_t>(c.m * c.n), 0.0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < c.k; ++q) s += a[i * c.k + q] * w[j * c.k + q];
        ref[i * c.n + j] = s;
      }
    EXPECT_TRUE(all_close(download_values(d_fused), ref, tolerance(c.dt)));
    // and the activation itself against float64 silu(g)·u
    std::vector<double> act_ref(static_cast<size_t>(c.m * c.k));
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t q = 0; q < c.k; ++q) {
        const double g = gu[i * 2 * c.k + q], u = gu[i * 2 * c.k + c.k + q];
        act_ref[i * c.k + q] = g / (1.0 + std::exp(-g)) * u;
      }
    EXPECT_TRUE(all_close(a, act_ref, tolerance(c.dt)));
  }
  // Refused (nothing written): gate_up not (M, 2K), M = 33.
  DeviceTensor gu = alloc(DType::bf16, {4, 100});
  DeviceTensor w = alloc(DType::bf16, {64, 64});
  DeviceTensor d = alloc(DType::bf16, {4, 64});
  EXPECT_FALSE(detail::gemm_small_m_swiglu(gu.t, w.t, d.t, GemmOptions{}, stream()));
  DeviceTensor gu33 = alloc(DType::bf16, {33, 128});
  DeviceTensor d33 = alloc(DType::bf16, {33, 64});
  EXPECT_FALSE(detail::gemm_small_m_swiglu(gu33.t, w.t, d33.t, GemmOptions{}, stream()));
  sync();
  for (const DeviceTensor* t : {&d, &d33})
    for (uint8_t byte : download_buffer(*t)) ASSERT_EQ(byte, 0xFF) << "output written";
}

// gemm_small_m_rms (the projection after an RMSNorm, 1/rms of each row of A applied in the
// epilogue) against float64 on the uploaded values: plain (D poisoned) and with a residual
// added in place (opt.c = d, beta 1), for the autotuner's choice and a spread of configs
// (every ring config); bit-identical on a repeat; refusals leave D untouched.
TEST_F(GemmSmallMGpu, RmsNormFusedMatchesFloat64) {
  struct S {
    int64_t m, n, k;
    DType dt;
    int64_t a_pad, b_pad, d_pad;  // extra elements per row of a, b, d (multiples of 8)
  };
  constexpr float kEps = 1e-5f;
  constexpr float kAlpha = 0.75f;
  // A's rows have different ranges ([-s, s], s cycling through this list): r differs by up
  // to 600x between rows, so a row scaled by another row's r fails; s = 0.005 makes
  // mean(A²) ≈ 8e-6, the size of eps, so a dropped or misapplied eps fails too.
  const double row_scale[] = {3.0, 0.005, 1.0, 0.25, 2.0, 0.05, 0.6};
  std::vector<int> configs = {-1};
  for (int cfg = 0; cfg < detail::gemm_small_m_num_configs(); ++cfg)
    if (cfg % 5 == 0 || detail::gemm_small_m_is_ring_config(cfg)) configs.push_back(cfg);
  // Ragged N and K (N = 200, K = 1000: not multiples of 16 or of a ring stage), 1-32 rows
  // (one, two and four token tiles), pitched A always, pitched B and D in some cases.
  const S shapes[] = {
      {1, 4104, 4096, DType::bf16, 8, 0, 0},  {2, 200, 1000, DType::f16, 24, 8, 8},
      {5, 6152, 520, DType::bf16, 8, 0, 8},   {16, 2056, 4096, DType::bf16, 16, 0, 0},
      {32, 264, 2048, DType::f16, 8, 8, 24},  {1, 8, 8, DType::bf16, 8, 8, 8},
      {7, 28680, 1024, DType::bf16, 8, 0, 0},
  };
  int case_index = 0;
  for (const S& c : shapes) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) +
                 " K=" + std::to_string(c.k) + " " + dtype_name(c.dt) +
                 " pads a/b/d=" + std::to_string(c.a_pad) + "/" + std::to_string(c.b_pad) + "/" +
                 std::to_string(c.d_pad));
    std::vector<double> a;
    for (int64_t i = 0; i < c.m; ++i) {
      const double s = row_scale[(i + case_index) % std::size(row_scale)];
      const std::vector<double> row = rng().uniform(static_cast<size_t>(c.k), -s, s);
      a.insert(a.end(), row.begin(), row.end());
    }
    ++case_index;
    std::vector<double> w = rng().uniform(static_cast<size_t>(c.n * c.k), -1, 1);
    // The norm weight: both signs, magnitudes 0-2 (A ⊙ nw is what the GEMM consumes).
    std::vector<double> nwv = rng().uniform(static_cast<size_t>(c.k), -2, 2);
    // C of the size of alpha · r · A·Bᵀ (rms ≈ 0.43 sqrt(K)), so a lost residual fails.
    const double c_amp = 0.5 * std::sqrt(static_cast<double>(c.k));
    std::vector<double> cv = rng().uniform(static_cast<size_t>(c.m * c.n), -c_amp, c_amp);
    DeviceTensor da = alloc_pitched(c.dt, {c.m, c.k}, c.k + c.a_pad);
    DeviceTensor db = alloc_pitched(c.dt, {c.n, c.k}, c.k + c.b_pad);
    DeviceTensor dd = alloc_pitched(c.dt, {c.m, c.n}, c.n + c.d_pad);
    DeviceTensor dnw = alloc(c.dt, {c.k});
    upload_values(dnw, nwv);
    nwv = download_values(dnw);
    upload_values(da, a);
    upload_values(db, w);
    upload_values(dd, cv);
    // float64 reference from what the GPU holds: r from A, the sums over A ⊙ nw rounded to the
    // dtype (the kernel's fp32 product of two 16-bit values is exact, then rounded once).
    a = download_values(da);
    w = download_values(db);
    cv = download_values(dd);
    std::vector<double> ref_plain(static_cast<size_t>(c.m * c.n));
    std::vector<double> ref_res(ref_plain.size());
    for (int64_t i = 0; i < c.m; ++i) {
      const double* ar = &a[i * c.k];
      double ss = 0;
      for (int64_t q = 0; q < c.k; ++q) ss += ar[q] * ar[q];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(c.k) + double{kEps});
      std::vector<double> an(static_cast<size_t>(c.k));
      for (int64_t q = 0; q < c.k; ++q) an[q] = ar[q] * nwv[q];
      an = ref::quantize(storage(c.dt), an);
      for (int64_t j = 0; j < c.n; ++j) {
        const double* wr = &w[j * c.k];
        double s = 0;
        for (int64_t q = 0; q < c.k; ++q) s += an[q] * wr[q];
        ref_plain[i * c.n + j] = r * s;
        ref_res[i * c.n + j] = double{kAlpha} * r * s + cv[i * c.n + j];
      }
    }
    for (int cfg : configs) {
      SCOPED_TRACE(cfg < 0 ? std::string("config -1 (autotuner)")
                           : detail::gemm_small_m_config_name(cfg));
      // (a) plain: alpha 1, beta 0, D poisoned; then again on a re-poisoned D, bit for bit.
      {
        SCOPED_TRACE("plain");
        poison(dd);
        bool handled = detail::gemm_small_m_rms(da.t, dnw.t, kEps, db.t, dd.t, GemmOptions{},
                                                stream(), cfg);
        sync();
        if (!handled) {
          // Refused only where a ring config (forced, or the plain problem's choice) would run
          // and its A warps cannot stage M tokens (more than 2048 / stage_k): D untouched.
          EXPECT_TRUE((cfg < 0 || detail::gemm_small_m_is_ring_config(cfg)) && c.m > 1);
          for (uint8_t byte : download_buffer(dd)) ASSERT_EQ(byte, 0xFF) << "refused but written";
          continue;
        }
        EXPECT_TRUE(all_close(download_values(dd), ref_plain, small_m_tolerance(c.dt)));
        if (c.d_pad != 0) EXPECT_TRUE(outside_untouched(dd));
        const std::vector<uint8_t> first = download_bytes(dd);
        poison(dd);
        handled = detail::gemm_small_m_rms(da.t, dnw.t, kEps, db.t, dd.t, GemmOptions{}, stream(),
                                           cfg);
        sync();
        EXPECT_TRUE(handled) << "refused on the repeat";
        EXPECT_TRUE(bit_exact(download_bytes(dd), first, dtype_size(c.dt))) << "repeat differs";
      }
      // (b) the residual in place: D = alpha · r · A·Bᵀ + C with C uploaded into D.
      {
        SCOPED_TRACE("residual in place");
        poison(dd);
        upload_values(dd, cv);  // padding (if any) stays poisoned
        GemmOptions opt;
        opt.alpha = kAlpha;
        opt.beta = 1.f;
        opt.c = &dd.t;
        const bool handled =
            detail::gemm_small_m_rms(da.t, dnw.t, kEps, db.t, dd.t, opt, stream(), cfg);
        sync();
        EXPECT_TRUE(handled) << "refused here, accepted plain";
        if (!handled) continue;
        EXPECT_TRUE(all_close(download_values(dd), ref_res, small_m_tolerance(c.dt)));
        if (c.d_pad != 0) EXPECT_TRUE(outside_untouched(dd));
      }
    }
  }
  // Refused, nothing launched: D (holding random values, also the in-place C) byte for byte
  // as before for M = 33, a bias, N or K not a multiple of 8; a poisoned D for M = 0.
  DeviceTensor w = alloc(DType::bf16, {64, 64});
  std::vector<double> wv = rng().uniform(64 * 64, -1, 1);
  upload_values(w, wv);
  DeviceTensor nw = alloc(DType::bf16, {64});
  std::vector<double> nwv64 = rng().uniform(64, -2, 2);
  upload_values(nw, nwv64);
  auto refused_untouched = [&](const DeviceTensor& a, const DeviceTensor& b, DeviceTensor& d,
                               GemmOptions opt, const char* what, const Tensor* norm = nullptr) {
    SCOPED_TRACE(what);
    std::vector<double> av = rng().uniform(static_cast<size_t>(numel(a.shape())), -3, 3);
    std::vector<double> dv = rng().uniform(static_cast<size_t>(numel(d.shape())), -1, 1);
    upload_values(a, av);
    upload_values(d, dv);
    opt.c = &d.t;
    opt.beta = 1.f;
    const std::vector<uint8_t> before = download_buffer(d);
    const Tensor& n = norm ? *norm : nw.t;
    EXPECT_FALSE(detail::gemm_small_m_rms(a.t, n, kEps, b.t, d.t, opt, stream()));
    EXPECT_FALSE(detail::gemm_small_m_rms(a.t, n, kEps, b.t, d.t, opt, stream(), 0));
    sync();
    EXPECT_TRUE(bit_exact(download_buffer(d), before, 1)) << "output written";
  };
  {
    DeviceTensor a33 = alloc(DType::bf16, {33, 64});
    DeviceTensor d33 = alloc(DType::bf16, {33, 64});
    refused_untouched(a33, w, d33, GemmOptions{}, "M = 33");
    DeviceTensor a4 = alloc(DType::bf16, {4, 64});
    DeviceTensor d4 = alloc(DType::bf16, {4, 64});
    DeviceTensor bias = alloc(DType::bf16, {64});
    std::vector<double> bv = rng().uniform(64, -1, 1);
    upload_values(bias, bv);
    GemmOptions with_bias;
    with_bias.bias = &bias.t;
    refused_untouched(a4, w, d4, with_bias, "bias");
    DeviceTensor w60 = alloc(DType::bf16, {60, 64});
    DeviceTensor d60 = alloc(DType::bf16, {4, 60});
    std::vector<double> w60v = rng().uniform(60 * 64, -1, 1);
    upload_values(w60, w60v);
    refused_untouched(a4, w60, d60, GemmOptions{}, "N = 60");
    DeviceTensor a_k60 = alloc(DType::bf16, {4, 60});
    DeviceTensor w_k60 = alloc(DType::bf16, {64, 60});
    std::vector<double> wk60v = rng().uniform(64 * 60, -1, 1);
    upload_values(w_k60, wk60v);
    DeviceTensor nw60 = alloc(DType::bf16, {60});
    refused_untouched(a_k60, w_k60, d4, GemmOptions{}, "K = 60", &nw60.t);
    // The norm weight: wrong size, wrong dtype, not 16-byte aligned.
    DeviceTensor nw32 = alloc(DType::bf16, {32});
    refused_untouched(a4, w, d4, GemmOptions{}, "norm weight of 32", &nw32.t);
    DeviceTensor nw_f16 = alloc(DType::f16, {64});
    refused_untouched(a4, w, d4, GemmOptions{}, "norm weight f16", &nw_f16.t);
    DeviceTensor nw_big = alloc(DType::bf16, {72});
    Tensor nw_off = Tensor::contiguous(static_cast<char*>(nw_big.t.data) + 2, DType::bf16, {64});
    refused_untouched(a4, w, d4, GemmOptions{}, "norm weight misaligned", &nw_off);
  }
  DeviceTensor a0 = alloc(DType::bf16, {0, 64});
  DeviceTensor d0 = alloc(DType::bf16, {0, 64});
  EXPECT_FALSE(detail::gemm_small_m_rms(a0.t, nw.t, kEps, w.t, d0.t, GemmOptions{}, stream()));
  sync();
  for (uint8_t byte : download_buffer(d0)) ASSERT_EQ(byte, 0xFF) << "output written (M = 0)";
}

}  // namespace
}  // namespace tessel::test
