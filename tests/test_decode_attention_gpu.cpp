// GPU tests of decode attention (contiguous and paged KV cache), the KV append and MLA decode
// against the float64 references of src/ref/decode_attention_ref.cpp: ragged lengths per batch
// (1, 17, 1000, 4097, ...), GQA ratios 1/4/8, page sizes 16/48/64/256, Sq = 1..4 new tokens,
// forced split counts (the combine path), soft-cap, f16/bf16; paged == contiguous bit for bit;
// out-of-range block-table entries and lengths: a clear error (check_inputs) or NaN rows of only
// the affected sequence, never a crash.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/attention_decode/mla_config.hpp"
#include "ref/decode_attention_ref.hpp"
#include "tessel/decode_attention.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

using test::upload_i32;

// A paged layout for `lens` with a shuffled page order; entries past the used pages are -1
// (never read). Returns block_table (B x max_pages) and sets num_pages.
std::vector<int32_t> make_block_table(test::Rng& rng, const std::vector<int64_t>& lens, int64_t ps,
                                      int64_t max_pages, int64_t& num_pages) {
  const int64_t B = static_cast<int64_t>(lens.size());
  int64_t used = 0;
  for (int64_t l : lens) used += (l + ps - 1) / ps;
  num_pages = used + 3;  // a few pages nobody uses
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.engine());
  std::vector<int32_t> bt(static_cast<size_t>(B * max_pages), -1);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < (lens[static_cast<size_t>(b)] + ps - 1) / ps; ++j)
      bt[b * max_pages + j] = perm[next++];
  return bt;
}

struct Case {
  std::vector<int64_t> lens;
  int64_t sq, hq, hkv, d, page;  // page 0: contiguous
  double softcap = 0.0;
  int splits = 0;
  int64_t max_seqlen = 0;  // DecodeParams::max_seqlen (a planning hint; may be wrong)
};

// q/caches drawn here; out, lse downloaded and compared with the reference.
struct Run {
  std::vector<double> out, lse, ref_out, ref_lse;
};

class DecodeAttentionGpu : public test::GpuTest,
                           public ::testing::WithParamInterface<std::tuple<DType, int>> {
 protected:
  void check_case(DType dt, const Case& c) {
    const int64_t B = static_cast<int64_t>(c.lens.size()), D = c.d;
    const int64_t maxlen = *std::max_element(c.lens.begin(), c.lens.end());
    std::vector<double> qv = rng().uniform(static_cast<size_t>(B * c.sq * c.hq * D), -2.0, 2.0);
    DeviceTensor q = test::to_device(dt, {B, c.sq, c.hq, D}, qv);
    std::vector<int32_t> lens32(c.lens.begin(), c.lens.end());
    DeviceTensor sl = upload_i32({B}, lens32);
    DeviceTensor out = test::alloc(dt, {B, c.sq, c.hq, D});
    DeviceTensor lse = test::alloc(DType::f32, {B, c.sq, c.hq});
    DecodeParams prm;
    prm.softcap = c.softcap;
    prm.num_splits = c.splits;
    prm.max_seqlen = c.max_seqlen;
    std::vector<double> kref, vref;
    int64_t smax = 0;
    DeviceTensor kc, vc, bt;
    if (c.page == 0) {
      smax = maxlen + 5;  // capacity beyond the longest sequence
      kref = rng().uniform(static_cast<size_t>(B * smax * c.hkv * D), -1.0, 1.0);
      vref = rng().uniform(static_cast<size_t>(B * smax * c.hkv * D), -1.0, 1.0);
      kc = test::to_device(dt, {B, smax, c.hkv, D}, kref);
      vc = test::to_device(dt, {B, smax, c.hkv, D}, vref);
    } else {
      const int64_t max_pages = (maxlen + c.page - 1) / c.page + 1;
      int64_t np = 0;
      const std::vector<int32_t> table = make_block_table(rng(), c.lens, c.page, max_pages, np);
      bt = upload_i32({B, max_pages}, table);
      std::vector<double> kp =
          rng().uniform(static_cast<size_t>(np * c.page * c.hkv * D), -1.0, 1.0);
      std::vector<double> vp =
          rng().uniform(static_cast<size_t>(np * c.page * c.hkv * D), -1.0, 1.0);
      kc = test::to_device(dt, {np, c.page, c.hkv, D}, kp);
      vc = test::to_device(dt, {np, c.page, c.hkv, D}, vp);
      std::vector<int64_t> t64(table.begin(), table.end());
      kref = ref::gather_pages(kp, np, c.page, c.hkv * D, t64, B, max_pages);
      vref = ref::gather_pages(vp, np, c.page, c.hkv * D, t64, B, max_pages);
      smax = max_pages * c.page;
      prm.block_table = &bt.t;
    }
    decode_attention(q.t, kc.t, vc.t, sl.t, out.t, &lse.t, prm, stream());
    sync();
    ref::DecodeRefConfig rc;
    rc.batch = B;
    rc.sq = c.sq;
    rc.hq = c.hq;
    rc.hkv = c.hkv;
    rc.dqk = rc.dv = D;
    rc.smax = smax;
    rc.scale = 1.0 / std::sqrt(static_cast<double>(D));
    rc.softcap = c.softcap;
    std::vector<double> ro, rl;
    ref::decode_attention(qv, kref, vref, c.lens, rc, ro, rl);
    EXPECT_TRUE(test::all_close(test::download_values(out), ro, dt));
    EXPECT_TRUE(test::all_close(test::download_values(lse), rl, test::Tolerance{2e-5, 1e-4}));
  }
};

