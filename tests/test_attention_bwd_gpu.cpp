// GPU tests of tessel::attention_backward (include/tessel/attention_backward.hpp) against the
// float64 reference (src/ref/attention_bwd_ref.hpp): bf16/f16; head dims 64/128/256; lengths
// 1, 17, 100, 257, 1000, 4097 (not multiples of the 64-row / 64-key blocks) with Sq != Skv;
// causal (incl. rows that see no key); GQA ratios 1, 4, 8 and MQA; sliding windows, softcap,
// sinks (with d_sinks), variable-length batches (with empty sequences), pitched views (the
// 16-byte copy path and the scalar one). The forward (GPU) produces out and lse, which the
// reference receives as the backward does (so delta and P are defined the same way).
// Every case runs in both modes (dq atomics, and deterministic), outputs poisoned before each;
// the atomic mode on the default path (the WGMMA kernel where it applies) and on the mma.sync
// kernels (TESSEL_ATTENTION_BWD_PATH=mma); the deterministic mode runs twice and must match
// bit for bit. Long cases compare a sample of dq rows and dk/dv rows (first/last, around
// every block edge, random) with the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ops/attention/attention_bwd.cuh"
#include "ref/attention_bwd_ref.hpp"
#include "tessel/attention.hpp"
#include "tessel/attention_backward.hpp"
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
  bool capture = false;             // the default path inside a CUDA graph (replayed)
  // Only the default path (launch-mode tests), run twice: the second call's stream-ordered
  // workspace is the first's, full of its dq sums, which must be zeroed again.
  bool default_only = false;
  int pitch_extra = 0;  // > 0: heads `d + pitch_extra` elements apart
  float scale = 0.f;

  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dtype) << " B" << b << " Sq" << sq << " Skv" << skv << " Hq" << hq << " Hkv"
       << hkv << " D" << d << (causal ? " causal" : "") << " wl" << window_left << " wr"
       << window_right << " cap" << softcap << (sinks ? " sinks" : "")
       << (lens_q.empty() ? "" : " varlen") << (capture ? " graph" : "") << " pitch+"
       << pitch_extra;
    return os.str();
  }
};

DeviceTensor alloc_heads(DType dtype, const std::vector<int64_t>& shape, int extra) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= i + 1 == shape.size() ? shape[i] + extra : shape[i];
  }
  return test::alloc_view(dtype, shape, strides);
}

// Rows to compare: all, or (long problems) the first/last rows, the rows around every
// 64-block edge and a few random ones of every sequence.
std::vector<int64_t> sample_rows(const std::vector<int64_t>& cu, bool all, test::Rng& rng) {
  std::vector<int64_t> rows;
  if (all) {
    for (int64_t r = 0; r < cu.back(); ++r) rows.push_back(r);
    return rows;
  }
  std::set<int64_t> pick;
  for (size_t bi = 0; bi + 1 < cu.size(); ++bi) {
    const int64_t n = cu[bi + 1] - cu[bi];
    for (int64_t i : {int64_t{0}, int64_t{1}, n - 2, n - 1})
      if (i >= 0 && i < n) pick.insert(cu[bi] + i);
    for (int64_t e = 64; e < n; e += 64)
      for (int64_t i : {e - 1, e})
        if (i < n && (e % 512 == 0 || e < 256)) pick.insert(cu[bi] + i);
    for (int r = 0; r < 6 && n > 0; ++r) pick.insert(cu[bi] + rng.integer(0, n - 1));
  }
  return {pick.begin(), pick.end()};
}

