// GPU tests of tessel::attention_forward (include/tessel/attention.hpp) against the float64
// reference (src/ref/attention_ref.hpp): bf16/f16; head dims 64/128/256; lengths 1, 17,
// 200, 1000, 4097 (not multiples of the 128-row / 64- or 128-key tiles); causal with
// Sq < Skv and Sq > Skv (rows that see no key); GQA ratios 1, 4, 8 and MQA; sliding
// windows, softcap, sinks, variable-length batches (with empty sequences), pitched q/k/v/out
// (as slices of packed qkv), lse omitted. Every case runs on both paths: the WGMMA kernel
// (default) and the SIMT path (TESSEL_ATTENTION_PATH=simt), outputs poisoned before each.
// Long cases compare a sample of query rows (first/last rows, rows around every tile edge,
// random rows) against the float64 reference; computing every row in float64 would take
// minutes, and a sampled row is checked exactly as strictly as a full comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ref/attention_ref.hpp"
#include "tessel/attention.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

struct Case {
  DType dtype = DType::bf16;
  int b = 1, sq = 1, skv = 1, hq = 1, hkv = 1, d = 128;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool sinks = false;
  std::vector<int> lens_q, lens_k;  // non-empty: varlen (b = lens_q.size())
  int pitch_extra = 0;              // > 0: q/k/v/out heads `d + pitch_extra` elements apart
  bool with_lse = true;
  float scale = 0.f;

  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dtype) << " B" << b << " Sq" << sq << " Skv" << skv << " Hq" << hq << " Hkv"
       << hkv << " D" << d << (causal ? " causal" : "") << " wl" << window_left << " wr"
       << window_right << " cap" << softcap << (sinks ? " sinks" : "")
       << (lens_q.empty() ? "" : " varlen") << " pitch+" << pitch_extra
       << (with_lse ? "" : " no-lse");
    return os.str();
  }
};

// Strided (T, H, D) or (B, S, H, D) view whose heads are `d + extra` elements apart.
DeviceTensor alloc_heads(DType dtype, const std::vector<int64_t>& shape, int extra) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= i + 1 == shape.size() ? shape[i] + extra : shape[i];
  }
  return test::alloc_view(dtype, shape, strides);
}

