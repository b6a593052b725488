// GPU tests of the norm family (include/tessel/norm.hpp) against the float64 references
// (src/ref/norm_ref.hpp): RMSNorm (plain, fused residual add, backward with and without an
// added dh), LayerNorm (with/without bias; backward with/without db) and GroupNorm;
// f32/f16/bf16; row lengths 1 … 262144 (register path, one CTA per row, clusters of 2 … 16
// CTAs per row), vectorized and scalar (ragged / unaligned) paths, row-pitched and N-D views,
// statistics outputs, determinism of the weight gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ref/norm_ref.hpp"
#include "tessel/norm.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;
using Shape = std::vector<int64_t>;

constexpr float kEps = 1e-5f;

std::vector<int64_t> row_counts(int64_t cols) {
  // ~300k elements per case at most (keeps the float64 references quick), >= 3 rows.
  const int64_t cap = std::max<int64_t>(3, int64_t{300} * 1000 / cols);
  std::vector<int64_t> rows;
  for (int64_t r : {int64_t{1}, int64_t{7}, int64_t{300}}) {
    const int64_t c = std::min(r, cap);
    if (rows.empty() || rows.back() != c) rows.push_back(c);
  }
  return rows;
}

// f32 statistics as doubles.
std::vector<double> download_f32(const DeviceTensor& d) { return test::download_values(d); }

DeviceTensor stats_to_device(const Shape& shape, const std::vector<double>& v) {
  std::vector<double> copy = v;
  return test::to_device(DType::f32, shape, copy);
}

Shape lead(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

// Term scale of a row-norm input gradient: rstd * (|g| + |xhat * m_gx| + |m_g|), computed
// like the reference (per element), so cancellation in dx is measured against its terms.
std::vector<double> dx_scale(const std::vector<double>& dy, const std::vector<double>& x,
                             const std::vector<double>& w, const ref::NormForward& f, int64_t rows,
                             int64_t cols, bool rms, int64_t hw = 0, int64_t cpg = 0,
                             int64_t groups = 0) {
  std::vector<double> s(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double mu = rms ? 0.0 : f.mean[r], rs = f.rstd[r];
    double sgx = 0, sg = 0;
    auto p = [&](int64_t c) { return hw == 0 ? c : (r % groups) * cpg + c / hw; };
    for (int64_t c = 0; c < cols; ++c) {
      const double g = dy[r * cols + c] * w[p(c)];
      sgx += std::fabs(g * (x[r * cols + c] - mu) * rs);
      sg += std::fabs(g);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double g = dy[r * cols + c] * w[p(c)], xh = (x[r * cols + c] - mu) * rs;
      s[r * cols + c] = rs * (std::fabs(g) + std::fabs(xh) * sgx / cols + (rms ? 0 : sg / cols));
    }
  }
  return s;
}

// Term scale of the weight gradients: sum over rows of |dy * xhat| (dw) and |dy| (db).
void dw_scale(const std::vector<double>& dy, const std::vector<double>& x,
              const ref::NormForward& f, int64_t rows, int64_t cols, bool rms,
              std::vector<double>& sw, std::vector<double>& sb, int64_t hw = 0, int64_t cpg = 0,
              int64_t groups = 0, int64_t nparams = 0) {
  sw.assign(nparams ? nparams : cols, 0.0);
  sb.assign(sw.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t p = hw == 0 ? c : (r % groups) * cpg + c / hw;
      const double xh = (x[r * cols + c] - (rms ? 0.0 : f.mean[r])) * f.rstd[r];
      sw[p] += std::fabs(dy[r * cols + c] * xh);
      sb[p] += std::fabs(dy[r * cols + c]);
    }
}

// Mean of a row: scale sum|x|/n.
std::vector<double> mean_scale(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> s(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) s[r] += std::fabs(x[r * cols + c]);
    s[r] /= static_cast<double>(cols);
  }
  return s;
}