// 64 ragged sequences (4..303 tokens, >= Sq): with 8 KV heads and forced splits the grid spans
// several waves, so the splits are merged by the separate combine launch (one-wave grids merge
// inside the decode kernel).
std::vector<int64_t> many_lens() {
  std::vector<int64_t> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = 4 + static_cast<int64_t>(i * 37 % 300);
  return l;
}

// Caches stay near 1 M elements: the 4097-token sequences use few KV heads.
const Case kCases[] = {
    {{1, 17, 1000, 4097}, 1, 2, 2, 128, 16},           // GQA 1, page 16
    {{1, 17, 1000, 4097}, 1, 8, 2, 128, 64},           // GQA 4, page 64
    {{4097, 17, 1000, 5}, 4, 16, 2, 128, 256},         // GQA 8, Sq 4: 32 rows, page 256
    {{1000, 17, 33}, 3, 8, 1, 64, 0},                  // GQA 8, D 64, contiguous
    {{17, 1000, 300}, 2, 4, 1, 256, 0},                // D 256, contiguous
    {{1000, 17}, 1, 16, 4, 128, 48, 30.0, 3},          // soft-cap, page 48, 3 splits
    {{4097, 4, 1000, 17}, 4, 16, 2, 128, 16, 0.0, 7},  // 32 rows, 7 splits (some empty)
    {{700, 4, 129}, 4, 64, 4, 128, 0, 0.0, 0},         // 64 rows: 2 row blocks
    {{2000, 3}, 2, 12, 4, 64, 64, 0.0, 5},             // GQA 3, D 64, splits
    {{4097}, 1, 1, 1, 256, 256, 0.0, 0},               // B = 1: heuristic splits
    // max_seqlen hints: exact (a 1B decode step: one 64-token tile per split), far too small
    // and far too large (clamped to the capacity) - the result must not depend on it.
    {{576}, 1, 32, 8, 64, 64, 0.0, 0, 576},
    {{4097, 17, 1000, 5}, 1, 8, 2, 128, 16, 0.0, 0, 100},
    {{17, 300}, 2, 8, 8, 128, 0, 0.0, 0, int64_t{1} << 40},
    {many_lens(), 1, 32, 8, 64, 16, 0.0, 4},  // multi-wave grid: combine launch
    {many_lens(), 2, 16, 8, 64, 0, 0.0, 0},   // heuristic splits, 64 sequences
};

TEST_P(DecodeAttentionGpu, MatchesReference) {
  const auto [dt, ci] = GetParam();
  check_case(dt, kCases[ci]);
}

INSTANTIATE_TEST_SUITE_P(All, DecodeAttentionGpu,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Range(0,
                                                             static_cast<int>(std::size(kCases)))),
                         test::dtype_case_name);

// The same cache laid out contiguously and in shuffled pages gives the same bits (same splits).
class DecodeAttentionPagedGpu : public test::GpuTest {};

TEST_F(DecodeAttentionPagedGpu, PagedEqualsContiguous) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {2100, 2, 17, 1000};  // >= Sq
  const int64_t B = 4, sq = 2, hq = 4, hkv = 1, D = 128;
  for (int64_t ps : {16, 64, 256}) {
    SCOPED_TRACE("page_size " + std::to_string(ps));
    const int64_t max_pages = (2100 + ps - 1) / ps, smax = max_pages * ps;
    int64_t np = 0;
    const std::vector<int32_t> table = make_block_table(rng(), lens, ps, max_pages, np);
    std::vector<double> kp = rng().uniform(static_cast<size_t>(np * ps * hkv * D), -1.0, 1.0);
    std::vector<double> vp = rng().uniform(static_cast<size_t>(np * ps * hkv * D), -1.0, 1.0);
    std::vector<int64_t> t64(table.begin(), table.end());
    std::vector<double> kg = ref::gather_pages(kp, np, ps, hkv * D, t64, B, max_pages);
    std::vector<double> vg = ref::gather_pages(vp, np, ps, hkv * D, t64, B, max_pages);
    DeviceTensor kpd = test::to_device(dt, {np, ps, hkv, D}, kp),
                 vpd = test::to_device(dt, {np, ps, hkv, D}, vp);
    DeviceTensor kcd = test::to_device(dt, {B, smax, hkv, D}, kg),
                 vcd = test::to_device(dt, {B, smax, hkv, D}, vg);
    std::vector<double> qv = rng().uniform(static_cast<size_t>(B * sq * hq * D), -2.0, 2.0);
    DeviceTensor q = test::to_device(dt, {B, sq, hq, D}, qv);
    DeviceTensor sl = upload_i32({B}, std::vector<int32_t>(lens.begin(), lens.end()));
    DeviceTensor bt = upload_i32({B, max_pages}, table);
    for (int splits : {1, 4}) {
      DeviceTensor o1 = test::alloc(dt, {B, sq, hq, D}), o2 = test::alloc(dt, {B, sq, hq, D});
      DecodeParams pc, pp;
      pc.num_splits = pp.num_splits = splits;
      pp.block_table = &bt.t;
      decode_attention(q.t, kcd.t, vcd.t, sl.t, o1.t, nullptr, pc, stream());
      decode_attention(q.t, kpd.t, vpd.t, sl.t, o2.t, nullptr, pp, stream());
      sync();
      const std::vector<uint8_t> b1 = test::download_bytes(o1), b2 = test::download_bytes(o2);
      EXPECT_TRUE(b1 == b2) << "splits " << splits;
      const std::vector<double> v1 = test::download_values(o1);
      EXPECT_TRUE(std::none_of(v1.begin(), v1.end(), [](double x) { return std::isnan(x); }));
    }
  }
}

