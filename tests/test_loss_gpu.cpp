// GPU tests of tessel::cross_entropy and tessel::fused_linear_cross_entropy against the
// float64 references (src/ref/loss_optim_ref.hpp): f32/f16/bf16 logits; V from 1 to 600000
// (group, cluster and streaming kernels); ragged row counts; ignore_index, label smoothing,
// none/mean/sum, i32/i64 targets, in-place dlogits; fused op over several (ragged) chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ref/loss_optim_ref.hpp"
#include "tessel/loss.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

// Random targets in [0, V); about a quarter set to ignore_index when `ignores`.
std::vector<int64_t> random_targets(test::Rng& rng, int64_t n, int64_t v, int64_t ignore,
                                    bool ignores) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = (ignores && rng.integer(0, 3) == 0) ? ignore : rng.integer(0, v - 1);
  if (ignores && n > 0) t[0] = rng.integer(0, v - 1);  // at least one counted row
  return t;
}

DeviceTensor targets_device(const std::vector<int64_t>& t, DType dt) {
  DeviceTensor d = test::alloc(dt, {static_cast<int64_t>(t.size())});
  std::vector<uint8_t> bytes(t.size() * dtype_size(dt));
  for (size_t i = 0; i < t.size(); ++i) {
    if (dt == DType::i64) std::memcpy(bytes.data() + 8 * i, &t[i], 8);
    else {
      const int32_t v = static_cast<int32_t>(t[i]);
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  test::upload_bytes(d, bytes);
  return d;
}

// Loss outputs are fp32 sums of O(V) terms: compare with the f32 row of the table unless the
// output itself is stored in a narrower dtype.
test::Tolerance loss_tol(DType out) { return test::tolerance(out); }

using CeParam = std::tuple<DType, int64_t>;
class CrossEntropyGpu : public test::GpuTest, public ::testing::WithParamInterface<CeParam> {};

TEST_P(CrossEntropyGpu, MatchesReference) {
  const auto [dt, v] = GetParam();
  const int64_t cap = std::max<int64_t>(1, 600000 / v);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{127}}) {
    n = std::min(n, cap);
    for (int red : {0, 1, 2}) {
      const bool smooth = red == 1;
      const bool i64 = red != 2;
      const double eps = smooth ? 0.1 : 0.0;
      SCOPED_TRACE("n " + std::to_string(n) + " reduction " + std::to_string(red));
      std::vector<double> xv = rng().uniform(static_cast<size_t>(n * v), -6.0, 6.0);
      DeviceTensor x = test::to_device(dt, {n, v}, xv);
      const auto t = random_targets(rng(), n, v, -100, true);
      DeviceTensor td = targets_device(t, i64 ? DType::i64 : DType::i32);
      const DType ldt = red == 2 ? dt : DType::f32;
      DeviceTensor loss = red == 0 ? test::alloc(ldt, {n}) : test::alloc(ldt, {});
      DeviceTensor dx = test::alloc(dt, {n, v});
      CrossEntropyOptions o;
      o.reduction = static_cast<Reduction>(red);
      o.label_smoothing = static_cast<float>(eps);
      cross_entropy(x.t, td.t, loss.t, &dx.t, stream(), o);
      sync();
      const auto r = ref::cross_entropy(xv, t, n, v, -100, eps, red);
      std::vector<double> lref =
          red == 0 ? r.row_loss : std::vector<double>{red == 1 ? r.sum / r.count : r.sum};
      const std::vector<double> lout = test::download_values(loss);
      // ignored rows: reference 0, and so must ours be (exactly)
      // Losses cancel (lse - x_t; exactly 0 for V = 1): errors are measured against the
      // size of the terms, at least 1 (|x| <= 6, lse <= 6 + log V).
      std::vector<double> lscale(lref.size());
      for (size_t i = 0; i < lref.size(); ++i) lscale[i] = std::max(1.0, std::fabs(lref[i]));
      EXPECT_TRUE(test::all_close(lout, lref, loss_tol(ldt == DType::f32 ? DType::f32 : dt), lscale));
      EXPECT_TRUE(test::all_close(test::download_values(dx), r.dlogits, dt));
    }
  }
}

