// Bench suite "norms": RMSNorm (plain and fused residual add), LayerNorm and GroupNorm,
// forward and backward, bf16 (and f32 for one shape).
//
// Baseline: cuDNN's norm API is awkward to drive for all three, so every case is measured
// against "cudaMemcpy (roofline)" — a device-to-device copy of the same byte count, as the
// memory suite does for baselines that cannot run. The real competitors (torch eager /
// torch.compile) are measured by bench/vs_torch.py. Target: peak_fraction >= 0.90 (ours /
// the measured copy bandwidth), >= 0.75 for the 262144-column rows.
// Bytes = every input read once + every output written once: x (+ residual) (+ dy), w (+ b),
// statistics read/written (f32 per row), y (+ h) (+ dx), and dw (+ db) once.
// Each case is checked once before timing: sampled rows of the output (and the whole dw/db for
// backward) against float64 on the host; max error <= tol * max |ref|.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "harness.hpp"
#include "tessel/norm.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kEps = 1e-5f;
constexpr const char* kRoofline = "cudaMemcpy (roofline)";

template <class T>
struct Info;
template <>
struct Info<bf16> {
  static constexpr DType dtype = DType::bf16;
  static constexpr const char* name = "bf16";
  static constexpr double tol = 1.6e-2;
};
template <>
struct Info<float> {
  static constexpr DType dtype = DType::f32;
  static constexpr const char* name = "f32";
  static constexpr double tol = 2e-5;
};

struct Roofline {
  explicit Roofline(double bytes)
      : half(static_cast<size_t>(bytes / 2) & ~size_t{255}), src(half), dst(half) {}
  void run(cudaStream_t s) const {
    TESSEL_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), half, cudaMemcpyDeviceToDevice, s));
  }
  size_t half;
  DeviceMem src, dst;
};

template <class T>
std::vector<double> fetch(const void* p, size_t offset, size_t n) {
  std::vector<T> h(n);
  TESSEL_BENCH_CUDA(cudaMemcpy(h.data(), static_cast<const T*>(p) + offset, n * sizeof(T),
                               cudaMemcpyDeviceToHost));
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = to_f32(h[i]);
  return d;
}

// max |got - ref| vs tol * max |ref| over one array.
struct Check {
  double max_err = 0, max_ref = 0;
  void add(double got, double ref) {
    const double e = std::fabs(got - ref);
    max_err = std::isfinite(e) ? std::max(max_err, e) : INFINITY;
    max_ref = std::max(max_ref, std::fabs(ref));
  }
  bool ok(double tol) const { return max_err <= tol * max_ref; }
};

enum class Kind { rms, rms_add, ln, gn };

struct Problem {
  Kind kind;
  bool backward;
  int64_t rows, cols;            // statistics rows x elements per row
  int64_t n = 0, c = 0, hw = 0;  // group norm
  int64_t groups = 0;
  int64_t nparam() const { return kind == Kind::gn ? c : cols; }
};

const char* op_name(const Problem& p) {
  switch (p.kind) {
    case Kind::rms:
    case Kind::rms_add: return p.backward ? "rms_norm_bwd" : "rms_norm_fwd";
    case Kind::ln: return p.backward ? "layer_norm_bwd" : "layer_norm_fwd";
    case Kind::gn: return p.backward ? "group_norm_bwd" : "group_norm_fwd";
  }
  return "?";
}

