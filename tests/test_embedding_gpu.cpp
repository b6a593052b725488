// GPU tests of embedding / embedding_backward: i32/i64 ids, f32/f16/bf16, D in {1, 7, 127,
// 4097, 4096}, duplicate ids (hot rows beyond the owner's sort capacity too), f32 dweight from
// 16-bit dout, deterministic mode bitwise reproducible, atomic mode, out-of-range ids (zero
// rows / ignored unchecked; tessel::Error with check_ids and nothing written).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ref/llm_ref.hpp"
#include "tessel/embedding.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

DeviceTensor upload_ids(DType idt, const std::vector<int64_t>& ids) {
  std::vector<uint8_t> b(ids.size() * dtype_size(idt));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (idt == DType::i32) reinterpret_cast<int32_t*>(b.data())[i] = static_cast<int32_t>(ids[i]);
    else reinterpret_cast<int64_t*>(b.data())[i] = ids[i];
  }
  DeviceTensor t = test::alloc(idt, {static_cast<int64_t>(ids.size())});
  test::upload_bytes(t, b);
  return t;
}

// Term scale of a scatter-add: Σ|dout| per (row, col).
std::vector<double> abs_scatter(const std::vector<int64_t>& ids, const std::vector<double>& g,
                                int64_t vocab, int64_t dim) {
  std::vector<double> a(g.size());
  for (size_t i = 0; i < g.size(); ++i) a[i] = std::fabs(g[i]);
  return ref::embedding_backward(ids, a, vocab, dim);
}

using Param = std::tuple<DType, int64_t, DType>;
class EmbeddingGpu : public test::GpuTest, public ::testing::WithParamInterface<Param> {};

TEST_P(EmbeddingGpu, ForwardBackward) {
  const auto [dt, dim, idt] = GetParam();
  const int64_t vocab = 300, n = std::max<int64_t>(3, std::min<int64_t>(2000, 400000 / dim));
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& v : ids) v = rng().integer(0, vocab - 1);
  ids[0] = ids[n - 1];  // a duplicate at least
  std::vector<double> wv = rng().uniform(static_cast<size_t>(vocab * dim), -2.0, 2.0);
  std::vector<double> gv = rng().uniform(static_cast<size_t>(n * dim), -1.0, 1.0);
  DeviceTensor it = upload_ids(idt, ids);
  DeviceTensor w = test::to_device(dt, {vocab, dim}, wv), g = test::to_device(dt, {n, dim}, gv);
  DeviceTensor out = test::alloc(dt, {n, dim});
  embedding(it.t, w.t, out.t, true, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(out), ref::embedding(ids, wv, vocab, dim),
                              test::Tolerance{0.0, 0.0}));  // a copy: exact
  const std::vector<double> rdw = ref::embedding_backward(ids, gv, vocab, dim);
  const std::vector<double> scale = abs_scatter(ids, gv, vocab, dim);
  for (DType wdt : {dt, DType::f32}) {
    SCOPED_TRACE(std::string("dweight ") + dtype_name(wdt));
    DeviceTensor dw1 = test::alloc(wdt, {vocab, dim}), dw2 = test::alloc(wdt, {vocab, dim});
    embedding_backward(it.t, g.t, dw1.t, EmbeddingGradMode::deterministic, false, stream());
    embedding_backward(it.t, g.t, dw2.t, EmbeddingGradMode::deterministic, true, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(dw1), rdw, wdt, scale));
    EXPECT_TRUE(test::bit_exact(test::download_bytes(dw2), test::download_bytes(dw1), dtype_size(wdt)));
    if (wdt == DType::f32) {
      DeviceTensor dw3 = test::alloc(wdt, {vocab, dim});
      embedding_backward(it.t, g.t, dw3.t, EmbeddingGradMode::atomic, false, stream());
      sync();
      EXPECT_TRUE(test::all_close(test::download_values(dw3), rdw, wdt, scale));
    }
  }
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_d" + std::to_string(std::get<1>(info.param)) +
         "_" + dtype_name(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingGpu,
                         ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes),
                                            ::testing::Values(1, 7, 12, 127, 4096, 4097),
                                            ::testing::Values(DType::i32, DType::i64)),
                         name);

class EmbeddingSpecialGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {};

// A hot id (3000 occurrences > the owner's 1024 sort capacity) and 16-bit atomic with unique ids.
TEST_P(EmbeddingSpecialGpu, HotRowAndAtomic16) {
  const DType dt = GetParam();
  const int64_t vocab = 5000, dim = 136, n = 4000;
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = i % 4 == 3 ? rng().integer(0, vocab - 1) : 42;
  std::vector<double> gv = rng().uniform(static_cast<size_t>(n * dim), -1.0, 1.0);
  DeviceTensor it = upload_ids(DType::i64, ids), g = test::to_device(dt, {n, dim}, gv);
  DeviceTensor dw = test::alloc(DType::f32, {vocab, dim});
  embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::deterministic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(dw), ref::embedding_backward(ids, gv, vocab, dim),
                              DType::f32, abs_scatter(ids, gv, vocab, dim)));
  // Unique ids: a 16-bit atomic dweight is exact (one addition to zero per row).
  std::vector<int64_t> uniq(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) uniq[i] = (i * 7) % vocab;
  DeviceTensor iu = upload_ids(DType::i32, uniq), dw16 = test::alloc(dt, {vocab, dim});
  embedding_backward(iu.t, g.t, dw16.t, EmbeddingGradMode::atomic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(dw16), ref::embedding_backward(uniq, gv, vocab, dim), dt));
}

TEST_P(EmbeddingSpecialGpu, OutOfRangeIds) {
  const DType dt = GetParam();
  const int64_t vocab = 50, dim = 64, n = 100;
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& v : ids) v = rng().integer(0, vocab - 1);
  ids[37] = vocab;  // bad
  ids[80] = -3;     // bad
  std::vector<double> wv = rng().uniform(static_cast<size_t>(vocab * dim), -2.0, 2.0);
  std::vector<double> gv = rng().uniform(static_cast<size_t>(n * dim), -1.0, 1.0);
  DeviceTensor it = upload_ids(DType::i64, ids), w = test::to_device(dt, {vocab, dim}, wv),
               g = test::to_device(dt, {n, dim}, gv);
  DeviceTensor out = test::alloc(dt, {n, dim}), dw = test::alloc(DType::f32, {vocab, dim});
  try {
    embedding(it.t, w.t, out.t, true, stream());
    ADD_FAILURE() << "no error for out-of-range ids";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("id 50 at flat position 37"), std::string::npos) << e.what();
  }
  EXPECT_THROW(embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::deterministic, true, stream()), Error);
  sync();
  for (uint8_t b : test::download_bytes(out)) ASSERT_EQ(b, 0xFF);  // nothing written
  for (uint8_t b : test::download_bytes(dw)) ASSERT_EQ(b, 0xFF);
  // Unchecked: zero rows, ignored tokens.
  embedding(it.t, w.t, out.t, false, stream());
  embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::deterministic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(out), ref::embedding(ids, wv, vocab, dim), dt));
  EXPECT_TRUE(test::all_close(test::download_values(dw), ref::embedding_backward(ids, gv, vocab, dim),
                              DType::f32, abs_scatter(ids, gv, vocab, dim)));
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingSpecialGpu, ::testing::ValuesIn(test::kFloatDTypes),
                         test::dtype_param_name);

}  // namespace
}  // namespace tessel