using NormParam = std::tuple<DType, int64_t>;
class NormGpu : public test::GpuTest, public ::testing::WithParamInterface<NormParam> {};

TEST_P(NormGpu, RmsNormForward) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
    std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
    DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
    DeviceTensor w = test::to_device(dt, {cols}, wv);
    DeviceTensor y = test::alloc(dt, {rows, cols});
    DeviceTensor rs = test::alloc(DType::f32, {rows});
    rms_norm(x.t, w.t, y.t, &rs.t, kEps, stream());
    sync();
    const ref::NormForward f = ref::rms_norm(xv, wv, rows, cols, kEps);
    EXPECT_TRUE(test::all_close(test::download_values(y), f.y, dt));
    EXPECT_TRUE(test::all_close(download_f32(rs), f.rstd, DType::f32));
  }
}

TEST_P(NormGpu, RmsNormAddForward) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
    std::vector<double> rv = rng().uniform(rows * cols, -2.0, 2.0);
    std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
    DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
    DeviceTensor r = test::to_device(dt, {rows, cols}, rv);
    DeviceTensor w = test::to_device(dt, {cols}, wv);
    DeviceTensor h = test::alloc(dt, {rows, cols});
    DeviceTensor y = test::alloc(dt, {rows, cols});
    rms_norm_add(x.t, r.t, w.t, h.t, y.t, nullptr, kEps, stream());
    sync();
    std::vector<double> hv(xv.size()), habs(xv.size());
    for (size_t i = 0; i < hv.size(); ++i) {
      hv[i] = xv[i] + rv[i];
      habs[i] = std::fabs(xv[i]) + std::fabs(rv[i]);
    }
    EXPECT_TRUE(test::all_close(test::download_values(h), hv, dt, habs));
    EXPECT_TRUE(
        test::all_close(test::download_values(y), ref::rms_norm(hv, wv, rows, cols, kEps).y, dt));
  }
}

TEST_P(NormGpu, RmsNormBackward) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    for (bool with_dh : {false, true}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + (with_dh ? " with dh" : ""));
      std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
      std::vector<double> gv = rng().uniform(rows * cols, -1.0, 1.0);
      std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
      std::vector<double> hv =
          with_dh ? rng().uniform(rows * cols, -1.0, 1.0) : std::vector<double>{};
      DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
      DeviceTensor dy = test::to_device(dt, {rows, cols}, gv);
      DeviceTensor w = test::to_device(dt, {cols}, wv);
      DeviceTensor dh = with_dh ? test::to_device(dt, {rows, cols}, hv) : test::alloc(dt, {0});
      const ref::NormForward f = ref::rms_norm(xv, wv, rows, cols, kEps);
      DeviceTensor rs = stats_to_device({rows}, f.rstd);
      DeviceTensor dx = test::alloc(dt, {rows, cols});
      DeviceTensor dw = test::alloc(dt, {cols});
      rms_norm_backward(dy.t, x.t, w.t, rs.t, with_dh ? &dh.t : nullptr, dx.t, dw.t, stream());
      sync();
      const ref::NormBackward b = ref::rms_norm_backward(gv, xv, wv, hv, rows, cols, kEps);
      std::vector<double> sdx = dx_scale(gv, xv, wv, f, rows, cols, true);
      if (with_dh)
        for (size_t i = 0; i < sdx.size(); ++i) sdx[i] += std::fabs(hv[i]);
      std::vector<double> sw, sb;
      dw_scale(gv, xv, f, rows, cols, true, sw, sb);
      EXPECT_TRUE(test::all_close(test::download_values(dx), b.dx, dt, sdx));
      EXPECT_TRUE(test::all_close(test::download_values(dw), b.dw, dt, sw));
    }
  }
}

