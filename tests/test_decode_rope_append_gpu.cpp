// GPU tests of detail::decode_attention_rope_append (decode attention with RoPE and the KV-cache
// append fused in front, the engine's decode step): bit for bit the two-launch sequence
// llm_engine::rope_append + decode_attention (bf16, paged caches), and against float64 (q and
// the new k rotated on the host, the cache rows it wrote, the attention output) for bf16 / f16,
// contiguous and paged caches, neox and gpt-j, partial rotary dims, Sq = 1..3 new tokens whose
// positions straddle two KV splits, ranges long enough for the TMA loads; bad arguments throw
// naming the argument and leave the outputs and caches untouched.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "ops/attention_decode/decode_rope_append.hpp"
#include "ops/llm_engine/rope_tables.hpp"
#include "ref/decode_attention_ref.hpp"
#include "tessel/decode_attention.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

using test::upload_i32;

DeviceTensor upload_f32(const std::vector<int64_t>& shape, const std::vector<float>& v) {
  DeviceTensor d = test::alloc(DType::f32, shape);
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  test::upload_bytes(d, bytes);
  return d;
}

struct RopeCase {
  std::vector<int64_t> lens;     // after the append (>= sq)
  int64_t sq, hq, hkv, d, page;  // page 0: contiguous
  int64_t rope_dim;
  bool neox;
  int splits;  // DecodeParams::num_splits (0: heuristic)
};

const RopeCase kRopeCases[] = {
    {{1, 17, 300}, 1, 32, 8, 128, 16, 128, true, 0},  // the 8B decode step's shape, ragged
    {{576}, 1, 32, 8, 64, 64, 64, true, 0},           // the 1B decode step (one-tile splits)
    {{130, 64}, 3, 8, 8, 64, 0, 64, false, 2},        // gpt-j, GQA 1, new tokens 127..129 of
                                                      // sequence 0 straddle the two splits
    {{4097, 2}, 2, 16, 4, 128, 64, 64, true, 1},      // partial rotary; 65 tiles: TMA loads
    {{700, 33}, 1, 8, 2, 256, 256, 128, false, 3},    // D 256, partial gpt-j
    {{1000, 5, 77}, 2, 12, 4, 128, 48, 96, true, 0},  // GQA 3, page 48, rope 96
};

class DecodeRopeAppendGpu : public test::GpuTest,
                            public ::testing::WithParamInterface<std::tuple<DType, int>> {};