// A paged cache stored head-major ([page][kv head][token][dim], viewed through strides as
// (page, token, kv head, dim)) gives the same bits as the token-major one: the TMA maps of whole
// rows (pages of 16: 16-token sub-blocks; 64: whole tiles) then have a head stride above the
// token stride.
TEST_F(DecodeAttentionPagedGpu, HeadMajorPagesEqualTokenMajor) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {1500, 3, 700};
  const int64_t B = 3, sq = 1, hq = 8, hkv = 2, D = 128;
  for (int64_t ps : {16, 64}) {
    SCOPED_TRACE("page_size " + std::to_string(ps));
    const int64_t max_pages = (1500 + ps - 1) / ps;
    int64_t np = 0;
    const std::vector<int32_t> table = make_block_table(rng(), lens, ps, max_pages, np);
    const size_t n = static_cast<size_t>(np * ps * hkv * D);
    std::vector<double> kp = rng().uniform(n, -1.0, 1.0), vp = rng().uniform(n, -1.0, 1.0);
    // (page, token, head, dim) -> (page, head, token, dim)
    auto head_major = [&](const std::vector<double>& a) {
      std::vector<double> o(a.size());
      for (int64_t p = 0; p < np; ++p)
        for (int64_t t = 0; t < ps; ++t)
          for (int64_t h = 0; h < hkv; ++h)
            for (int64_t d = 0; d < D; ++d)
              o[static_cast<size_t>(((p * hkv + h) * ps + t) * D + d)] =
                  a[static_cast<size_t>(((p * ps + t) * hkv + h) * D + d)];
      return o;
    };
    std::vector<double> khv = head_major(kp), vhv = head_major(vp);
    DeviceTensor kt = test::to_device(dt, {np, ps, hkv, D}, kp);
    DeviceTensor vt = test::to_device(dt, {np, ps, hkv, D}, vp);
    DeviceTensor kh = test::to_device(dt, {np, hkv, ps, D}, khv);
    DeviceTensor vh = test::to_device(dt, {np, hkv, ps, D}, vhv);
    auto view = [&](const DeviceTensor& d) {
      Tensor t = d.t;
      t.shape[1] = ps, t.shape[2] = hkv;
      t.strides[0] = hkv * ps * D, t.strides[1] = D, t.strides[2] = ps * D, t.strides[3] = 1;
      return t;
    };
    const Tensor kv = view(kh), vv = view(vh);
    std::vector<double> qv = rng().uniform(static_cast<size_t>(B * sq * hq * D), -2.0, 2.0);
    DeviceTensor q = test::to_device(dt, {B, sq, hq, D}, qv);
    DeviceTensor sl = upload_i32({B}, std::vector<int32_t>(lens.begin(), lens.end()));
    DeviceTensor bt = upload_i32({B, max_pages}, table);
    DeviceTensor o1 = test::alloc(dt, {B, sq, hq, D}), o2 = test::alloc(dt, {B, sq, hq, D});
    DecodeParams p;
    p.block_table = &bt.t;
    p.num_splits = 3;
    decode_attention(q.t, kt.t, vt.t, sl.t, o1.t, nullptr, p, stream());
    decode_attention(q.t, kv, vv, sl.t, o2.t, nullptr, p, stream());
    sync();
    EXPECT_TRUE(test::download_bytes(o1) == test::download_bytes(o2));
    const std::vector<double> v1 = test::download_values(o1);
    EXPECT_TRUE(std::none_of(v1.begin(), v1.end(), [](double x) { return std::isnan(x); }));
  }
}