TEST_P(NormGpu, LayerNormForward) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + (bias ? " bias" : " no bias"));
      // An offset mean: a one-pass E[x^2] - E[x]^2 variance would lose precision.
      std::vector<double> xv = rng().uniform(rows * cols, 1.0, 5.0);
      std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
      std::vector<double> bv = bias ? rng().uniform(cols, -1.0, 1.0) : std::vector<double>{};
      DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
      DeviceTensor w = test::to_device(dt, {cols}, wv);
      DeviceTensor b = bias ? test::to_device(dt, {cols}, bv) : test::alloc(dt, {cols});
      DeviceTensor y = test::alloc(dt, {rows, cols});
      DeviceTensor mu = test::alloc(DType::f32, {rows});
      DeviceTensor rs = test::alloc(DType::f32, {rows});
      layer_norm(x.t, w.t, bias ? &b.t : nullptr, y.t, &mu.t, &rs.t, kEps, stream());
      sync();
      const ref::NormForward f = ref::layer_norm(xv, wv, bv, rows, cols, kEps);
      EXPECT_TRUE(test::all_close(test::download_values(y), f.y, dt));
      EXPECT_TRUE(
          test::all_close(download_f32(mu), f.mean, DType::f32, mean_scale(xv, rows, cols)));
      // rstd of a low-variance row: fp32 sum of squared deviations, a few ulp per term.
      EXPECT_TRUE(test::all_close(download_f32(rs), f.rstd, cols == 1 ? DType::f32 : DType::f32));
    }
  }
}

TEST_P(NormGpu, LayerNormBackward) {
  const auto [dt, cols] = GetParam();
  for (int64_t rows : row_counts(cols)) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + (bias ? " with db" : " no db"));
      std::vector<double> xv = rng().uniform(rows * cols, -2.0, 3.0);
      std::vector<double> gv = rng().uniform(rows * cols, -1.0, 1.0);
      std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
      DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
      DeviceTensor dy = test::to_device(dt, {rows, cols}, gv);
      DeviceTensor w = test::to_device(dt, {cols}, wv);
      const ref::NormForward f = ref::layer_norm(xv, wv, {}, rows, cols, kEps);
      DeviceTensor mu = stats_to_device({rows}, f.mean);
      DeviceTensor rs = stats_to_device({rows}, f.rstd);
      DeviceTensor dx = test::alloc(dt, {rows, cols});
      DeviceTensor dw = test::alloc(dt, {cols});
      DeviceTensor db = test::alloc(dt, {cols});
      layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw.t, bias ? &db.t : nullptr, stream());
      sync();
      const ref::NormBackward b = ref::layer_norm_backward(gv, xv, wv, rows, cols, kEps);
      std::vector<double> sw, sb;
      dw_scale(gv, xv, f, rows, cols, false, sw, sb);
      EXPECT_TRUE(test::all_close(test::download_values(dx), b.dx, dt,
                                  dx_scale(gv, xv, wv, f, rows, cols, false)));
      EXPECT_TRUE(test::all_close(test::download_values(dw), b.dw, dt, sw));
      if (bias) {
        EXPECT_TRUE(test::all_close(test::download_values(db), b.db, dt, sb));
      } else {
        EXPECT_TRUE(test::outside_untouched(db));  // never written
      }
    }
  }
}