class AttentionBwdGpu : public test::GpuTest {
 protected:
  void run(const Case& c) {
    SCOPED_TRACE(c.name());
    const bool varlen = !c.lens_q.empty();
    std::vector<int64_t> cu_q = {0}, cu_k = {0};
    for (int i = 0; i < (varlen ? static_cast<int>(c.lens_q.size()) : c.b); ++i) {
      cu_q.push_back(cu_q.back() + (varlen ? c.lens_q[i] : c.sq));
      cu_k.push_back(cu_k.back() + (varlen ? c.lens_k[i] : c.skv));
    }
    const int64_t batches = static_cast<int64_t>(cu_q.size()) - 1;
    const int64_t tq = cu_q.back(), tk = cu_k.back();
    std::vector<int64_t> qs, ks, ls;
    if (varlen)
      qs = {tq, c.hq, c.d}, ks = {tk, c.hkv, c.d}, ls = {c.hq, tq};
    else
      qs = {c.b, c.sq, c.hq, c.d}, ks = {c.b, c.skv, c.hkv, c.d}, ls = {c.b, c.hq, c.sq};
    DeviceTensor q = alloc_heads(c.dtype, qs, c.pitch_extra);
    DeviceTensor k = alloc_heads(c.dtype, ks, c.pitch_extra);
    DeviceTensor v = alloc_heads(c.dtype, ks, c.pitch_extra);
    DeviceTensor out = alloc_heads(c.dtype, qs, c.pitch_extra);
    DeviceTensor dout = alloc_heads(c.dtype, qs, c.pitch_extra);
    DeviceTensor dq = alloc_heads(c.dtype, qs, c.pitch_extra);
    DeviceTensor dk = alloc_heads(c.dtype, ks, c.pitch_extra);
    DeviceTensor dv = alloc_heads(c.dtype, ks, c.pitch_extra);
    DeviceTensor lse = test::alloc(DType::f32, ls);
    std::vector<double> hq_vals = rng().uniform(static_cast<size_t>(tq * c.hq * c.d), -2.0, 2.0);
    std::vector<double> hk_vals = rng().uniform(static_cast<size_t>(tk * c.hkv * c.d), -1.0, 1.0);
    std::vector<double> hv_vals = rng().uniform(static_cast<size_t>(tk * c.hkv * c.d), -1.0, 1.0);
    std::vector<double> hdo_vals = rng().uniform(static_cast<size_t>(tq * c.hq * c.d), -1.0, 1.0);
    test::upload_values(q, hq_vals);
    test::upload_values(k, hk_vals);
    test::upload_values(v, hv_vals);
    test::upload_values(dout, hdo_vals);
    std::vector<double> sink_vals;
    DeviceTensor sinks, d_sinks;
    if (c.sinks) {
      sink_vals = rng().uniform(static_cast<size_t>(c.hq), -1.0, 4.0);
      sinks = test::to_device(DType::f32, {c.hq}, sink_vals);
      d_sinks = test::alloc(DType::f32, {c.hq});
    }
    DeviceTensor dcu_q, dcu_k;
    if (varlen) {
      dcu_q = test::alloc(DType::i32, {batches + 1});
      dcu_k = test::alloc(DType::i32, {batches + 1});
      std::vector<int32_t> ia(cu_q.begin(), cu_q.end()), ib(cu_k.begin(), cu_k.end());
      TESSEL_TEST_CUDA(cudaMemcpy(dcu_q.t.data, ia.data(), ia.size() * 4, cudaMemcpyHostToDevice));
      TESSEL_TEST_CUDA(cudaMemcpy(dcu_k.t.data, ib.data(), ib.size() * 4, cudaMemcpyHostToDevice));
    }

    AttentionBackwardParams p;
    p.scale = c.scale;
    p.causal = c.causal;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.softcap = c.softcap;
    p.sinks = c.sinks ? &sinks.t : nullptr;
    p.cu_seqlens_q = varlen ? &dcu_q.t : nullptr;
    p.cu_seqlens_k = varlen ? &dcu_k.t : nullptr;
    attention_forward(q.t, k.t, v.t, out.t, &lse.t, p, stream());
    sync();
    const std::vector<double> out_vals = test::download_values(out);  // (Tq, Hq, D) order
    const std::vector<double> lse_raw = test::download_values(lse);
    std::vector<double> lse_vals(static_cast<size_t>(tq * c.hq));  // (Tq, Hq) order
    for (int64_t bi = 0; bi < batches; ++bi)
      for (int64_t r = cu_q[bi]; r < cu_q[bi + 1]; ++r)
        for (int64_t h = 0; h < c.hq; ++h)
          lse_vals[static_cast<size_t>(r * c.hq + h)] = lse_raw[static_cast<size_t>(
              varlen ? h * tq + r : (bi * c.hq + h) * c.sq + (r - cu_q[bi]))];

    const double work = static_cast<double>(tq) * static_cast<double>(tk) / batches * c.hq * c.d;
    const bool all = work <= 2e8;
    const std::vector<int64_t> q_rows = sample_rows(cu_q, all, rng());
    const std::vector<int64_t> k_rows = sample_rows(cu_k, all, rng());
    ref::AttentionOptions opt;
    opt.scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
    opt.causal = c.causal;
    opt.window_left = c.window_left;
    opt.window_right = c.window_right;
    opt.softcap = c.softcap;
    opt.sinks = sink_vals;
    const ref::AttentionBwdResult want = ref::attention_backward(
        hq_vals, hk_vals, hv_vals, hdo_vals, cu_q, cu_k, c.hq, c.hkv, c.d, opt, out_vals, lse_vals,
        all ? std::vector<int64_t>{} : q_rows, all ? std::vector<int64_t>{} : k_rows);

    auto take = [&](const std::vector<double>& got, const std::vector<double>& ref,
                    const std::vector<int64_t>& rows, int64_t heads) {
      std::vector<double> g, r;
      for (int64_t row : rows)
        for (int64_t e = 0; e < heads * c.d; ++e) {
          g.push_back(got[static_cast<size_t>(row * heads * c.d + e)]);
          r.push_back(ref[static_cast<size_t>(row * heads * c.d + e)]);
        }
      return std::pair{g, r};
    };
    std::vector<uint8_t> first_q, first_k, first_v;
    // Atomic dq on the default path (WGMMA where supported), atomic dq forced onto the
    // mma.sync kernels, deterministic, deterministic again.
    for (int mode = 0; mode < (c.default_only ? 1 : 4); ++mode) {
      SCOPED_TRACE(mode == 0   ? "atomic dq, default path"
                   : mode == 1 ? "atomic dq, mma.sync path"
                               : "deterministic");
      p.deterministic = mode > 1;
      if (mode == 1)
        setenv("TESSEL_ATTENTION_BWD_PATH", "mma", 1);
      else
        unsetenv("TESSEL_ATTENTION_BWD_PATH");
      p.d_sinks = c.sinks ? &d_sinks.t : nullptr;
      test::poison(dq);
      test::poison(dk);
      test::poison(dv);
      if (c.sinks) test::poison(d_sinks);
      if (mode == 0 && c.capture) {  // captured into a CUDA graph, replayed twice
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        TESSEL_TEST_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
        try {
          attention_backward(q.t, k.t, v.t, out.t, dout.t, lse.t, dq.t, dk.t, dv.t, p, stream());
        } catch (const std::exception& e) {
          ADD_FAILURE() << "threw under capture: " << e.what();
        }
        TESSEL_TEST_CUDA(cudaStreamEndCapture(stream(), &graph));
        TESSEL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
          test::poison(dq);
          test::poison(dk);
          test::poison(dv);
          TESSEL_TEST_CUDA(cudaGraphLaunch(exec, stream()));
          sync();
        }
        TESSEL_TEST_CUDA(cudaGraphExecDestroy(exec));
        TESSEL_TEST_CUDA(cudaGraphDestroy(graph));
      } else {
        for (int rep = 0; rep < (c.default_only ? 2 : 1); ++rep) {
          test::poison(dq);
          test::poison(dk);
          test::poison(dv);
          attention_backward(q.t, k.t, v.t, out.t, dout.t, lse.t, dq.t, dk.t, dv.t, p, stream());
        }
      }
      sync();
      unsetenv("TESSEL_ATTENTION_BWD_PATH");
      if (mode == 3) {
        EXPECT_TRUE(test::download_bytes(dq) == first_q) << "dq differs between two runs";
        EXPECT_TRUE(test::download_bytes(dk) == first_k) << "dk differs between two runs";
        EXPECT_TRUE(test::download_bytes(dv) == first_v) << "dv differs between two runs";
        continue;
      }
      if (mode == 2) {
        first_q = test::download_bytes(dq);
        first_k = test::download_bytes(dk);
        first_v = test::download_bytes(dv);
      }
      {
        auto [g, r] = take(test::download_values(dq), want.dq, q_rows, c.hq);
        EXPECT_TRUE(test::all_close(g, r, c.dtype)) << "dq";
      }
      {
        auto [g, r] = take(test::download_values(dk), want.dk, k_rows, c.hkv);
        EXPECT_TRUE(test::all_close(g, r, c.dtype)) << "dk";
      }
      {
        auto [g, r] = take(test::download_values(dv), want.dv, k_rows, c.hkv);
        EXPECT_TRUE(test::all_close(g, r, c.dtype)) << "dv";
      }
      if (c.sinks && all) {
        // f32 sums of exp(sink - lse) * delta over every row.
        EXPECT_TRUE(test::all_close(test::download_values(d_sinks), want.d_sinks,
                                    test::Tolerance{1e-4, 2e-4}))
            << "d_sinks";
      }
      if (c.pitch_extra > 0) {
        EXPECT_TRUE(test::outside_untouched(dq));
        EXPECT_TRUE(test::outside_untouched(dk));
        EXPECT_TRUE(test::outside_untouched(dv));
      }
    }
  }
};