class AttentionGpu : public test::GpuTest {
 protected:
  void run(const Case& c) {
    SCOPED_TRACE(c.name());
    const bool varlen = !c.lens_q.empty();
    std::vector<int64_t> cu_q = {0}, cu_k = {0};
    if (varlen) {
      for (size_t i = 0; i < c.lens_q.size(); ++i) {
        cu_q.push_back(cu_q.back() + c.lens_q[i]);
        cu_k.push_back(cu_k.back() + c.lens_k[i]);
      }
    } else {
      for (int i = 0; i < c.b; ++i) {
        cu_q.push_back(cu_q.back() + c.sq);
        cu_k.push_back(cu_k.back() + c.skv);
      }
    }
    const int64_t batches = static_cast<int64_t>(cu_q.size()) - 1;
    const int64_t tq = cu_q.back(), tk = cu_k.back();
    std::vector<int64_t> qs, ks, ls;
    if (varlen) {
      qs = {tq, c.hq, c.d}, ks = {tk, c.hkv, c.d}, ls = {c.hq, tq};
    } else {
      qs = {c.b, c.sq, c.hq, c.d}, ks = {c.b, c.skv, c.hkv, c.d}, ls = {c.b, c.hq, c.sq};
    }
    DeviceTensor q = alloc_heads(c.dtype, qs, c.pitch_extra);
    DeviceTensor k = alloc_heads(c.dtype, ks, c.pitch_extra);
    DeviceTensor v = alloc_heads(c.dtype, ks, c.pitch_extra);
    DeviceTensor out = alloc_heads(c.dtype, qs, c.pitch_extra);
    DeviceTensor lse = test::alloc(DType::f32, ls);
    // q spread wider than k so that the softmax is peaked enough to matter.
    std::vector<double> hq_vals = rng().uniform(static_cast<size_t>(tq * c.hq * c.d), -2.0, 2.0);
    std::vector<double> hk_vals = rng().uniform(static_cast<size_t>(tk * c.hkv * c.d), -1.0, 1.0);
    std::vector<double> hv_vals = rng().uniform(static_cast<size_t>(tk * c.hkv * c.d), -1.0, 1.0);
    test::upload_values(q, hq_vals);
    test::upload_values(k, hk_vals);
    test::upload_values(v, hv_vals);
    std::vector<double> sink_vals;
    DeviceTensor sinks;
    if (c.sinks) {
      sink_vals = rng().uniform(static_cast<size_t>(c.hq), -1.0, 4.0);
      sinks = test::to_device(DType::f32, {c.hq}, sink_vals);
    }
    DeviceTensor dcu_q, dcu_k;
    if (varlen) {
      dcu_q = test::alloc(DType::i32, {batches + 1});
      dcu_k = test::alloc(DType::i32, {batches + 1});
      std::vector<int32_t> ia(cu_q.begin(), cu_q.end()), ib(cu_k.begin(), cu_k.end());
      TESSEL_TEST_CUDA(cudaMemcpy(dcu_q.t.data, ia.data(), ia.size() * 4, cudaMemcpyHostToDevice));
      TESSEL_TEST_CUDA(cudaMemcpy(dcu_k.t.data, ib.data(), ib.size() * 4, cudaMemcpyHostToDevice));
    }

    AttentionParams p;
    p.scale = c.scale;
    p.causal = c.causal;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.softcap = c.softcap;
    p.sinks = c.sinks ? &sinks.t : nullptr;
    p.cu_seqlens_q = varlen ? &dcu_q.t : nullptr;
    p.cu_seqlens_k = varlen ? &dcu_k.t : nullptr;

    // Reference on all rows, or a sample of them for long problems.
    std::vector<int64_t> rows;
    const double work = static_cast<double>(tq) * static_cast<double>(tk) / batches * c.hq * c.d;
    if (work > 3e8) {
      std::set<int64_t> pick;
      for (int64_t bi = 0; bi < batches; ++bi) {
        const int64_t n = cu_q[bi + 1] - cu_q[bi];
        for (int64_t i : {int64_t{0}, int64_t{1}, n - 2, n - 1})
          if (i >= 0 && i < n) pick.insert(cu_q[bi] + i);
        for (int64_t e = 64; e < n; e += 64)
          for (int64_t i : {e - 1, e})
            if (i < n && (e % 128 == 0 || e < 256)) pick.insert(cu_q[bi] + i);
        for (int r = 0; r < 6 && n > 0; ++r) pick.insert(cu_q[bi] + rng().integer(0, n - 1));
      }
      rows.assign(pick.begin(), pick.end());
    }
    ref::AttentionOptions opt;
    opt.scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
    opt.causal = c.causal;
    opt.window_left = c.window_left;
    opt.window_right = c.window_right;
    opt.softcap = c.softcap;
    opt.sinks = sink_vals;
    const ref::AttentionResult want =
        ref::attention_forward(hq_vals, hk_vals, hv_vals, cu_q, cu_k, c.hq, c.hkv, c.d, opt, rows);

    for (const char* path : {"wgmma", "simt"}) {
      SCOPED_TRACE(std::string("path ") + path);
      if (std::string(path) == "simt")
        setenv("TESSEL_ATTENTION_PATH", "simt", 1);
      else
        unsetenv("TESSEL_ATTENTION_PATH");
      test::poison(out);
      test::poison(lse);
      attention_forward(q.t, k.t, v.t, out.t, c.with_lse ? &lse.t : nullptr, p, stream());
      unsetenv("TESSEL_ATTENTION_PATH");
      sync();
      const std::vector<double> got = test::download_values(out);
      const std::vector<double> got_lse = test::download_values(lse);
      // got is (Tq, Hq, D) in logical order (padded: (B, Sq, Hq, D) flattens the same way);
      // lse is (B, Hq, Sq) or (Hq, Tq).
      std::vector<double> o_got, o_want, l_got, l_want;
      auto take_row = [&](int64_t r) {
        int64_t bi = 0;
        while (r >= cu_q[bi + 1]) ++bi;
        for (int64_t h = 0; h < c.hq; ++h) {
          for (int64_t e = 0; e < c.d; ++e) {
            const size_t at = static_cast<size_t>((r * c.hq + h) * c.d + e);
            o_got.push_back(got[at]);
            o_want.push_back(want.out[at]);
          }
          const int64_t li = varlen ? h * tq + r : (bi * c.hq + h) * c.sq + (r - cu_q[bi]);
          l_got.push_back(got_lse[static_cast<size_t>(li)]);
          l_want.push_back(want.lse[static_cast<size_t>(r * c.hq + h)]);
        }
      };
      if (rows.empty())
        for (int64_t r = 0; r < tq; ++r) take_row(r);
      else
        for (int64_t r : rows) take_row(r);
      EXPECT_TRUE(test::all_close(o_got, o_want, c.dtype));
      if (c.with_lse) {
        // lse: fp32 sums of exactly rounded inputs; tensor-core fp32 accumulation of the
        // logits is not IEEE-exact, so a little more than the f32 row.
        EXPECT_TRUE(test::all_close(l_got, l_want, test::Tolerance{2e-5, 5e-5}));
      } else {
        EXPECT_TRUE(std::all_of(got_lse.begin(), got_lse.end(), [](double x) {
          return std::isnan(x);
        })) << "lse written although omitted";
      }
      if (c.pitch_extra > 0) EXPECT_TRUE(test::outside_untouched(out));
    }
  }
};