// Long rows (> 16384, 16-bit: the cluster kernel of norm_staged.cuh) with more rows than
// resident clusters, so each cluster loops over rows through both ring stages and dw/db
// accumulate over several rows; the same call twice gives the same bits.
class NormLongRowsGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(NormLongRowsGpu, BackwardManyRowsPerCluster) {
  const DType dt = GetParam();
  const int64_t rows = 301, cols = 16392;  // 2 CTAs per row, 1025 vectors per slice
  std::vector<double> xv = rng().uniform(rows * cols, -2.0, 3.0);
  std::vector<double> gv = rng().uniform(rows * cols, -1.0, 1.0);
  std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
  std::vector<double> hv = rng().uniform(rows * cols, -1.0, 1.0);
  DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
  DeviceTensor dy = test::to_device(dt, {rows, cols}, gv);
  DeviceTensor w = test::to_device(dt, {cols}, wv);
  DeviceTensor dh = test::to_device(dt, {rows, cols}, hv);
  {
    SCOPED_TRACE("rms_norm_backward with dh");
    const ref::NormForward f = ref::rms_norm(xv, wv, rows, cols, kEps);
    DeviceTensor rs = stats_to_device({rows}, f.rstd);
    DeviceTensor dx = test::alloc(dt, {rows, cols}), dx2 = test::alloc(dt, {rows, cols});
    DeviceTensor dw = test::alloc(dt, {cols}), dw2 = test::alloc(dt, {cols});
    rms_norm_backward(dy.t, x.t, w.t, rs.t, &dh.t, dx.t, dw.t, stream());
    rms_norm_backward(dy.t, x.t, w.t, rs.t, &dh.t, dx2.t, dw2.t, stream());
    sync();
    const ref::NormBackward b = ref::rms_norm_backward(gv, xv, wv, hv, rows, cols, kEps);
    std::vector<double> sdx = dx_scale(gv, xv, wv, f, rows, cols, true);
    for (size_t i = 0; i < sdx.size(); ++i) sdx[i] += std::fabs(hv[i]);
    std::vector<double> sw, sb;
    dw_scale(gv, xv, f, rows, cols, true, sw, sb);
    EXPECT_TRUE(test::all_close(test::download_values(dx), b.dx, dt, sdx));
    EXPECT_TRUE(test::all_close(test::download_values(dw), b.dw, dt, sw));
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(dx2), test::download_bytes(dx), dtype_size(dt)));
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(dw2), test::download_bytes(dw), dtype_size(dt)));
  }
  {
    SCOPED_TRACE("layer_norm_backward");
    const ref::NormForward f = ref::layer_norm(xv, wv, {}, rows, cols, kEps);
    DeviceTensor mu = stats_to_device({rows}, f.mean);
    DeviceTensor rs = stats_to_device({rows}, f.rstd);
    DeviceTensor dx = test::alloc(dt, {rows, cols});
    DeviceTensor dw = test::alloc(dt, {cols}), db = test::alloc(dt, {cols});
    DeviceTensor dw2 = test::alloc(dt, {cols}), db2 = test::alloc(dt, {cols});
    layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw.t, &db.t, stream());
    layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw2.t, &db2.t, stream());
    sync();
    const ref::NormBackward b = ref::layer_norm_backward(gv, xv, wv, rows, cols, kEps);
    std::vector<double> sw, sb;
    dw_scale(gv, xv, f, rows, cols, false, sw, sb);
    EXPECT_TRUE(test::all_close(test::download_values(dx), b.dx, dt,
                                dx_scale(gv, xv, wv, f, rows, cols, false)));
    EXPECT_TRUE(test::all_close(test::download_values(dw), b.dw, dt, sw));
    EXPECT_TRUE(test::all_close(test::download_values(db), b.db, dt, sb));
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(dw2), test::download_bytes(dw), dtype_size(dt)));
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(db2), test::download_bytes(db), dtype_size(dt)));
  }
}

INSTANTIATE_TEST_SUITE_P(All, NormLongRowsGpu, ::testing::ValuesIn(test::kFloatDTypes),
                         test::dtype_param_name);

std::string norm_name(const ::testing::TestParamInfo<NormParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_cols" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    All, NormGpu,
    ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                       ::testing::Values(1, 7, 127, 128, 1000, 1024, 4096, 4097, 6144, 8192, 16384,
                                         16385, 16392, 24584, 40000, 100000, 131073, 262144)),
    norm_name);

// ---- layouts, aliasing, determinism -------------------------------------------------------

class NormLayoutGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {};