Case make(DType dt, int b, int sq, int skv, int hq, int hkv, int d, bool causal) {
  Case c;
  c.dtype = dt, c.b = b, c.sq = sq, c.skv = skv, c.hq = hq, c.hkv = hkv, c.d = d, c.causal = causal;
  return c;
}

TEST_F(AttentionBwdGpu, SmallShapesAllHeadDims) {
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (auto [sq, skv] : {std::pair{1, 1}, {17, 17}, {1, 100}, {100, 17}, {100, 257}})
          run(make(dt, 2, sq, skv, 4, 2, d, causal));
}

TEST_F(AttentionBwdGpu, GqaRatios) {
  for (auto [hq, hkv] : {std::pair{4, 4}, {8, 2}, {8, 1}})
    for (bool causal : {false, true}) run(make(DType::bf16, 1, 257, 100, hq, hkv, 128, causal));
  run(make(DType::f16, 1, 100, 257, 8, 1, 64, true));
}

TEST_F(AttentionBwdGpu, SlidingWindowAndSoftcap) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 257, 257, 4, 2, d, true);
    c.window_left = 70;
    run(c);
    c = make(DType::bf16, 1, 200, 150, 2, 1, d, false);
    c.window_left = 37, c.window_right = 50;
    run(c);
    c.window_left = 0, c.window_right = 0;  // the diagonal only
    run(c);
    c = make(DType::bf16, 2, 150, 211, 4, 4, d, false);
    c.softcap = 1.5f;
    run(c);
    c.causal = true;
    c.scale = 0.3f;
    c.dtype = DType::f16;
    run(c);
  }
}