TEST_P(DecodeRopeAppendGpu, MatchesTwoLaunchesAndFloat64) {
  const auto [dt, ci] = GetParam();
  const RopeCase& c = kRopeCases[ci];
  const int64_t B = static_cast<int64_t>(c.lens.size()), D = c.d, half = c.rope_dim / 2;
  const int64_t rows = B * c.sq;
  const int64_t maxlen = *std::max_element(c.lens.begin(), c.lens.end());
  // The step's fused qkv rows (q heads, k heads, v heads), with 8 elements of row padding.
  const int64_t width = (c.hq + 2 * c.hkv) * D, pitch = width + 8;
  DeviceTensor qkv = test::alloc_pitched(dt, {rows, width}, pitch);
  std::vector<double> qkv_v = rng().uniform(static_cast<size_t>(rows * width), -2.0, 2.0);
  test::upload_values(qkv, qkv_v);
  qkv_v = test::download_values(qkv);
  auto head_view = [&](const DeviceTensor& buf, int64_t first_head, int64_t heads) {
    Tensor t = buf.t;  // (B, Sq, heads, D) at head first_head of the rows
    t.data = static_cast<char*>(buf.t.data) + first_head * D * static_cast<int64_t>(dtype_size(dt));
    t.ndim = 4;
    const int64_t shape[4] = {B, c.sq, heads, D}, strides[4] = {c.sq * pitch, pitch, D, 1};
    for (int i = 0; i < 4; ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    return t;
  };
  // Angles per (row, pair): any cos / sin pair (the engine's tables hold scaled frequencies).
  std::vector<float> cosv(static_cast<size_t>(rows * half)), sinv(cosv.size());
  {
    std::vector<double> th = rng().uniform(cosv.size(), -3.1, 3.1);
    for (size_t i = 0; i < th.size(); ++i) {
      cosv[i] = static_cast<float>(std::cos(th[i]));
      sinv[i] = static_cast<float>(std::sin(th[i]));
    }
  }
  DeviceTensor cos_d = upload_f32({rows, half}, cosv), sin_d = upload_f32({rows, half}, sinv);
  std::vector<int32_t> lens32(c.lens.begin(), c.lens.end());
  DeviceTensor sl = upload_i32({B}, lens32);

  // Caches: random everywhere (the new tokens' rows too, so an unwritten row fails).
  const bool paged = c.page > 0;
  int64_t units = B, per_unit = maxlen + 5, max_pages = 0;
  std::vector<int32_t> table;
  if (paged) {
    max_pages = (maxlen + c.page - 1) / c.page + 1;
    int64_t used = 0;
    for (int64_t l : c.lens) used += (l + c.page - 1) / c.page;
    units = used + 3;
    per_unit = c.page;
    std::vector<int32_t> perm(static_cast<size_t>(units));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng().engine());
    table.assign(static_cast<size_t>(B * max_pages), -1);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < (c.lens[b] + c.page - 1) / c.page; ++j)
        table[b * max_pages + j] = perm[next++];
  }
  const std::vector<int64_t> cshape = {units, per_unit, c.hkv, D};
  const size_t cn = static_cast<size_t>(units * per_unit * c.hkv * D);
  std::vector<double> k0 = rng().uniform(cn, -1.0, 1.0), v0 = rng().uniform(cn, -1.0, 1.0);
  DeviceTensor kc = test::to_device(dt, cshape, k0), vc = test::to_device(dt, cshape, v0);
  const std::vector<uint8_t> kc0 = test::download_bytes(kc), vc0 = test::download_bytes(vc);
  DeviceTensor bt;
  DecodeParams prm;
  prm.num_splits = c.splits;
  if (paged) {
    bt = upload_i32({B, max_pages}, table);
    prm.block_table = &bt.t;
  }

  const Tensor q = head_view(qkv, 0, c.hq), kn = head_view(qkv, c.hq, c.hkv),
               vn = head_view(qkv, c.hq + c.hkv, c.hkv);
  detail::DecodeRopeAppend ra;
  ra.k_new = &kn;
  ra.v_new = &vn;
  ra.cos = &cos_d.t;
  ra.sin = &sin_d.t;
  ra.rope_dim = c.rope_dim;
  ra.neox = c.neox;
  DeviceTensor out = test::alloc(dt, {B, c.sq, c.hq, D});
  DeviceTensor lse = test::alloc(DType::f32, {B, c.sq, c.hq});
  const std::vector<uint8_t> qkv_bytes = test::download_buffer(qkv);
  detail::decode_attention_rope_append(q, ra, kc.t, vc.t, sl.t, out.t, &lse.t, prm, stream());
  sync();
  EXPECT_TRUE(test::download_buffer(qkv) == qkv_bytes) << "q / k_new / v_new modified";
  const std::vector<uint8_t> out1 = test::download_bytes(out), kc1 = test::download_bytes(kc),
                             vc1 = test::download_bytes(vc);

  // (a) bf16, paged: the two launches on the same inputs give the same bits (out, both caches).
  if (dt == DType::bf16 && paged) {
    test::upload_bytes(kc, kc0);
    test::upload_bytes(vc, vc0);
    DeviceTensor qkv2 = test::alloc_pitched(dt, {rows, width}, pitch);
    TESSEL_TEST_CUDA(cudaMemcpy(qkv2.buf.data(), qkv_bytes.data(), qkv_bytes.size(),
                                cudaMemcpyHostToDevice));  // the whole buffer, padding included
    llm_engine::RopeAppendArgs a{};
    a.qk = qkv2.t.data;
    a.ld = pitch;
    a.v = static_cast<char*>(qkv2.t.data) + (c.hq + c.hkv) * D * 2;
    a.v_ld = pitch;
    a.rows = rows;
    a.hq = static_cast<int>(c.hq);
    a.hkv = static_cast<int>(c.hkv);
    a.head_dim = static_cast<int>(D);
    a.rope_dim = static_cast<int>(c.rope_dim);
    a.neox = c.neox;
    a.cos = static_cast<const float*>(cos_d.t.data);
    a.sin = static_cast<const float*>(sin_d.t.data);
    a.k_cache = kc.t.data;
    a.v_cache = vc.t.data;
    a.page_size = static_cast<int>(c.page);
    a.num_pages = static_cast<int>(units);
    a.seqlens = static_cast<const int32_t*>(sl.t.data);
    a.block_table = static_cast<const int32_t*>(bt.t.data);
    a.table_stride = max_pages;
    a.max_pages = static_cast<int>(max_pages);
    a.sq = static_cast<int>(c.sq);
    llm_engine::rope_append_bf16(a, stream());
    DeviceTensor out2 = test::alloc(dt, {B, c.sq, c.hq, D});
    decode_attention(head_view(qkv2, 0, c.hq), kc.t, vc.t, sl.t, out2.t, nullptr, prm, stream());
    sync();
    EXPECT_TRUE(test::download_bytes(kc) == kc1) << "k cache differs from rope_append's";
    EXPECT_TRUE(test::download_bytes(vc) == vc1) << "v cache differs from rope_append's";
    EXPECT_TRUE(test::bit_exact(test::download_bytes(out2), out1, 2))
        << "output differs from the two launches";
  }

  // (b) float64: q and the new k rotated on the host (rounded to the dtype as the kernel rounds
  // them), the new rows in the cache, the rest of the cache unchanged, the attention output.
  auto rotate = [&](std::vector<double>& x, int64_t row, int64_t off) {  // one head at x[off]
    std::vector<double> y(x.begin() + off, x.begin() + off + D);
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ia = c.neox ? i : 2 * i, ib = c.neox ? i + half : 2 * i + 1;
      const double cs = cosv[row * half + i], sn = sinv[row * half + i];
      y[ia] = x[off + ia] * cs - x[off + ib] * sn;
      y[ib] = x[off + ia] * sn + x[off + ib] * cs;
    }
    std::copy(y.begin(), y.end(), x.begin() + off);
  };
  std::vector<double> rot = qkv_v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < c.hq + c.hkv; ++h) rotate(rot, r, r * width + h * D);
  rot = ref::quantize(test::storage(dt), rot);
  std::vector<double> qref(static_cast<size_t>(rows * c.hq * D));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(rot.begin() + r * width, rot.begin() + r * width + c.hq * D,
              qref.begin() + r * c.hq * D);
  // The expected caches: the initial values with the new rows stored.
  std::vector<double> kexp = test::decode(dt, kc0), vexp = test::decode(dt, vc0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < c.sq; ++s) {
      const int64_t pos = c.lens[b] - c.sq + s, r = b * c.sq + s;
      const int64_t crow =
          paged ? table[b * max_pages + pos / c.page] * c.page + pos % c.page : b * per_unit + pos;
      for (int64_t e = 0; e < c.hkv * D; ++e) {
        kexp[crow * c.hkv * D + e] = rot[r * width + c.hq * D + e];
        vexp[crow * c.hkv * D + e] = qkv_v[r * width + (c.hq + c.hkv) * D + e];
      }
    }
  const std::vector<double> k1 = test::decode(dt, kc1), v1 = test::decode(dt, vc1);
  EXPECT_TRUE(test::all_close(k1, kexp, dt)) << "k cache";
  EXPECT_TRUE(test::all_close(v1, vexp, test::Tolerance{0.0, 0.0})) << "v cache";
  ref::DecodeRefConfig rc;
  rc.batch = B;
  rc.sq = c.sq;
  rc.hq = c.hq;
  rc.hkv = c.hkv;
  rc.dqk = rc.dv = D;
  rc.scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> kref = kexp, vref = vexp;
  rc.smax = per_unit;
  if (paged) {
    std::vector<int64_t> t64(table.begin(), table.end());
    kref = ref::gather_pages(kexp, units, c.page, c.hkv * D, t64, B, max_pages);
    vref = ref::gather_pages(vexp, units, c.page, c.hkv * D, t64, B, max_pages);
    rc.smax = max_pages * c.page;
  }
  std::vector<double> ro, rl;
  ref::decode_attention(qref, kref, vref, c.lens, rc, ro, rl);
  EXPECT_TRUE(test::all_close(test::decode(dt, out1), ro, dt));
  EXPECT_TRUE(test::all_close(test::download_values(lse), rl, test::Tolerance{2e-5, 1e-4}));
}