// Row-pitched slices at unaligned offsets (the scalar path) and aligned pitched ones (the
// vector path); outputs' padding stays untouched.
TEST_P(NormLayoutGpu, RowPitchedViews) {
  const DType dt = GetParam();
  for (const auto& [rows, cols, xp, yp, off] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {33, 1000, 1003, 1024, 1},
           {5, 4096, 4104, 4096 + 64, 0},
           {3, 70000, 70001, 70016, 3},
           {64, 96, 128, 104, 0}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
    std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
    std::vector<double> gv = rng().uniform(rows * cols, -1.0, 1.0);
    std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
    std::vector<double> bv = rng().uniform(cols, -1.0, 1.0);
    DeviceTensor x = test::alloc_pitched(dt, {rows, cols}, xp, off);
    test::upload_values(x, xv);
    DeviceTensor dy = test::alloc_pitched(dt, {rows, cols}, yp, off);
    test::upload_values(dy, gv);
    DeviceTensor w = test::to_device(dt, {cols}, wv);
    DeviceTensor b = test::to_device(dt, {cols}, bv);
    DeviceTensor y = test::alloc_pitched(dt, {rows, cols}, yp, 0);
    DeviceTensor mu = test::alloc(DType::f32, {rows});
    DeviceTensor rs = test::alloc(DType::f32, {rows});
    layer_norm(x.t, w.t, &b.t, y.t, &mu.t, &rs.t, kEps, stream());
    sync();
    const ref::NormForward f = ref::layer_norm(xv, wv, bv, rows, cols, kEps);
    EXPECT_TRUE(test::all_close(test::download_values(y), f.y, dt));
    EXPECT_TRUE(test::outside_untouched(y));

    DeviceTensor dx = test::alloc_pitched(dt, {rows, cols}, xp, 2);
    DeviceTensor dw = test::alloc(dt, {cols});
    DeviceTensor db = test::alloc(dt, {cols});
    layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw.t, &db.t, stream());
    sync();
    const ref::NormBackward bw = ref::layer_norm_backward(gv, xv, wv, rows, cols, kEps);
    std::vector<double> sw, sb;
    dw_scale(gv, xv, f, rows, cols, false, sw, sb);
    EXPECT_TRUE(test::all_close(test::download_values(dx), bw.dx, dt,
                                dx_scale(gv, xv, wv, f, rows, cols, false)));
    EXPECT_TRUE(test::outside_untouched(dx));
    EXPECT_TRUE(test::all_close(test::download_values(dw), bw.dw, dt, sw));
    EXPECT_TRUE(test::all_close(test::download_values(db), bw.db, dt, sb));

    DeviceTensor yr = test::alloc_pitched(dt, {rows, cols}, xp, 1);
    rms_norm(x.t, w.t, yr.t, nullptr, kEps, stream());
    sync();
    EXPECT_TRUE(
        test::all_close(test::download_values(yr), ref::rms_norm(xv, wv, rows, cols, kEps).y, dt));
    EXPECT_TRUE(test::outside_untouched(yr));
  }
}

// 3-D input folds into rows; statistics keep the leading shape; h written over residual.
TEST_P(NormLayoutGpu, ThreeDimensionalAndInPlaceResidual) {
  const DType dt = GetParam();
  const Shape shape = {2, 3, 264};
  const int64_t rows = 6, cols = 264;
  std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
  std::vector<double> rv = rng().uniform(rows * cols, -2.0, 2.0);
  std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
  DeviceTensor x = test::to_device(dt, shape, xv);
  DeviceTensor r = test::to_device(dt, shape, rv);
  DeviceTensor w = test::to_device(dt, {cols}, wv);
  DeviceTensor y = test::alloc(dt, shape);
  DeviceTensor rs = test::alloc(DType::f32, {2, 3});
  rms_norm_add(x.t, r.t, w.t, r.t, y.t, &rs.t, kEps, stream());  // h aliases residual
  sync();
  std::vector<double> hv(xv.size());
  for (size_t i = 0; i < hv.size(); ++i) hv[i] = xv[i] + rv[i];
  const ref::NormForward f = ref::rms_norm(hv, wv, rows, cols, kEps);
  EXPECT_TRUE(test::all_close(test::download_values(y), f.y, dt));
  EXPECT_TRUE(test::all_close(test::download_values(r), hv, dt));
  EXPECT_TRUE(test::all_close(download_f32(rs), f.rstd, DType::f32));
}