TEST_P(CrossEntropyGpu, ForwardOnlyAndInPlace) {
  const auto [dt, v] = GetParam();
  const int64_t n = std::min<int64_t>(7, std::max<int64_t>(1, 600000 / v));
  std::vector<double> xv = rng().uniform(static_cast<size_t>(n * v), -3.0, 3.0);
  DeviceTensor x = test::to_device(dt, {n, v}, xv);
  const auto t = random_targets(rng(), n, v, 5, false);
  DeviceTensor td = targets_device(t, DType::i64);
  DeviceTensor loss = test::alloc(DType::f32, {1});
  CrossEntropyOptions o;
  o.ignore_index = 5;
  o.grad_scale = 0.5f;
  cross_entropy(x.t, td.t, loss.t, nullptr, stream(), o);  // forward only
  sync();
  const auto r = ref::cross_entropy(xv, t, n, v, 5, 0.0, 1, 0.5);
  EXPECT_TRUE(test::all_close(test::download_values(loss), {r.sum / r.count}, DType::f32));
  cross_entropy(x.t, td.t, loss.t, &x.t, stream(), o);  // dlogits over the logits
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(loss), {r.sum / r.count}, DType::f32));
  EXPECT_TRUE(test::all_close(test::download_values(x), r.dlogits, dt));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropyGpu,
    ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                       ::testing::Values(int64_t{1}, int64_t{7}, int64_t{127}, int64_t{1000},
                                         int64_t{4097}, int64_t{16384}, int64_t{20000},
                                         int64_t{128256}, int64_t{140000}, int64_t{16392},
                                         int64_t{262144}, int64_t{600000})),
    [](const ::testing::TestParamInfo<CeParam>& i) {
      return std::string(dtype_name(std::get<0>(i.param))) + "_V" +
             std::to_string(std::get<1>(i.param));
    });

class CrossEntropyMiscGpu : public test::GpuTest {};

TEST_F(CrossEntropyMiscGpu, PitchedLogitsAndOutOfRangeTarget) {
  const int64_t n = 5, v = 300, pitch = 320;
  std::vector<double> xv = rng().uniform(static_cast<size_t>(n * v), -2.0, 2.0);
  DeviceTensor x = test::alloc_pitched(DType::bf16, {n, v}, pitch);
  test::upload_values(x, xv);
  std::vector<int64_t> t = random_targets(rng(), n, v, -100, false);
  t[2] = v + 3;  // out of range: NaN loss for that row
  DeviceTensor td = targets_device(t, DType::i32);
  DeviceTensor loss = test::alloc(DType::f32, {n});
  CrossEntropyOptions o;
  o.reduction = Reduction::none;
  cross_entropy(x.t, td.t, loss.t, nullptr, stream(), o);
  sync();
  const auto r = ref::cross_entropy(xv, t, n, v, -100, 0.0, 0);
  std::vector<double> out = test::download_values(loss);
  EXPECT_TRUE(std::isnan(out[2]));
  out.erase(out.begin() + 2);
  std::vector<double> want = r.row_loss;
  want.erase(want.begin() + 2);
  EXPECT_TRUE(test::all_close(out, want, DType::f32));
}

TEST_F(CrossEntropyMiscGpu, AllIgnoredMeanIsNaNWithZeroGradient) {
  const int64_t n = 4, v = 64;
  std::vector<double> xv = rng().uniform(static_cast<size_t>(n * v), -2.0, 2.0);
  DeviceTensor x = test::to_device(DType::f32, {n, v}, xv);
  DeviceTensor td = targets_device(std::vector<int64_t>(n, -100), DType::i64);
  DeviceTensor loss = test::alloc(DType::f32, {});
  DeviceTensor dx = test::alloc(DType::f32, {n, v});
  cross_entropy(x.t, td.t, loss.t, &dx.t, stream());
  sync();
  EXPECT_TRUE(std::isnan(test::download_values(loss)[0]));
  for (double g : test::download_values(dx)) ASSERT_EQ(g, 0.0);
}

// Many rows over the shared-memory cluster kernel (V = 50000: clusters of 4 CTAs, more
// clusters than fit on the GPU at once), pitched rows, in two runs that must agree bitwise.
TEST_F(CrossEntropyMiscGpu, ClusterManyRowsPitchedDeterministic) {
  const int64_t n = 300, v = 50000, pitch = 50008;
  std::vector<double> xv = rng().uniform(static_cast<size_t>(n * v), -8.0, 8.0);
  DeviceTensor x = test::alloc_pitched(DType::bf16, {n, v}, pitch);
  test::upload_values(x, xv);
  const std::vector<int64_t> t = random_targets(rng(), n, v, -100, true);
  DeviceTensor td = targets_device(t, DType::i64);
  CrossEntropyOptions o;
  o.reduction = Reduction::none;
  o.label_smoothing = 0.05f;
  std::vector<double> loss_runs[2], dx_runs[2];
  for (int run = 0; run < 2; ++run) {
    DeviceTensor loss = test::alloc(DType::f32, {n});
    DeviceTensor dx = test::alloc_pitched(DType::bf16, {n, v}, pitch);
    cross_entropy(x.t, td.t, loss.t, &dx.t, stream(), o);
    sync();
    loss_runs[run] = test::download_values(loss);
    dx_runs[run] = test::download_values(dx);
  }
  const auto r = ref::cross_entropy(xv, t, n, v, -100, 0.05, 0);
  std::vector<double> lscale(r.row_loss.size());
  for (size_t i = 0; i < lscale.size(); ++i) lscale[i] = std::max(1.0, std::fabs(r.row_loss[i]));
  EXPECT_TRUE(test::all_close(loss_runs[0], r.row_loss, DType::f32, lscale));
  EXPECT_TRUE(test::all_close(dx_runs[0], r.dlogits, DType::bf16));
  for (size_t i = 0; i < loss_runs[0].size(); ++i) ASSERT_EQ(loss_runs[0][i], loss_runs[1][i]) << i;
  for (size_t i = 0; i < dx_runs[0].size(); ++i) ASSERT_EQ(dx_runs[0][i], dx_runs[1][i]) << i;
}