// q/out as strided views (a slice of a fused qkv buffer, a padded output), non-power-of-two
// page size.
TEST_F(DecodeAttentionPagedGpu, StridedQAndOut) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {300, 45};
  const int64_t B = 2, sq = 2, hq = 8, hkv = 2, D = 64, ps = 24;
  const int64_t max_pages = (300 + ps - 1) / ps;
  int64_t np = 0;
  const std::vector<int32_t> table = make_block_table(rng(), lens, ps, max_pages, np);
  std::vector<double> kp = rng().uniform(static_cast<size_t>(np * ps * hkv * D), -1.0, 1.0);
  std::vector<double> vp = rng().uniform(static_cast<size_t>(np * ps * hkv * D), -1.0, 1.0);
  DeviceTensor kd = test::to_device(dt, {np, ps, hkv, D}, kp),
               vd = test::to_device(dt, {np, ps, hkv, D}, vp);
  const int64_t tok = (hq + 2 * hkv) * D;  // fused qkv row
  DeviceTensor q = test::alloc_view(dt, {B, sq, hq, D}, {sq * tok, tok, D, 1});
  std::vector<double> qv = rng().uniform(static_cast<size_t>(B * sq * hq * D), -2.0, 2.0);
  test::upload_values(q, qv);
  DeviceTensor out =
      test::alloc_view(dt, {B, sq, hq, D}, {sq * hq * (D + 8), hq * (D + 8), D + 8, 1});
  DeviceTensor sl = upload_i32({B}, {300, 45});
  DeviceTensor bt = upload_i32({B, max_pages}, table);
  DecodeParams p;
  p.block_table = &bt.t;
  decode_attention(q.t, kd.t, vd.t, sl.t, out.t, nullptr, p, stream());
  sync();
  std::vector<int64_t> t64(table.begin(), table.end());
  ref::DecodeRefConfig rc;
  rc.batch = B;
  rc.sq = sq;
  rc.hq = hq;
  rc.hkv = hkv;
  rc.dqk = rc.dv = D;
  rc.smax = max_pages * ps;
  rc.scale = 1.0 / 8.0;
  std::vector<double> ro, rl;
  ref::decode_attention(qv, ref::gather_pages(kp, np, ps, hkv * D, t64, B, max_pages),
                        ref::gather_pages(vp, np, ps, hkv * D, t64, B, max_pages), lens, rc, ro,
                        rl);
  EXPECT_TRUE(test::all_close(test::download_values(out), ro, dt));
  EXPECT_TRUE(test::outside_untouched(out));
}

// Out-of-range block-table entry / length: check_inputs throws naming it (outputs untouched);
// without it, only the bad sequence's rows are NaN and nothing crashes.
TEST_F(DecodeAttentionPagedGpu, BadBlockTableAndLengths) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {100, 50};
  const int64_t B = 2, sq = 1, hq = 8, hkv = 2, D = 128, ps = 16, max_pages = 8;
  int64_t np = 0;
  std::vector<int32_t> table = make_block_table(rng(), lens, ps, max_pages, np);
  std::vector<double> kp = rng().uniform(static_cast<size_t>(np * ps * hkv * D), -1.0, 1.0);
  DeviceTensor kd = test::to_device(dt, {np, ps, hkv, D}, kp),
               vd = test::to_device(dt, {np, ps, hkv, D}, kp);
  std::vector<double> qv = rng().uniform(static_cast<size_t>(B * sq * hq * D), -1.0, 1.0);
  DeviceTensor q = test::to_device(dt, {B, sq, hq, D}, qv);
  table[1 * max_pages + 2] = static_cast<int32_t>(np + 1000);  // sequence 1, page 2 (used)
  DeviceTensor bt = upload_i32({B, max_pages}, table);
  DeviceTensor sl = upload_i32({B}, {100, 50});
  for (int splits : {1, 3}) {
    DeviceTensor out = test::alloc(dt, {B, sq, hq, D});
    DecodeParams p;
    p.block_table = &bt.t;
    p.num_splits = splits;
    p.check_inputs = true;
    try {
      decode_attention(q.t, kd.t, vd.t, sl.t, out.t, nullptr, p, stream());
      ADD_FAILURE() << "no error for an out-of-range page";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(msg.find("'block_table'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("block_table[1, 2]"), std::string::npos) << msg;
    }
    EXPECT_TRUE(test::outside_untouched(out, 0xFF) &&
                test::download_bytes(out) == std::vector<uint8_t>(out.buf.bytes(), 0xFF));
    p.check_inputs = false;
    decode_attention(q.t, kd.t, vd.t, sl.t, out.t, nullptr, p, stream());
    sync();
    const std::vector<double> o = test::download_values(out);
    const size_t row = static_cast<size_t>(sq * hq * D);
    EXPECT_TRUE(std::none_of(o.begin(), o.begin() + row, [](double x) { return std::isnan(x); }));
    EXPECT_TRUE(std::all_of(o.begin() + row, o.end(), [](double x) { return std::isnan(x); }));
  }
  // A length beyond the capacity (8 pages of 16 = 128 tokens).
  DeviceTensor sl2 = upload_i32({B}, {129, 50});
  std::vector<int32_t> good = make_block_table(rng(), {128, 50}, ps, max_pages, np);
  DeviceTensor bt2 = upload_i32({B, max_pages}, good);
  DeviceTensor kd2 = test::alloc(dt, {np, ps, hkv, D});
  TESSEL_TEST_CUDA(cudaMemset(kd2.buf.data(), 0, kd2.buf.bytes()));
  DeviceTensor out = test::alloc(dt, {B, sq, hq, D});
  DecodeParams p;
  p.block_table = &bt2.t;
  p.check_inputs = true;
  try {
    decode_attention(q.t, kd2.t, kd2.t, sl2.t, out.t, nullptr, p, stream());
    ADD_FAILURE() << "no error for a length beyond the capacity";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'seqlens'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("length 129 for sequence 0"), std::string::npos) << msg;
  }
  p.check_inputs = false;
  decode_attention(q.t, kd2.t, kd2.t, sl2.t, out.t, nullptr, p, stream());
  sync();
  const std::vector<double> o = test::download_values(out);
  const size_t row = static_cast<size_t>(sq * hq * D);
  EXPECT_TRUE(std::all_of(o.begin(), o.begin() + row, [](double x) { return std::isnan(x); }));
  EXPECT_TRUE(std::none_of(o.begin() + row, o.end(), [](double x) { return std::isnan(x); }));
}