// Weight gradients are bitwise identical from run to run (no float atomics).
TEST_P(NormLayoutGpu, WeightGradientsDeterministic) {
  const DType dt = GetParam();
  for (int64_t cols : {int64_t{4096}, int64_t{40000}}) {
    const int64_t rows = cols > 10000 ? 24 : 1000;
    std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
    std::vector<double> gv = rng().uniform(rows * cols, -1.0, 1.0);
    std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
    DeviceTensor x = test::to_device(dt, {rows, cols}, xv);
    DeviceTensor dy = test::to_device(dt, {rows, cols}, gv);
    DeviceTensor w = test::to_device(dt, {cols}, wv);
    const ref::NormForward f = ref::layer_norm(xv, wv, {}, rows, cols, kEps);
    DeviceTensor mu = stats_to_device({rows}, f.mean);
    DeviceTensor rs = stats_to_device({rows}, f.rstd);
    DeviceTensor dx = test::alloc(dt, {rows, cols});
    DeviceTensor dw1 = test::alloc(dt, {cols}), db1 = test::alloc(dt, {cols});
    DeviceTensor dw2 = test::alloc(dt, {cols}), db2 = test::alloc(dt, {cols});
    layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw1.t, &db1.t, stream());
    // Back to back, with and without db, into poisoned outputs: the same bits every time.
    for (int rep = 0; rep < 6; ++rep) {
      sync();
      test::poison(dw2);
      test::poison(db2);
      layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw2.t, &db2.t, stream());
      layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw2.t, nullptr, stream());
    }
    sync();
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(dw1), test::download_bytes(dw2), dtype_size(dt)));
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(db1), test::download_bytes(db2), dtype_size(dt)));
  }
}

// Many rows per CTA through the shared-memory staged backward (rows 16-byte aligned, 1024 …
// 8192 columns): the stage ring wraps several times; x and dy row-pitched.
TEST_P(NormLayoutGpu, StagedBackwardManyRows) {
  const DType dt = GetParam();
  const int64_t rows = 12000, cols = 1024, pitch = 1024 + 64;
  std::vector<double> xv = rng().uniform(rows * cols, -2.0, 2.0);
  std::vector<double> gv = rng().uniform(rows * cols, -1.0, 1.0);
  std::vector<double> wv = rng().uniform(cols, 0.5, 1.5);
  DeviceTensor x = test::alloc_pitched(dt, {rows, cols}, pitch);
  test::upload_values(x, xv);
  DeviceTensor dy = test::alloc_pitched(dt, {rows, cols}, pitch);
  test::upload_values(dy, gv);
  DeviceTensor w = test::to_device(dt, {cols}, wv);
  const ref::NormForward f = ref::layer_norm(xv, wv, {}, rows, cols, kEps);
  DeviceTensor mu = stats_to_device({rows}, f.mean);
  DeviceTensor rs = stats_to_device({rows}, f.rstd);
  DeviceTensor dx = test::alloc(dt, {rows, cols});
  DeviceTensor dw = test::alloc(dt, {cols}), db = test::alloc(dt, {cols});
  layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw.t, &db.t, stream());
  sync();
  const ref::NormBackward bw = ref::layer_norm_backward(gv, xv, wv, rows, cols, kEps);
  std::vector<double> sw, sb;
  dw_scale(gv, xv, f, rows, cols, false, sw, sb);
  EXPECT_TRUE(test::all_close(test::download_values(dx), bw.dx, dt,
                              dx_scale(gv, xv, wv, f, rows, cols, false)));
  EXPECT_TRUE(test::all_close(test::download_values(dw), bw.dw, dt, sw));
  EXPECT_TRUE(test::all_close(test::download_values(db), bw.db, dt, sb));

  const ref::NormForward fr = ref::rms_norm(xv, wv, rows, cols, kEps);
  DeviceTensor rr = stats_to_device({rows}, fr.rstd);
  DeviceTensor dx2 = test::alloc(dt, {rows, cols});
  DeviceTensor dw2 = test::alloc(dt, {cols});
  rms_norm_backward(dy.t, x.t, w.t, rr.t, nullptr, dx2.t, dw2.t, stream());
  sync();
  const ref::NormBackward br = ref::rms_norm_backward(gv, xv, wv, {}, rows, cols, kEps);
  dw_scale(gv, xv, fr, rows, cols, true, sw, sb);
  EXPECT_TRUE(test::all_close(test::download_values(dx2), br.dx, dt,
                              dx_scale(gv, xv, wv, fr, rows, cols, true)));
  EXPECT_TRUE(test::all_close(test::download_values(dw2), br.dw, dt, sw));
}