// float64 forward/backward of one statistics row (GN: param index = g*cpg + col/hw).
template <class T>
Check check_case(const Problem& p, const void* x, const void* r, const void* w, const void* b,
                 const void* dy,
                 const void* out, const void* dw, const void* db, Check& cw, Check& cb) {
  Check cy;
  const size_t cols = static_cast<size_t>(p.cols);
  const std::vector<double> wv = fetch<T>(w, 0, static_cast<size_t>(p.nparam()));
  const std::vector<double> bv =
      b ? fetch<T>(b, 0, static_cast<size_t>(p.nparam())) : std::vector<double>{};
  const int64_t cpg = p.kind == Kind::gn ? p.c / p.groups : 0;
  auto pidx = [&](int64_t row, int64_t col) {
    return p.kind == Kind::gn ? (row % p.groups) * cpg + col / p.hw : col;
  };
  const bool rms = p.kind == Kind::rms || p.kind == Kind::rms_add;
  std::vector<double> dw_ref, db_ref;
  if (p.backward) {
    dw_ref.assign(static_cast<size_t>(p.nparam()), 0.0);
    db_ref.assign(dw_ref.size(), 0.0);
  }
  // Backward checks every row (dw needs them all); forward checks 64 sampled rows.
  const int64_t step = p.backward ? 1 : std::max<int64_t>(1, p.rows / 64);
  for (int64_t row = 0; row < p.rows; row += step) {
    std::vector<double> xv = fetch<T>(x, row * cols, cols);
    if (p.kind == Kind::rms_add) {
      const std::vector<double> rv = fetch<T>(r, row * cols, cols);
      for (size_t i = 0; i < cols; ++i) xv[i] += rv[i];
    }
    double mean = 0, ss = 0;
    if (!rms) {
      for (double v : xv) mean += v;
      mean /= static_cast<double>(cols);
    }
    for (double v : xv) ss += (v - mean) * (v - mean);
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(cols) + kEps);
    const std::vector<double> ov = fetch<T>(out, row * cols, cols);
    if (!p.backward) {
      for (size_t i = 0; i < cols; ++i)
        cy.add(ov[i], (xv[i] - mean) * rstd * wv[pidx(row, i)] + (bv.empty() ? 0.0 : bv[pidx(row, i)]));
      continue;
    }
    const std::vector<double> gv = fetch<T>(dy, row * cols, cols);
    double sgx = 0, sg = 0;
    for (size_t i = 0; i < cols; ++i) {
      const double g = gv[i] * wv[pidx(row, i)], xh = (xv[i] - mean) * rstd;
      sgx += g * xh;
      sg += g;
      dw_ref[pidx(row, i)] += gv[i] * xh;
      db_ref[pidx(row, i)] += gv[i];
    }
    for (size_t i = 0; i < cols; ++i) {
      const double g = gv[i] * wv[pidx(row, i)], xh = (xv[i] - mean) * rstd;
      cy.add(ov[i], rstd * (g - xh * sgx / cols - (rms ? 0.0 : sg / cols)));
    }
  }
  if (p.backward) {
    const std::vector<double> dwv = fetch<T>(dw, 0, dw_ref.size());
    for (size_t i = 0; i < dw_ref.size(); ++i) cw.add(dwv[i], dw_ref[i]);
    if (db) {
      const std::vector<double> dbv = fetch<T>(db, 0, db_ref.size());
      for (size_t i = 0; i < db_ref.size(); ++i) cb.add(dbv[i], db_ref[i]);
    }
  }
  return cy;
}