TEST_F(AttentionBwdGpu, Sinks) {
  for (int d : {64, 128, 256}) {
    Case c = make(DType::bf16, 2, 70, 140, 4, 2, d, true);
    c.sinks = true;
    run(c);
    c = make(DType::f16, 1, 150, 60, 2, 1, d, true);  // causal Sq > Skv: rows with only the sink
    c.sinks = true;
    run(c);
  }
}

TEST_F(AttentionBwdGpu, Varlen) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Case c = make(DType::bf16, 0, 0, 0, 4, 2, d, causal);
      c.lens_q = {1, 17, 100, 0, 129, 64};
      c.lens_k = {5, 17, 257, 7, 129, 3};
      run(c);
    }
  Case c = make(DType::f16, 0, 0, 0, 8, 1, 128, true);
  c.lens_q = {300, 3, 257};
  c.lens_k = {300, 0, 200};  // an empty key set: dq 0
  c.window_left = 64;
  c.softcap = 2.f;
  c.sinks = true;
  run(c);
}

TEST_F(AttentionBwdGpu, Pitched) {
  for (int d : {64, 128}) {
    Case c = make(DType::bf16, 2, 100, 77, 4, 2, d, true);
    c.pitch_extra = 8;  // 16-byte aligned strides: async copies
    run(c);
    c.pitch_extra = 3;  // odd strides: scalar copies
    run(c);
  }
}

TEST_F(AttentionBwdGpu, EmptySides) {
  run(make(DType::bf16, 2, 33, 0, 2, 1, 64, false));  // no keys: dq = 0
  run(make(DType::bf16, 2, 0, 33, 2, 1, 64, false));  // no queries: dk = dv = 0
}

// The WGMMA kernel's block edges: 128 keys per CTA, 64 (D = 128) or 128 (D = 64) query rows
// per step; GQA groups walked by one CTA; causal with Sq != Skv both ways.
TEST_F(AttentionBwdGpu, WgmmaTileEdges) {
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (auto [sq, skv] :
             {std::pair{127, 128}, {128, 129}, {129, 127}, {1, 129}, {129, 1}, {64, 65}})
          run(make(dt, 2, sq, skv, 4, 1, d, causal));
  for (auto [hq, hkv] : {std::pair{2, 2}, {8, 2}, {8, 1}})
    for (bool causal : {false, true}) {
      run(make(DType::bf16, 1, 1000, 300, hq, hkv, 128, causal));
      run(make(DType::f16, 1, 300, 1000, hq, hkv, 64, causal));
    }
  run(make(DType::bf16, 1, 4097, 1000, 4, 1, 128, true));
  run(make(DType::bf16, 2, 1000, 4097, 2, 1, 64, true));
  // Head dim 256 (64-key blocks, the head dim split between the warpgroups): GQA groups walk
  // several q heads per key block; the dQ tiles of consecutive steps share the two stages.
  for (auto [hq, hkv] : {std::pair{2, 2}, {8, 2}, {8, 1}})
    for (bool causal : {false, true}) run(make(DType::bf16, 1, 300, 1000, hq, hkv, 256, causal));
  run(make(DType::f16, 2, 1000, 300, 4, 1, 256, true));
  run(make(DType::bf16, 1, 4097, 65, 2, 1, 256, false));
}