// ---- KV append -------------------------------------------------------------------------------
class DecodeAppendKvGpu : public test::GpuTest {};

TEST_F(DecodeAppendKvGpu, ContiguousAndPaged) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {1, 17, 1000, 4};  // after the append
  const int64_t B = 4, sq = 1, hkv = 2, D = 136;
  for (int64_t sqn : {int64_t{1}, int64_t{3}}) {
    std::vector<int64_t> lv = lens;
    for (auto& l : lv) l = std::max(l, sqn);
    std::vector<int32_t> l32(lv.begin(), lv.end());
    DeviceTensor sl = upload_i32({B}, l32);
    std::vector<double> kn = rng().uniform(static_cast<size_t>(B * sqn * hkv * D), -1.0, 1.0);
    std::vector<double> vn = rng().uniform(static_cast<size_t>(B * sqn * hkv * D), -1.0, 1.0);
    DeviceTensor kt = test::to_device(dt, {B, sqn, hkv, D}, kn),
                 vt = test::to_device(dt, {B, sqn, hkv, D}, vn);
    // contiguous
    {
      const int64_t smax = 1003;
      std::vector<double> kc = rng().uniform(static_cast<size_t>(B * smax * hkv * D), -1.0, 1.0),
                          vc = kc;
      DeviceTensor kd = test::to_device(dt, {B, smax, hkv, D}, kc),
                   vd = test::to_device(dt, {B, smax, hkv, D}, vc);
      append_kv(kt.t, vt.t, kd.t, vd.t, nullptr, sl.t, false, stream());
      sync();
      ref::append_kv(kn, kc, lv, B, sqn, smax, hkv * D);
      ref::append_kv(vn, vc, lv, B, sqn, smax, hkv * D);
      EXPECT_TRUE(test::download_values(kd) == kc);
      EXPECT_TRUE(test::download_values(vd) == vc);
    }
    // paged (page 16), through the gathered view
    {
      const int64_t ps = 16, max_pages = 64;
      int64_t np = 0;
      const std::vector<int32_t> table = make_block_table(rng(), lv, ps, max_pages, np);
      DeviceTensor bt = upload_i32({B, max_pages}, table);
      std::vector<double> kp = rng().uniform(static_cast<size_t>(np * ps * hkv * D), -1.0, 1.0),
                          vp = kp;
      DeviceTensor kd = test::to_device(dt, {np, ps, hkv, D}, kp),
                   vd = test::to_device(dt, {np, ps, hkv, D}, vp);
      append_kv(kt.t, vt.t, kd.t, vd.t, &bt.t, sl.t, true, stream());
      sync();
      std::vector<int64_t> t64(table.begin(), table.end());
      std::vector<double> kg = ref::gather_pages(kp, np, ps, hkv * D, t64, B, max_pages);
      std::vector<double> vg = ref::gather_pages(vp, np, ps, hkv * D, t64, B, max_pages);
      ref::append_kv(kn, kg, lv, B, sqn, max_pages * ps, hkv * D);
      ref::append_kv(vn, vg, lv, B, sqn, max_pages * ps, hkv * D);
      EXPECT_TRUE(
          ref::gather_pages(test::download_values(kd), np, ps, hkv * D, t64, B, max_pages) == kg);
      EXPECT_TRUE(
          ref::gather_pages(test::download_values(vd), np, ps, hkv * D, t64, B, max_pages) == vg);
    }
  }
  (void)sq;
}