template <class T>
void norm_case(SuiteContext& ctx, Problem p, const std::string& label) {
  const std::string op = op_name(p);
  if (!ctx.wants(op)) return;
  const cudaStream_t s = ctx.stream();
  const size_t n = static_cast<size_t>(p.rows * p.cols), es = sizeof(T);
  const size_t np = static_cast<size_t>(p.nparam()), nr = static_cast<size_t>(p.rows);
  const bool bias = p.kind == Kind::ln || p.kind == Kind::gn;
  DeviceMem x(n * es), r(p.kind == Kind::rms_add ? n * es : 0), dy(p.backward ? n * es : 0);
  DeviceMem y(n * es), h(p.kind == Kind::rms_add ? n * es : 0), w(np * es), b(np * es);
  DeviceMem mean(nr * 4), rstd(nr * 4), dw(np * es), db(np * es);
  fill_uniform(x.as<T>(), n, 701u, -2.f, 3.f, s);
  if (p.kind == Kind::rms_add) fill_uniform(r.as<T>(), n, 702u, -2.f, 2.f, s);
  if (p.backward) fill_uniform(dy.as<T>(), n, 703u, -1.f, 1.f, s);
  fill_uniform(w.as<T>(), np, 704u, 0.5f, 1.5f, s);
  fill_uniform(b.as<T>(), np, 705u, -1.f, 1.f, s);

  const DType dt = Info<T>::dtype;
  Tensor tx, tdy, ty, th, tr, tm, ts;
  const Tensor tw = Tensor::contiguous(w.get(), dt, {static_cast<int64_t>(np)});
  const Tensor tb = Tensor::contiguous(b.get(), dt, {static_cast<int64_t>(np)});
  Tensor tdw = Tensor::contiguous(dw.get(), dt, {static_cast<int64_t>(np)});
  Tensor tdb = Tensor::contiguous(db.get(), dt, {static_cast<int64_t>(np)});
  if (p.kind == Kind::gn) {
    const std::initializer_list<int64_t> sh = {p.n, p.c, p.hw};
    tx = Tensor::contiguous(x.get(), dt, sh);
    tdy = Tensor::contiguous(dy.get(), dt, sh);
    ty = Tensor::contiguous(y.get(), dt, sh);
    tm = Tensor::contiguous(mean.get(), DType::f32, {p.n, p.groups});
    ts = Tensor::contiguous(rstd.get(), DType::f32, {p.n, p.groups});
  } else {
    const std::initializer_list<int64_t> sh = {p.rows, p.cols};
    tx = Tensor::contiguous(x.get(), dt, sh);
    tr = Tensor::contiguous(r.get(), dt, sh);
    th = Tensor::contiguous(h.get(), dt, sh);
    tdy = Tensor::contiguous(dy.get(), dt, sh);
    ty = Tensor::contiguous(y.get(), dt, sh);
    tm = Tensor::contiguous(mean.get(), DType::f32, {p.rows});
    ts = Tensor::contiguous(rstd.get(), DType::f32, {p.rows});
  }
  // Forward ops (also produce the statistics the backward cases consume).
  auto fwd = [&, s] {
    switch (p.kind) {
      case Kind::rms: rms_norm(tx, tw, ty, &ts, kEps, s); break;
      case Kind::rms_add: rms_norm_add(tx, tr, tw, th, ty, &ts, kEps, s); break;
      case Kind::ln: layer_norm(tx, tw, &tb, ty, &tm, &ts, kEps, s); break;
      case Kind::gn: group_norm(tx, p.groups, tw, &tb, ty, &tm, &ts, kEps, s); break;
    }
  };
  auto bwd = [&, s] {
    switch (p.kind) {
      case Kind::rms:
      case Kind::rms_add: rms_norm_backward(tdy, tx, tw, ts, nullptr, ty, tdw, s); break;
      case Kind::ln: layer_norm_backward(tdy, tx, tw, tm, ts, ty, tdw, &tdb, s); break;
      case Kind::gn: group_norm_backward(tdy, tx, p.groups, tw, tm, ts, ty, tdw, &tdb, s); break;
    }
  };

  Record rec;
  rec.op = op;
  rec.dtype = Info<T>::name;
  rec.metric = "GB/s";
  rec.baseline = kRoofline;
  rec.target = p.cols >= 262144 ? "peak_fraction>=0.75" : "peak_fraction>=0.90";
  if (p.kind == Kind::gn)
    rec.shape = {{"n", p.n}, {"c", p.c}, {"hw", p.hw}, {"groups", p.groups}};
  else
    rec.shape = {{"rows", p.rows}, {"cols", p.cols}};
  const bool rms_like = p.kind == Kind::rms || p.kind == Kind::rms_add;
  const double stats_bytes = double(nr) * 4 * (rms_like ? 1 : 2);
  double bytes = 0;
  const double tensor = double(n) * es, param = double(np) * es;
  if (!p.backward) {
    bytes = tensor * (p.kind == Kind::rms_add ? 4 : 2) + param * (bias ? 2 : 1) + stats_bytes;
  } else {
    bytes = tensor * 3 + param * (bias ? 3 : 2) + stats_bytes;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s, %.0f MiB moved", label.c_str(), bytes / (1024.0 * 1024.0));
  rec.case_ = buf;

  Roofline roof(bytes);
  try {
    fwd();
    if (p.backward) bwd();
    TESSEL_BENCH_CUDA(cudaStreamSynchronize(s));
    Check cw, cb;
    const Check cy = check_case<T>(p, x.get(), r.get(), w.get(), bias ? b.get() : nullptr, dy.get(), y.get(), dw.get(),
                                   bias ? db.get() : nullptr, cw, cb);
    const double tol = Info<T>::tol;
    const bool ok = cy.ok(tol) && (!p.backward || (cw.ok(tol) && (!bias || cb.ok(tol))));
    rec.check = ok ? "OK" : "FAIL";
    std::snprintf(buf, sizeof buf, "max_err/max_ref out %.3g", cy.max_err / std::max(cy.max_ref, 1e-30));
    rec.check_detail = buf;
    if (p.backward) {
      std::snprintf(buf, sizeof buf, ", dw %.3g, db %.3g", cw.max_err / std::max(cw.max_ref, 1e-30),
                    bias ? cb.max_err / std::max(cb.max_ref, 1e-30) : 0.0);
      rec.check_detail += buf;
    }
    const MeasureOptions mo = ctx.measure_options();
    rec.ours_ms = ctx.timer().measure(p.backward ? std::function<void()>(bwd) : std::function<void()>(fwd), mo);
    rec.ours = gbps(bytes, rec.ours_ms);
  } catch (const std::exception& e) {
    rec.check = "ERROR";
    rec.check_detail = e.what();
    const cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) throw std::runtime_error(std::string("CUDA context lost: ") + cudaGetErrorString(ce));
  }
  rec.baseline_ms = ctx.timer().measure([&, s] { roof.run(s); }, ctx.measure_options());
  rec.baseline_value = gbps(bytes, rec.baseline_ms);
  ctx.add(std::move(rec));
}

void run_norms_suite(SuiteContext& ctx) {
  for (bool bwd : {false, true}) {
    norm_case<bf16>(ctx, {Kind::rms, bwd, 16384, 4096}, "16384x4096");
    if (!bwd) norm_case<bf16>(ctx, {Kind::rms_add, false, 16384, 4096}, "16384x4096 + residual (h, y written)");
    norm_case<bf16>(ctx, {Kind::ln, bwd, 16384, 4096}, "16384x4096, bias");
    Problem gn{Kind::gn, bwd, 32 * 32, 16 * 4096, 32, 512, 4096, 32};
    norm_case<bf16>(ctx, gn, "32x512x64x64, 32 groups");
    norm_case<bf16>(ctx, {Kind::rms, bwd, 256, 262144}, "256x262144 (long rows)");
    norm_case<bf16>(ctx, {Kind::ln, bwd, 256, 262144}, "256x262144 (long rows), bias");
    norm_case<float>(ctx, {Kind::rms, bwd, 16384, 4096}, "16384x4096");
  }
}

}  // namespace

TESSEL_BENCH_SUITE("norms",
                   "RMSNorm (+ fused residual add), LayerNorm, GroupNorm fwd/bwd vs the copy "
                   "roofline (cudaMemcpy of the same bytes)",
                   run_norms_suite);

}  // namespace tessel::bench