Case make(DType dt, int b, int sq, int skv, int hq, int hkv, int d, bool causal) {
  Case c;
  c.dtype = dt, c.b = b, c.sq = sq, c.skv = skv, c.hq = hq, c.hkv = hkv, c.d = d, c.causal = causal;
  return c;
}

TEST_F(AttentionGpu, SmallShapesAllHeadDims) {
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (auto [sq, skv] :
             {std::pair{1, 1}, {17, 17}, {1, 17}, {17, 200}, {200, 17}, {200, 200}})
          run(make(dt, 2, sq, skv, 4, 2, d, causal));
}

TEST_F(AttentionGpu, GqaRatios) {
  for (auto [hq, hkv] : {std::pair{4, 4}, {8, 2}, {8, 1}, {16, 2}})
    for (bool causal : {false, true}) run(make(DType::bf16, 1, 129, 257, hq, hkv, 128, causal));
}

// Odd GQA ratio and prompt-like lengths (SmolLM2: 9 q heads over 3 kv heads, D 64).
TEST_F(AttentionGpu, GqaRatio3PromptLengths) {
  for (int s : {16, 37, 61, 100})
    for (int extra : {0, 8}) {
      Case c = make(DType::bf16, 1, s, s, 9, 3, 64, true);
      c.pitch_extra = extra;
      run(c);
    }
}

TEST_F(AttentionGpu, Long1000) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) run(make(DType::bf16, 2, 1000, 1000, 4, 1, d, causal));
  run(make(DType::f16, 1, 1000, 1500, 8, 8, 128, true));
  run(make(DType::f16, 1, 1500, 1000, 2, 1, 64, true));  // causal Sq > Skv: empty rows
}