INSTANTIATE_TEST_SUITE_P(
    All, DecodeRopeAppendGpu,
    ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                       ::testing::Range(0, static_cast<int>(std::size(kRopeCases)))),
    test::dtype_case_name);

// Bad arguments: an error naming the argument; out and both caches untouched.
class DecodeRopeAppendGpuErrors : public test::GpuTest {};

TEST_F(DecodeRopeAppendGpuErrors, BadArgumentsThrowAndWriteNothing) {
  const DType dt = DType::bf16;
  const int64_t B = 2, sq = 1, hq = 8, hkv = 2, D = 64, smax = 40;
  auto dev = [&](const std::vector<int64_t>& shape) {
    std::vector<double> v = rng().uniform(static_cast<size_t>(test::numel(shape)), -1.0, 1.0);
    return test::to_device(dt, shape, v);
  };
  DeviceTensor q = dev({B, sq, hq, D}), kn = dev({B, sq, hkv, D}), vn = dev({B, sq, hkv, D});
  DeviceTensor kn_short = dev({B, sq, hkv, 32});
  DeviceTensor kc = dev({B, smax, hkv, D}), vc = dev({B, smax, hkv, D});
  DeviceTensor cs = upload_f32({B * sq, 32}, std::vector<float>(B * sq * 32, 0.5f));
  DeviceTensor cs_bad = upload_f32({B * sq, 16}, std::vector<float>(B * sq * 16, 0.5f));
  DeviceTensor sl = upload_i32({B}, {10, 40});
  const std::vector<uint8_t> kc0 = test::download_bytes(kc), vc0 = test::download_bytes(vc);
  struct Bad {
    const char* what;
    const char* arg;
    const Tensor* k_new;
    const Tensor* cos;
    int64_t rope_dim;
  };
  const Bad bads[] = {
      {"rope_dim 8", "'rope_dim'", &kn.t, &cs.t, 8},
      {"rope_dim 80 > D", "'rope_dim'", &kn.t, &cs.t, 80},
      {"rope_dim 40 (not a multiple of 16)", "'rope_dim'", &kn.t, &cs.t, 40},
      {"cos of 16 pairs for rope_dim 64", "'cos'", &kn.t, &cs_bad.t, 64},
      {"k_new of head dim 32", "'k_new'", &kn_short.t, &cs.t, 64},
  };
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.what);
    DeviceTensor out = test::alloc(dt, {B, sq, hq, D});
    detail::DecodeRopeAppend ra;
    ra.k_new = bad.k_new;
    ra.v_new = &vn.t;
    ra.cos = bad.cos;
    ra.sin = &cs.t;
    ra.rope_dim = bad.rope_dim;
    try {
      detail::decode_attention_rope_append(q.t, ra, kc.t, vc.t, sl.t, out.t, nullptr,
                                           DecodeParams{}, stream());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), TESSEL_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(msg.find("decode_attention_rope_append"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad.arg), std::string::npos) << msg;
    }
    sync();
    EXPECT_TRUE(test::download_bytes(out) == std::vector<uint8_t>(out.buf.bytes(), 0xFF))
        << "out written";
    EXPECT_TRUE(test::download_bytes(kc) == kc0) << "k cache written";
    EXPECT_TRUE(test::download_bytes(vc) == vc0) << "v cache written";
  }
}

}  // namespace
}  // namespace tessel