// Causal key blocks in launch sections (BwdArgs::order_pairs): 8 (kv head, sequence) pairs in
// sections of 3 (the last one short), of 1, and in the grid's own order.
TEST_F(AttentionBwdGpu, CausalKeyBlockSections) {
  for (int pairs : {3, 1, 0}) {
    SCOPED_TRACE("sections of " + std::to_string(pairs));
    attention_detail::set_bwd_order_pairs(pairs);
    for (int d : {64, 128, 256}) run(make(DType::bf16, 2, 300, 700, 8, 4, d, true));
    run(make(DType::f16, 2, 513, 513, 4, 4, 128, true));
  }
  attention_detail::set_bwd_order_pairs(-1);
}

// The blocked dq convert starts before the D = 64 / 128 WGMMA kernel ends (a programmatic
// dependent launch) and converts a tile once its (sequence, kv head) has every key block done;
// TESSEL_ATTENTION_BWD_OVERLAP=0 launches it after the kernel. Both on the same shapes: padded
// and varlen (an empty key set: no key blocks to wait for), GQA, ragged tiles.
// The launch modes of the D = 64 / 128 WGMMA kernel's blocked dq workspace: the convert as a
// programmatic dependent that waits per (sequence, kv head) on BwdArgs::kv_done, or an ordinary
// launch; the workspace zeroed by a memset, or by each tile's first dQ (BwdArgs::dq_tickets;
// default under causal masks), for every mask. The other paths do not depend on them: only the
// default one runs.
TEST_F(AttentionBwdGpu, DqConvertOverlap) {
  for (const auto& [overlap, tickets] : {std::pair{"1", "1"}, {"1", "0"}, {"0", "1"}, {"0", "0"}}) {
    SCOPED_TRACE(std::string("TESSEL_ATTENTION_BWD_OVERLAP=") + overlap +
                 " TESSEL_ATTENTION_BWD_TICKETS=" + tickets);
    const test::ScopedEnv env_overlap("TESSEL_ATTENTION_BWD_OVERLAP", overlap);
    const test::ScopedEnv env_tickets("TESSEL_ATTENTION_BWD_TICKETS", tickets);
    for (int d : {64, 128}) {
      std::vector<Case> cases = {make(DType::bf16, 2, 700, 300, 8, 2, d, true),  // rows see no key
                                 make(DType::f16, 3, 129, 1000, 4, 4, d, false),
                                 make(DType::bf16, 1, 1, 17, 1, 1, d, false)};
      Case c = make(DType::bf16, 0, 0, 0, 4, 2, d, true);
      c.lens_q = {300, 65, 0, 129};  // an empty query set, an empty key set
      c.lens_k = {300, 0, 70, 200};
      cases.push_back(c);
      for (Case& e : cases) {
        e.default_only = true;
        run(e);
      }
    }
  }
  // In a CUDA graph the dependent launch becomes a programmatic edge; the stream-ordered
  // workspace a graph allocation.
  for (int d : {64, 128}) {
    Case c = make(DType::bf16, 2, 300, 700, 8, 2, d, true);
    c.capture = true;
    run(c);
    c = make(DType::bf16, 0, 0, 0, 4, 2, d, false);
    c.lens_q = {300, 65, 129};
    c.lens_k = {300, 0, 200};
    c.capture = true;
    run(c);
  }
}

TEST_F(AttentionBwdGpu, Long) {
  for (int d : {64, 128})
    for (bool causal : {false, true}) run(make(DType::bf16, 1, 1000, 1000, 4, 1, d, causal));
  run(make(DType::bf16, 1, 4097, 4097, 4, 2, 128, true));
  run(make(DType::f16, 1, 4097, 4097, 2, 2, 64, false));
  run(make(DType::bf16, 1, 1000, 1000, 2, 2, 256, true));
}

}  // namespace
}  // namespace tessel