// Causal problems of more query blocks than SMs take the persistent schedule (one CTA per SM,
// blocks from a ticket counter that the last CTA zeroes for the next launch): GQA, rows with no
// visible key (Sq > Skv), every head dim; several launches in a row on one stream.
TEST_F(AttentionGpu, PersistentScheduleCausal) {
  run(make(DType::bf16, 2, 1500, 1000, 40, 8, 128, true));  // 960 blocks, 3 per head empty
  run(make(DType::f16, 3, 700, 900, 48, 6, 64, true));      // BM 192: 576 blocks
  run(make(DType::bf16, 1, 1100, 1100, 20, 4, 256, true));  // 180 blocks
  run(make(DType::bf16, 2, 1500, 1000, 40, 8, 128, true));  // the counter was zeroed
}

TEST_F(AttentionGpu, Long4097) {
  for (int d : {64, 128})
    for (bool causal : {false, true}) run(make(DType::bf16, 1, 4097, 4097, 8, 1, d, causal));
  run(make(DType::bf16, 1, 4097, 4097, 2, 2, 256, true));
  run(make(DType::f16, 1, 17, 4097, 8, 2, 128, true));  // decode-like: few queries, long keys
}

TEST_F(AttentionGpu, SlidingWindow) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 300, 300, 4, 2, d, true);
    c.window_left = 100;
    run(c);
    c = make(DType::bf16, 1, 260, 390, 2, 1, d, false);
    c.window_left = 37, c.window_right = 50;
    run(c);
    c.window_left = -1, c.window_right = 3;  // right limit only
    run(c);
    c.window_left = 0, c.window_right = 0;  // the diagonal only
    run(c);
  }
}

// Right limits (causal or a right window, no left one) where a warpgroup's rows see no key of
// the block's rightmost key tile (D = 64: 192-row blocks over 128-key tiles; D = 256: 64-key
// tiles): that warpgroup skips the tile. Sq < Skv and Sq > Skv.
TEST_F(AttentionGpu, RightLimitFirstTileSkip) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 500, 700, 4, 2, d, false);
    c.window_right = 70;
    run(c);
    c = make(DType::f16, 1, 800, 450, 2, 1, d, false);
    c.window_right = 130;
    run(c);
    run(make(DType::bf16, 1, 577, 577, 3, 1, d, true));
  }
}

TEST_F(AttentionGpu, SoftcapAndScale) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 150, 211, 4, 4, d, false);
    c.softcap = 1.5f;
    run(c);
    c.causal = true;
    c.scale = 0.3f;
    run(c);
    c.softcap = 0.f;
    c.dtype = DType::f16;
    run(c);
  }
}

TEST_F(AttentionGpu, Sinks) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 70, 140, 4, 2, d, true);
    c.sinks = true;
    run(c);
    c = make(DType::f16, 1, 300, 100, 2, 1, d, true);  // causal Sq > Skv: rows with only the sink
    c.sinks = true;
    run(c);
  }
}

TEST_F(AttentionGpu, Varlen) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Case c = make(DType::bf16, 0, 0, 0, 4, 2, d, causal);
      c.lens_q = {1, 17, 300, 0, 129, 128};
      c.lens_k = {5, 17, 250, 7, 129, 300};
      run(c);
    }
  Case c = make(DType::f16, 0, 0, 0, 8, 1, 128, true);
  c.lens_q = {1000, 3, 257};
  c.lens_k = {1000, 0, 400};  // an empty key set: out 0, lse -inf
  c.window_left = 64;
  c.softcap = 2.f;
  c.sinks = true;
  run(c);
}

TEST_F(AttentionGpu, PitchedAndNoLse) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 133, 190, 4, 2, d, true);
    c.pitch_extra = 8;  // TMA-aligned: the WGMMA path on strided views
    run(c);
    c.pitch_extra = 3;  // odd strides: the SIMT path on both runs
    run(c);
    c.pitch_extra = 0;
    c.with_lse = false;
    run(c);
  }
}

TEST_F(AttentionGpu, EmptyKeys) {
  // Skv = 0: every row sees nothing.
  run(make(DType::bf16, 2, 33, 0, 2, 1, 64, false));
}

}  // namespace
}  // namespace tessel
