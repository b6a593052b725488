// tessel::gemm: float64 reference on small ragged shapes (both B layouts, bf16/f16 in,
// f32/f16/bf16 out, alpha/beta with C, pitched operands, a multi-tile shape per tile
// config) and argument validation (no GPU needed).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/gemm.hpp"
#include "test_util.hpp"

namespace tessel::test {
namespace {

// f32 output: fp32 accumulation in a different order than the float64 reference
// (K up to 520 terms), so a little wider than the element-wise f32 row of the table.
Tolerance gemm_tolerance(DType out) {
  return out == DType::f32 ? Tolerance{5e-5, 1e-4} : tolerance(out);
}

struct Case {
  int64_t m, n, k;
  DType in, out;
  BLayout layout;
  float alpha = 1.f, beta = 0.f;
  int64_t pitch_pad = 0;  // extra elements per row of a and b (multiple of 8)
  bool in_place_c = false;
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " in=" + dtype_name(c.in) + " out=" + dtype_name(c.out) +
         (c.layout == BLayout::nk ? " B(N,K)" : " B(K,N)") + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " pad=" + std::to_string(c.pitch_pad) +
         (c.in_place_c ? " c=d" : "");
}

class GemmGpu : public GpuTest {
 protected:
  void check(const Case& c) {
    SCOPED_TRACE(describe(c));
    const bool kn = c.layout == BLayout::kn;
    const int64_t b_rows = kn ? c.k : c.n, b_cols = kn ? c.n : c.k;
    std::vector<double> a = rng().uniform(static_cast<size_t>(c.m * c.k), -1, 1);
    std::vector<double> b = rng().uniform(static_cast<size_t>(b_rows * b_cols), -1, 1);
    DeviceTensor da = alloc_pitched(c.in, {c.m, c.k}, c.k + c.pitch_pad);
    DeviceTensor db = alloc_pitched(c.in, {b_rows, b_cols}, b_cols + c.pitch_pad);
    upload_values(da, a);
    upload_values(db, b);
    DeviceTensor dd = alloc(c.out, {c.m, c.n});
    std::vector<double> cv;
    DeviceTensor dc;
    GemmOptions opt;
    opt.alpha = c.alpha;
    opt.beta = c.beta;
    opt.b_layout = c.layout;
    if (c.beta != 0.f) {
      cv = rng().uniform(static_cast<size_t>(c.m * c.n), -1, 1);
      if (c.in_place_c) {
        upload_values(dd, cv);
        opt.c = &dd.t;
      } else {
        dc = alloc(c.out, {c.m, c.n});
        upload_values(dc, cv);
        opt.c = &dc.t;
      }
    }
    gemm(da.t, db.t, dd.t, stream(), opt);
    sync();
    std::vector<double> ref(static_cast<size_t>(c.m * c.n));
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0.0;
        for (int64_t p = 0; p < c.k; ++p)
          s += a[i * c.k + p] * (kn ? b[p * c.n + j] : b[j * c.k + p]);
        s *= c.alpha;
        if (c.beta != 0.f) s += double{c.beta} * cv[i * c.n + j];
        ref[i * c.n + j] = s;
      }
    EXPECT_TRUE(all_close(download_values(dd), ref, gemm_tolerance(c.out)));
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
}

TEST_F(GemmGpu, ZeroK) {
  Case c{5, 16, 0, DType::bf16, DType::f32, BLayout::nk, 1.f, 2.f};
  check(c);
}

// ---- validation (CPU only: errors are raised before any device access) -----------------
Tensor fake(DType dt, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(reinterpret_cast<void*>(uintptr_t{1} << 20), dt, shape);
}

void expect_error(const Tensor& a, const Tensor& b, Tensor d, const GemmOptions& opt,
                  const std::string& arg, const std::string& needle) {
  try {
    gemm(a, b, d, nullptr, opt);
    ADD_FAILURE() << "expected tessel::Error mentioning " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gemm"), std::string::npos) << msg;
    EXPECT_NE(msg.find(arg), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(GemmErrors, RejectsBadArguments) {
  const GemmOptions nk{};
  GemmOptions kn;
  kn.b_layout = BLayout::kn;
  // N or K not a multiple of 8
  expect_error(fake(DType::bf16, {16, 12}), fake(DType::bf16, {16, 12}), fake(DType::bf16, {16, 16}),
               nk, "a", "multiple of 8");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {12, 16}), fake(DType::bf16, {16, 12}),
               nk, "b", "multiple of 8");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 20}), fake(DType::bf16, {16, 20}),
               kn, "b", "multiple of 8");
  // dtype mismatch / unsupported
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::f16, {16, 16}), fake(DType::bf16, {16, 16}),
               nk, "b", "bf16");
  expect_error(fake(DType::f32, {16, 16}), fake(DType::f32, {16, 16}), fake(DType::f32, {16, 16}),
               nk, "a", "f32");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}), fake(DType::i32, {16, 16}),
               nk, "d", "i32");
  // shape mismatch
  expect_error(fake(DType::bf16, {16, 32}), fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               nk, "b", "K = 32");
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {24, 16}), fake(DType::bf16, {16, 16}),
               nk, "d", "(16, 24)");
  // beta without c, c of the wrong dtype
  GemmOptions beta;
  beta.beta = 1.f;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               beta, "c", "beta");
  Tensor c32 = fake(DType::f32, {16, 16});
  beta.c = &c32;
  expect_error(fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               beta, "c", "f32");
  // rank
  expect_error(fake(DType::bf16, {2, 16, 16}), fake(DType::bf16, {16, 16}), fake(DType::bf16, {16, 16}),
               nk, "a", "3");
}

TEST(GemmErrors, EmptyIsNoOp) {
  Tensor a = Tensor::contiguous(nullptr, DType::bf16, {0, 16});
  Tensor b = Tensor::contiguous(nullptr, DType::bf16, {16, 16});
  Tensor d = Tensor::contiguous(nullptr, DType::bf16, {0, 16});
  EXPECT_NO_THROW(gemm(a, b, d, nullptr));
}

}  // namespace
}  // namespace tessel::test