// Many more slices than fit on the GPU at once for the slice-exchange kernel: one slice per row
// (rows complete as soon as they post; sum) and three (rows spread over CTAs, label smoothing,
// mean over i32 targets). f16 takes the sum: a mean over 4000 rows of probabilities ~1/V would
// sit in f16's subnormals. Two runs must agree bitwise.
TEST_F(CrossEntropyMiscGpu, ExchangeManyRowsDeterministic) {
  struct Case {
    DType dt;
    int64_t n, v;
    float eps;
    Reduction red;
  };
  for (const Case c : {Case{DType::f16, 4000, 16392, 0.f, Reduction::sum},
                       Case{DType::bf16, 600, 50008, 0.1f, Reduction::mean}}) {
    SCOPED_TRACE("V " + std::to_string(c.v));
    std::vector<double> xv = rng().uniform(static_cast<size_t>(c.n * c.v), -8.0, 8.0);
    DeviceTensor x = test::to_device(c.dt, {c.n, c.v}, xv);
    const std::vector<int64_t> t = random_targets(rng(), c.n, c.v, -100, true);
    DeviceTensor td = targets_device(t, DType::i32);
    CrossEntropyOptions o;
    o.reduction = c.red;
    o.label_smoothing = c.eps;
    std::vector<double> loss_runs[2], dx_runs[2];
    for (int run = 0; run < 2; ++run) {
      DeviceTensor loss = test::alloc(DType::f32, {});
      DeviceTensor dx = test::alloc(c.dt, {c.n, c.v});
      cross_entropy(x.t, td.t, loss.t, &dx.t, stream(), o);
      sync();
      loss_runs[run] = test::download_values(loss);
      dx_runs[run] = test::download_values(dx);
    }
    const int red = static_cast<int>(c.red);
    const auto r = ref::cross_entropy(xv, t, c.n, c.v, -100, c.eps, red);
    EXPECT_TRUE(test::all_close(loss_runs[0], {red == 1 ? r.sum / r.count : r.sum}, DType::f32));
    EXPECT_TRUE(test::all_close(dx_runs[0], r.dlogits, c.dt));
    ASSERT_EQ(loss_runs[0], loss_runs[1]);
    for (size_t i = 0; i < dx_runs[0].size(); ++i) ASSERT_EQ(dx_runs[0][i], dx_runs[1][i]) << i;
  }
}

// ---- fused linear + cross-entropy ---------------------------------------------------------
using FlceParam = std::tuple<DType, int64_t, int64_t>;  // dtype, N, chunk_rows
class FusedLinearCrossEntropyGpu : public test::GpuTest,
                                   public ::testing::WithParamInterface<FlceParam> {};