// No rows: dw (and db) are zero (a sum over nothing).
TEST_P(NormLayoutGpu, ZeroRowsGiveZeroWeightGradients) {
  const DType dt = GetParam();
  DeviceTensor x = test::alloc(dt, {0, 64}), dy = test::alloc(dt, {0, 64}),
               dx = test::alloc(dt, {0, 64});
  std::vector<double> wv = rng().uniform(64, 0.5, 1.5);
  DeviceTensor w = test::to_device(dt, {64}, wv);
  DeviceTensor mu = test::alloc(DType::f32, {0}), rs = test::alloc(DType::f32, {0});
  DeviceTensor dw = test::alloc(dt, {64}), db = test::alloc(dt, {64});
  layer_norm_backward(dy.t, x.t, w.t, mu.t, rs.t, dx.t, dw.t, &db.t, stream());
  sync();
  const std::vector<double> zeros(64, 0.0);
  EXPECT_EQ(test::download_values(dw), zeros);
  EXPECT_EQ(test::download_values(db), zeros);
}

INSTANTIATE_TEST_SUITE_P(All, NormLayoutGpu, ::testing::ValuesIn(test::kFloatDTypes),
                         test::dtype_param_name);

// ---- GroupNorm ------------------------------------------------------------------------------

using GroupParam = std::tuple<DType, int>;
class GroupNormGpu : public test::GpuTest, public ::testing::WithParamInterface<GroupParam> {};

struct GnCase {
  Shape shape;
  int64_t groups;
};

const GnCase kGnCases[] = {
    {{2, 6, 7}, 3},          // hw = 7: scalar path
    {{3, 32, 8, 8}, 8},      // vector path, short rows
    {{2, 64, 33}, 32},       // odd hw
    {{2, 8}, 4},             // no spatial dims
    {{2, 320, 16, 16}, 32},  // cpg 10 x 256
    {{1, 4, 65536}, 1},      // one row of 262144: cluster of 16
    {{2, 64, 40, 40}, 32},   // row 3200
    {{1, 32, 96, 96}, 4},    // row 73728: cluster
    // staged path (rows >= 2048, hw % VEC == 0): channels cut by slice boundaries, ragged last
    // slice, a channel longer than a slice, and one with too many channels per slice for the
    // staged backward (register path there)
    {{3, 24, 1000}, 2},   // row 12000: 2-3 CTAs, channels split across slices
    {{2, 10, 1712}, 1},   // row 17120: last slice shorter
    {{1, 7, 48, 48}, 7},  // cpg 1: rows of 2304, odd n*G
    {{3, 6, 4104}, 3},    // cpg 2, rows 8208, odd slices
    {{2, 4096, 8}, 2},    // cpg 2048 of hw 8: staged forward, register backward
    {{2, 128, 32}, 2},    // one slice of exactly 64 channels: the forward's channel table
    {{2, 130, 32}, 2},    // 65 channels in one slice: the forward's per-vector weight loads
    // more rows than resident clusters: the staged backward's clusters loop over rows
    {{16, 128, 64, 64}, 16},  // 256 rows of 32768 (4-8 CTAs per row)
    {{600, 4, 2048}, 2},      // 1200 rows of 4096 (one CTA per row)
};