TEST_F(DecodeAppendKvGpu, BadPageThrowsAndWritesNothing) {
  const DType dt = DType::f16;
  const int64_t B = 2, sq = 1, hkv = 1, D = 64, ps = 16, max_pages = 4, np = 8;
  std::vector<double> kn = rng().uniform(static_cast<size_t>(B * sq * hkv * D), -1.0, 1.0);
  DeviceTensor kt = test::to_device(dt, {B, sq, hkv, D}, kn),
               vt = test::to_device(dt, {B, sq, hkv, D}, kn);
  DeviceTensor kd = test::alloc(dt, {np, ps, hkv, D}), vd = test::alloc(dt, {np, ps, hkv, D});
  DeviceTensor bt = upload_i32({B, max_pages}, {0, 1, 2, 3, 4, -5, 6, 7});
  DeviceTensor sl = upload_i32({B}, {10, 30});
  try {
    append_kv(kt.t, vt.t, kd.t, vd.t, &bt.t, sl.t, true, stream());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_table[1, 1]"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(test::download_bytes(kd) == std::vector<uint8_t>(kd.buf.bytes(), 0xFF));
  append_kv(kt.t, vt.t, kd.t, vd.t, &bt.t, sl.t, false, stream());  // skips the bad row
  sync();
  const std::vector<uint8_t> img = test::download_bytes(kd);
  const size_t row = static_cast<size_t>(D * 2);
  // sequence 0, position 9 -> page 0, slot 9 written; everything else still poisoned
  size_t written = 0;
  for (size_t i = 0; i < img.size(); ++i) written += img[i] != 0xFF;
  EXPECT_GT(written, row / 2);
  EXPECT_LE(written, row);
  EXPECT_TRUE(std::all_of(img.begin(), img.begin() + 9 * row, [](uint8_t x) { return x == 0xFF; }));
}

// ---- MLA decode
// ----------------------------------------------------------------------------------
struct MlaCase {
  std::vector<int64_t> lens;
  int64_t sq, heads, page;  // page 0: contiguous
  int splits;
};

// A latent cache and its call, for one layout: contiguous (NaN past every length) or paged.
struct MlaSetup {
  DeviceTensor cache, table;
  std::vector<double> gathered;  // (B, smax, 576): what the reference reads
  int64_t smax = 0;
};

class MlaGpuTest : public test::GpuTest {
 protected:
  // A contiguous cache of `rows` (B, smax, 576).
  MlaSetup contiguous(DType dt, const std::vector<int64_t>& lens, std::vector<double> rows,
                      int64_t smax) {
    MlaSetup m;
    m.smax = smax;
    m.cache = test::to_device(dt, {static_cast<int64_t>(lens.size()), smax, 576}, rows);
    m.gathered = std::move(rows);  // rounded to dt by to_device
    // NaN past each sequence's end: a kernel must not let 0 * NaN reach the output.
    for (size_t b = 0; b < lens.size(); ++b)
      EXPECT_EQ(cudaMemset(static_cast<char*>(m.cache.t.data) +
                               (static_cast<int64_t>(b) * smax + lens[b]) * 576 * 2,
                           0xFF, static_cast<size_t>((smax - lens[b]) * 576 * 2)),
                cudaSuccess);
    return m;
  }
  // A paged cache of random rows (pages of `page` tokens in shuffled order).
  MlaSetup paged(DType dt, const std::vector<int64_t>& lens, int64_t page) {
    MlaSetup m;
    const int64_t B = static_cast<int64_t>(lens.size());
    const int64_t max_pages = (*std::max_element(lens.begin(), lens.end()) + page - 1) / page;
    int64_t np = 0;
    const std::vector<int32_t> table = make_block_table(rng(), lens, page, max_pages, np);
    m.table = upload_i32({B, max_pages}, table);
    std::vector<double> pages = rng().uniform(static_cast<size_t>(np * page * 576), -1.0, 1.0);
    m.cache = test::to_device(dt, {np, page, 576}, pages);
    m.gathered = ref::gather_pages(pages, np, page, 576,
                                   std::vector<int64_t>(table.begin(), table.end()), B, max_pages);
    m.smax = max_pages * page;
    return m;
  }
  // mla_decode of (q_latent, q_rope) against `m` (ql, qr rounded to dt in place); out and lse
  // downloaded.
  void run(DType dt, const MlaCase& c, std::vector<double>& ql, std::vector<double>& qr,
           MlaSetup& m, double scale, std::vector<double>& out, std::vector<double>& lse) {
    const int64_t B = static_cast<int64_t>(c.lens.size()), H = c.heads;
    DeviceTensor qld = test::to_device(dt, {B, c.sq, H, 512}, ql),
                 qrd = test::to_device(dt, {B, c.sq, H, 64}, qr);
    DeviceTensor sl = upload_i32({B}, std::vector<int32_t>(c.lens.begin(), c.lens.end()));
    DeviceTensor o = test::alloc(dt, {B, c.sq, H, 512});
    DeviceTensor l = test::alloc(DType::f32, {B, c.sq, H});
    DecodeParams p;
    p.num_splits = c.splits;
    p.scale = scale;
    if (c.page != 0) p.block_table = &m.table.t;
    mla_decode(qld.t, qrd.t, m.cache.t, sl.t, o.t, &l.t, p, stream());
    sync();
    out = test::download_values(o);
    lse = test::download_values(l);
  }
  // One case against the float64 reference.
  void check(DType dt, const MlaCase& c) {
    const int64_t B = static_cast<int64_t>(c.lens.size()), H = c.heads;
    const int64_t maxlen = *std::max_element(c.lens.begin(), c.lens.end());
    std::vector<double> ql = rng().uniform(static_cast<size_t>(B * c.sq * H * 512), -1.0, 1.0);
    std::vector<double> qr = rng().uniform(static_cast<size_t>(B * c.sq * H * 64), -1.0, 1.0);
    const double scale = 0.1352;  // DeepSeek-like: 1/sqrt(192) · mscale², not the default
    MlaSetup m;
    if (c.page == 0) {
      const int64_t smax = maxlen + 3;
      m = contiguous(dt, c.lens, rng().uniform(static_cast<size_t>(B * smax * 576), -1.0, 1.0),
                     smax);
    } else {
      m = paged(dt, c.lens, c.page);
    }
    std::vector<double> out, lse, ro, rl;
    run(dt, c, ql, qr, m, scale, out, lse);
    ref::mla_decode(ql, qr, m.gathered, c.lens, B, c.sq, H, m.smax, scale, ro, rl);
    EXPECT_TRUE(test::all_close(out, ro, dt));
    EXPECT_TRUE(test::all_close(lse, rl, test::Tolerance{2e-5, 1e-4}));
  }
};

class MlaDecodeGpu : public MlaGpuTest,
                     public ::testing::WithParamInterface<std::tuple<DType, int>> {};

const MlaCase kMla[] = {
    {{1, 17, 1000}, 1, 16, 64, 0},
    {{1000, 2500}, 1, 16, 16, 4},
    {{300, 17}, 1, 128, 256, 0},
    {{500, 33}, 3, 16, 0, 3},
    {{129, 2}, 2, 128, 48, 2},
    {{1500, 4, 17}, 4, 8, 64, 0},
    // WGMMA kernel (blocks of 64 rows): pages of 16 (4 boxes per tile), contiguous with a
    // ragged tail, splits merged in the kernel or combined, Sq > 1 causal rows across blocks.
    {{4097, 1, 63}, 1, 128, 16, 0},
    {{7, 300}, 1, 64, 0, 0},
    {{2000}, 2, 64, 128, 3},
    {{1100, 65}, 3, 32, 32, 2},
    {{5000, 640}, 1, 128, 0, 0},
    // Blocks of <= 16 rows (decode_kernel): contiguous
    // with splits merged by the combine launch (short splits) and in the kernel (B = 1, long
    // splits), heuristic splits with empty ones, 4 rows on pages of 48, Sq = 2 x 8 heads.
    {{500, 33, 4}, 2, 8, 0, 3},
    {{2049}, 1, 16, 0, 5},
    {{4097, 1, 63}, 1, 16, 0, 0},
    {{3000, 700}, 1, 4, 48, 2},
    {{1, 300, 20}, 1, 16, 16, 7},
    // mla_swap_kernel (<= 16 rows, 64-token tiles whole boxes): one split of 79 tiles (the
    // chunk ring wraps many times), Sq = 2 x 8 heads on pages of 16, one head, 5 rows on pages
    // of 128 with a heuristic split count.
    {{5000, 3}, 1, 16, 64, 1},
    {{777, 1500}, 2, 8, 16, 2},
    {{100, 2000}, 1, 1, 64, 0},
    {{4097, 130}, 1, 5, 128, 0},
};

TEST_P(MlaDecodeGpu, MatchesReference) {
  const auto [dt, ci] = GetParam();
  check(dt, kMla[ci]);
}

INSTANTIATE_TEST_SUITE_P(All, MlaDecodeGpu,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Range(0, static_cast<int>(std::size(kMla)))),
                         test::dtype_case_name);