TEST_P(FusedLinearCrossEntropyGpu, MatchesReference) {
  const auto [dt, n, chunk] = GetParam();
  const int64_t h = 64, v = 1000;
  for (int red : {1, 2}) {
    SCOPED_TRACE("reduction " + std::to_string(red));
    std::vector<double> hv = rng().uniform(static_cast<size_t>(n * h), -1.0, 1.0);
    std::vector<double> wv = rng().uniform(static_cast<size_t>(v * h), -1.0, 1.0);
    DeviceTensor hid = test::to_device(dt, {n, h}, hv);
    DeviceTensor w = test::to_device(dt, {v, h}, wv);
    const auto t = random_targets(rng(), n, v, -100, true);
    DeviceTensor td = targets_device(t, DType::i64);
    DeviceTensor loss = test::alloc(DType::f32, {1});
    DeviceTensor dh = test::alloc(red == 1 ? dt : DType::f32, {n, h});
    DeviceTensor dw = test::alloc(DType::f32, {v, h});
    FusedLinearCrossEntropyOptions o;
    o.ce.reduction = static_cast<Reduction>(red);
    o.ce.label_smoothing = red == 2 ? 0.05f : 0.f;
    o.chunk_rows = chunk;
    fused_linear_cross_entropy(hid.t, w.t, td.t, loss.t, &dh.t, &dw.t, stream(), o);
    sync();
    const ref::Storage st = test::storage(dt);
    static thread_local ref::Storage round_to;
    round_to = st;
    const auto r = ref::linear_cross_entropy(hv, wv, t, n, h, v, -100, red == 2 ? 0.05 : 0.0,
                                             red, [](double x) { return ref::quantize(round_to, x); });
    const double want = red == 1 ? r.ce.sum / r.ce.count : r.ce.sum;
    // logits are rounded to dt by the GEMM (as torch does), so the loss carries dt's error
    EXPECT_TRUE(test::all_close(test::download_values(loss), {want}, dt));
    EXPECT_TRUE(test::all_close(test::download_values(dh), r.dhidden, dt));
    EXPECT_TRUE(test::all_close(test::download_values(dw), r.dweight, dt));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedLinearCrossEntropyGpu,
    ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                       ::testing::Values(int64_t{1}, int64_t{7}, int64_t{37}),
                       ::testing::Values(int64_t{0}, int64_t{16})),
    [](const ::testing::TestParamInfo<FlceParam>& i) {
      return std::string(dtype_name(std::get<0>(i.param))) + "_N" +
             std::to_string(std::get<1>(i.param)) + "_chunk" +
             std::to_string(std::get<2>(i.param));
    });

// The shapes of tests/python/test_loss_optim_gpu.py: 64-row chunks are past the small-M
// GEMM (M <= 32), so the dhidden GEMM (K = V = 5000) runs split-K, whose completion
// counters live in the stream workspace; the op's count and per-row losses must not.
TEST_F(CrossEntropyMiscGpu, FusedSplitKChunksMatchReference) {
  const int64_t n = 300, h = 256, v = 5000, chunk = 64;
  std::vector<double> hv = rng().uniform(static_cast<size_t>(n * h), -1.0, 1.0);
  std::vector<double> wv = rng().uniform(static_cast<size_t>(v * h), -0.1, 0.1);
  DeviceTensor hid = test::to_device(DType::bf16, {n, h}, hv);
  DeviceTensor w = test::to_device(DType::bf16, {v, h}, wv);
  const auto t = random_targets(rng(), n, v, -100, false);
  DeviceTensor td = targets_device(t, DType::i64);
  const auto r = ref::linear_cross_entropy(hv, wv, t, n, h, v, -100, 0.0, 1, [](double x) {
    return ref::quantize(ref::Storage::bf16, x);
  });
  FusedLinearCrossEntropyOptions o;
  o.chunk_rows = chunk;
  for (int rep = 0; rep < 2; ++rep) {  // the second call finds the workspaces already grown
    SCOPED_TRACE("call " + std::to_string(rep));
    DeviceTensor loss = test::alloc(DType::f32, {});
    DeviceTensor dh = test::alloc(DType::bf16, {n, h});
    DeviceTensor dw = test::alloc(DType::f32, {v, h});
    fused_linear_cross_entropy(hid.t, w.t, td.t, loss.t, &dh.t, &dw.t, stream(), o);
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(loss), {r.ce.sum / r.ce.count}, DType::bf16));
    EXPECT_TRUE(test::all_close(test::download_values(dh), r.dhidden, DType::bf16));
    EXPECT_TRUE(test::all_close(test::download_values(dw), r.dweight, DType::bf16));
  }
}

TEST_F(CrossEntropyMiscGpu, FusedForwardOnlyMatchesUnfused) {
  const int64_t n = 19, h = 32, v = 136;
  std::vector<double> hv = rng().uniform(static_cast<size_t>(n * h), -1.0, 1.0);
  std::vector<double> wv = rng().uniform(static_cast<size_t>(v * h), -1.0, 1.0);
  DeviceTensor hid = test::to_device(DType::bf16, {n, h}, hv);
  DeviceTensor w = test::to_device(DType::bf16, {v, h}, wv);
  const auto t = random_targets(rng(), n, v, -100, true);
  DeviceTensor td = targets_device(t, DType::i32);
  DeviceTensor loss = test::alloc(DType::f32, {n});
  FusedLinearCrossEntropyOptions o;
  o.ce.reduction = Reduction::none;
  o.chunk_rows = 8;
  fused_linear_cross_entropy(hid.t, w.t, td.t, loss.t, nullptr, nullptr, stream(), o);
  sync();
  const auto r = ref::linear_cross_entropy(hv, wv, t, n, h, v, -100, 0.0, 0, [](double x) {
    return ref::quantize(ref::Storage::bf16, x);
  });
  EXPECT_TRUE(test::all_close(test::download_values(loss), r.ce.row_loss, DType::bf16));
}

}  // namespace
}  // namespace tessel