TEST_P(GroupNormGpu, ForwardAndBackward) {
  const auto [dt, which] = GetParam();
  const GnCase& gc = kGnCases[which];
  const int64_t n = gc.shape[0], c = gc.shape[1];
  int64_t hw = 1;
  for (size_t d = 2; d < gc.shape.size(); ++d) hw *= gc.shape[d];
  const int64_t G = gc.groups, cpg = c / G, rows = n * G, cols = cpg * hw;
  SCOPED_TRACE("shape " + test::shape_str(gc.shape) + " groups " + std::to_string(G));
  std::vector<double> xv = rng().uniform(n * c * hw, -1.0, 3.0);
  std::vector<double> gv = rng().uniform(n * c * hw, -1.0, 1.0);
  std::vector<double> wv = rng().uniform(c, 0.5, 1.5);
  std::vector<double> bv = rng().uniform(c, -1.0, 1.0);
  DeviceTensor x = test::to_device(dt, gc.shape, xv);
  DeviceTensor dy = test::to_device(dt, gc.shape, gv);
  DeviceTensor w = test::to_device(dt, {c}, wv);
  DeviceTensor b = test::to_device(dt, {c}, bv);
  DeviceTensor y = test::alloc(dt, gc.shape);
  DeviceTensor mu = test::alloc(DType::f32, {n, G});
  DeviceTensor rs = test::alloc(DType::f32, {n, G});
  group_norm(x.t, G, w.t, &b.t, y.t, &mu.t, &rs.t, kEps, stream());
  sync();
  const ref::NormForward f = ref::group_norm(xv, wv, bv, n, c, hw, G, kEps);
  EXPECT_TRUE(test::all_close(test::download_values(y), f.y, dt));
  EXPECT_TRUE(test::all_close(download_f32(mu), f.mean, DType::f32, mean_scale(xv, rows, cols)));
  EXPECT_TRUE(test::all_close(download_f32(rs), f.rstd, DType::f32));

  DeviceTensor y2 = test::alloc(dt, gc.shape);  // without bias and statistics
  group_norm(x.t, G, w.t, nullptr, y2.t, nullptr, nullptr, kEps, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(y2),
                              ref::group_norm(xv, wv, {}, n, c, hw, G, kEps).y, dt));

  DeviceTensor dx = test::alloc(dt, gc.shape);
  DeviceTensor dw = test::alloc(dt, {c});
  DeviceTensor db = test::alloc(dt, {c});
  group_norm_backward(dy.t, x.t, G, w.t, mu.t, rs.t, dx.t, dw.t, &db.t, stream());
  sync();
  const ref::NormBackward bw = ref::group_norm_backward(gv, xv, wv, n, c, hw, G, kEps);
  std::vector<double> sw, sb;
  dw_scale(gv, xv, f, rows, cols, false, sw, sb, hw, cpg, G, c);
  EXPECT_TRUE(test::all_close(test::download_values(dx), bw.dx, dt,
                              dx_scale(gv, xv, wv, f, rows, cols, false, hw, cpg, G)));
  EXPECT_TRUE(test::all_close(test::download_values(dw), bw.dw, dt, sw));
  EXPECT_TRUE(test::all_close(test::download_values(db), bw.db, dt, sb));
}

INSTANTIATE_TEST_SUITE_P(
    All, GroupNormGpu,
    ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                       ::testing::Range(0, static_cast<int>(std::size(kGnCases)))),
    test::dtype_case_name);

}  // namespace
}  // namespace tessel