// The <= 16-row cases again on one kernel each: decode_kernel's mma.sync path (taken for splits
// of 1-2 tiles and for page sizes whose tiles are not whole boxes), and mla_swap_kernel wherever
// the cache geometry allows (the default takes it only for splits of >= 3 tiles).
class MlaDecodeNoSwapGpu : public MlaDecodeGpu {
 protected:
  void TearDown() override {
    detail::set_mla_swap(1);
    MlaDecodeGpu::TearDown();
  }
};

TEST_P(MlaDecodeNoSwapGpu, MatchesReference) {
  const auto [dt, ci] = GetParam();
  detail::set_mla_swap(0);
  check(dt, kMla[ci]);
}

// The indices of kMla's blocks of <= 16 rows.
std::vector<int> small_mla_cases() {
  std::vector<int> v;
  for (int i = 0; i < static_cast<int>(std::size(kMla)); ++i)
    if (kMla[i].sq * kMla[i].heads <= 16) v.push_back(i);
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, MlaDecodeNoSwapGpu,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::ValuesIn(small_mla_cases())),
                         test::dtype_case_name);

class MlaDecodeSwapGpu : public MlaDecodeNoSwapGpu {};

TEST_P(MlaDecodeSwapGpu, MatchesReference) {
  const auto [dt, ci] = GetParam();
  detail::set_mla_swap(2);
  check(dt, kMla[ci]);
}

INSTANTIATE_TEST_SUITE_P(All, MlaDecodeSwapGpu,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::ValuesIn(small_mla_cases())),
                         test::dtype_case_name);

// The <= 16-row kernels on a paged cache give the same bits as on the contiguous copy of it
// (decode_kernel and mla_swap_kernel).
class MlaPagedGpu : public MlaGpuTest {
 protected:
  void TearDown() override {
    detail::set_mla_swap(1);
    MlaGpuTest::TearDown();
  }
};

TEST_F(MlaPagedGpu, PagedEqualsContiguous) {
  const DType dt = DType::bf16;
  for (int mode : {0, 2})
    for (int64_t page : {16, 64}) {
      SCOPED_TRACE("page " + std::to_string(page) + (mode ? " swap" : " decode_kernel"));
      detail::set_mla_swap(mode);
      // 3 forced splits: merged in the kernel (long) and by the combine launch (short splits).
      for (const std::vector<int64_t>& lens :
           {std::vector<int64_t>{2100, 5, 777}, std::vector<int64_t>{100, 31}}) {
        MlaCase c{lens, 1, 16, page, 3};
        const int64_t B = static_cast<int64_t>(lens.size());
        MlaSetup pg = paged(dt, lens, page);
        MlaSetup ct = contiguous(dt, lens, pg.gathered, pg.smax);
        std::vector<double> ql = rng().uniform(static_cast<size_t>(B * 16 * 512), -1.0, 1.0);
        std::vector<double> qr = rng().uniform(static_cast<size_t>(B * 16 * 64), -1.0, 1.0);
        std::vector<double> po, pl, co, cl;
        run(dt, c, ql, qr, pg, 0.0, po, pl);
        c.page = 0;
        run(dt, c, ql, qr, ct, 0.0, co, cl);
        EXPECT_TRUE(po == co);
        EXPECT_TRUE(pl == cl);
      }
    }
}

// An out-of-range page of one sequence: without check_inputs only that sequence's rows are NaN
// (every MLA kernel: <= 16 rows on mla_swap_kernel and on decode_kernel, 64-row blocks on
// mla_wgmma_kernel), with it the call throws and leaves out untouched.
TEST_F(MlaPagedGpu, BadPageOnlyItsRowsNaN) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {700, 300};
  const int64_t B = 2, ps = 64;
  for (int64_t heads : {16, 128})
    for (bool swap : {true, false})
      for (int splits : {1, 3}) {
        if (heads > 16 && !swap) continue;
        SCOPED_TRACE("heads " + std::to_string(heads) + (swap ? " swap" : " decode_kernel") +
                     " splits " + std::to_string(splits));
        detail::set_mla_swap(swap ? 2 : 0);
        MlaSetup m = paged(dt, lens, ps);
        std::vector<int32_t> table(static_cast<size_t>(m.table.t.numel()));
        ASSERT_EQ(
            cudaMemcpy(table.data(), m.table.t.data, table.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
        const int64_t max_pages = m.table.t.shape[1];
        table[static_cast<size_t>(max_pages + 2)] = 1 << 20;  // sequence 1, page 2 (used)
        DeviceTensor bt = upload_i32({B, max_pages}, table);
        std::vector<double> qlv = rng().uniform(static_cast<size_t>(B * heads * 512), -1, 1),
                            qrv = rng().uniform(static_cast<size_t>(B * heads * 64), -1, 1);
        DeviceTensor ql = test::to_device(dt, {B, 1, heads, 512}, qlv);
        DeviceTensor qr = test::to_device(dt, {B, 1, heads, 64}, qrv);
        DeviceTensor sl = upload_i32({B}, {700, 300});
        DeviceTensor out = test::alloc(dt, {B, 1, heads, 512});
        DecodeParams p;
        p.block_table = &bt.t;
        p.num_splits = splits;
        p.check_inputs = true;
        try {
          mla_decode(ql.t, qr.t, m.cache.t, sl.t, out.t, nullptr, p, stream());
          ADD_FAILURE() << "no error for an out-of-range page";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT);
          EXPECT_NE(std::string(e.what()).find("block_table[1, 2]"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(test::download_bytes(out) == std::vector<uint8_t>(out.buf.bytes(), 0xFF));
        p.check_inputs = false;
        mla_decode(ql.t, qr.t, m.cache.t, sl.t, out.t, nullptr, p, stream());
        sync();
        const std::vector<double> o = test::download_values(out);
        const size_t row = static_cast<size_t>(heads * 512);
        EXPECT_TRUE(
            std::none_of(o.begin(), o.begin() + row, [](double x) { return std::isnan(x); }));
        EXPECT_TRUE(std::all_of(o.begin() + row, o.end(), [](double x) { return std::isnan(x); }));
      }
}

class MlaAppendGpu : public test::GpuTest {};

TEST_F(MlaAppendGpu, AppendLatentPaged) {
  const DType dt = DType::bf16;
  const std::vector<int64_t> lens = {5, 64, 65};
  const int64_t B = 3, sq = 2, ps = 64, max_pages = 2;
  int64_t np = 0;
  const std::vector<int32_t> table = make_block_table(rng(), lens, ps, max_pages, np);
  DeviceTensor bt = upload_i32({B, max_pages}, table);
  DeviceTensor sl = upload_i32({B}, std::vector<int32_t>(lens.begin(), lens.end()));
  std::vector<double> cn = rng().uniform(static_cast<size_t>(B * sq * 576), -1.0, 1.0);
  DeviceTensor cnd = test::to_device(dt, {B, sq, 576}, cn);
  std::vector<double> pages = rng().uniform(static_cast<size_t>(np * ps * 576), -1.0, 1.0);
  DeviceTensor cd = test::to_device(dt, {np, ps, 576}, pages);
  append_latent(cnd.t, cd.t, &bt.t, sl.t, false, stream());
  sync();
  std::vector<int64_t> t64(table.begin(), table.end());
  std::vector<double> g = ref::gather_pages(pages, np, ps, 576, t64, B, max_pages);
  ref::append_kv(cn, g, lens, B, sq, max_pages * ps, 576);
  EXPECT_TRUE(ref::gather_pages(test::download_values(cd), np, ps, 576, t64, B, max_pages) == g);
}

}  // namespace
}  // namespace tessel
