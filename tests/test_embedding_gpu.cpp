// GPU tests of embedding / embedding_backward: i32/i64 ids, f32/f16/bf16, D in {1, 7, 127,
// 4097, 4096}, duplicate ids (hot rows beyond the owner's sort capacity too), f32 dweight from
// 16-bit dout, deterministic mode bitwise reproducible, atomic mode, out-of-range ids (zero
// rows / ignored unchecked; tessel::Error with check_ids and nothing written).
// Atomic mode (owner pass for rows of <= kHotThreshold tokens, chunked atomics for hot rows):
// uniform, skewed (bucket sizes either side of the threshold and of the chunk size) and
// all-equal ids, ragged and vector D, dense and row-pitched dweight of f32 and dout's dtype,
// repeated calls on one stream (workspace left zeroed), graph capture (fallback on a fresh
// stream, the full path on a stream whose workspace is already large enough).
// Stream workspace: every GPU test here first gives its stream a workspace larger than any of
// its calls needs (so no call reallocates it and each call finds exactly what the previous one
// left) and checks after the backward calls that all of it is zero again; EmbeddingWorkspaceGpu
// runs one sequence of calls with different V, N and modes on one stream (larger after smaller
// and the reverse, atomic after deterministic and the reverse, a captured atomic call after an
// eager deterministic one), every result against float64, deterministic ones bit for bit
// against the first call of the same problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "ref/llm_ref.hpp"
#include "runtime/workspace.hpp"
#include "tessel/embedding.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

DeviceTensor upload_ids(DType idt, const std::vector<int64_t>& ids) {
  std::vector<uint8_t> b(ids.size() * dtype_size(idt));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (idt == DType::i32)
      reinterpret_cast<int32_t*>(b.data())[i] = static_cast<int32_t>(ids[i]);
    else
      reinterpret_cast<int64_t*>(b.data())[i] = ids[i];
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

// ---- the stream workspace --------------------------------------------------------------------
// embedding_backward lays the stream workspace out per call: count[V+1] | start[V+1] |
// cursor[V] | perm[N] | (atomic mode: hot-chunk list | its counter) | cub scan scratch. Which
// bytes must be zero on entry (count, cursor, the counter) thus depends on V, N and the mode,
// and may be where an earlier call had its scan scratch. A workspace that grows is a fresh,
// zeroed buffer, which hides stale bytes: with 7b18b23 (scan scratch not zeroed) the failures
// depended on whether a test's stream reused an earlier test's handle, and so its buffer.
// Tests give their stream kWorkspaceBytes first (more than any call below needs) and check
// after their calls that all of it is zero again.
constexpr size_t kWorkspaceBytes = size_t{2} << 20;

void* grow_workspace(cudaStream_t s) {
  void* p = detail::stream_workspace(s, kWorkspaceBytes);
  // A recycled stream handle keeps an earlier test's buffer: start from zeros regardless.
  TESSEL_TEST_CUDA(cudaMemsetAsync(p, 0, kWorkspaceBytes, s));
  TESSEL_TEST_CUDA(cudaDeviceSynchronize());
  return p;
}

// The workspace is still the buffer `p` (no call reallocated it) and all kWorkspaceBytes of it
// are zero.
::testing::AssertionResult workspace_zeroed(cudaStream_t s, const void* p) {
  TESSEL_TEST_CUDA(cudaStreamSynchronize(s));
  if (detail::stream_workspace(s, 1) != p)
    return ::testing::AssertionFailure()
           << "the stream workspace was reallocated (a call needed more than the test gave it)";
  std::vector<uint8_t> h(kWorkspaceBytes);
  TESSEL_TEST_CUDA(cudaMemcpy(h.data(), p, h.size(), cudaMemcpyDeviceToHost));
  size_t nonzero = 0, first = 0;
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i] != 0 && nonzero++ == 0) first = i;
  if (nonzero == 0) return ::testing::AssertionSuccess();
  uint32_t word = 0;
  std::memcpy(&word, h.data() + first / 4 * 4, 4);
  return ::testing::AssertionFailure()
         << nonzero << " non-zero byte(s) left in the stream workspace, the first at byte " << first
         << " (32-bit word " << word << ")";
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
  // No call below grows the workspace: each finds what the previous one left. (7b18b23: the
  // atomic call after the deterministic ones, D >= 4096 so N = 97, found their scan scratch
  // under its hot-chunk counter unless the workspace had just been reallocated.)
  const void* ws = grow_workspace(stream());
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
    EXPECT_TRUE(
        test::bit_exact(test::download_bytes(dw2), test::download_bytes(dw1), dtype_size(wdt)));
    EXPECT_TRUE(workspace_zeroed(stream(), ws));
    if (wdt == DType::f32) {
      DeviceTensor dw3 = test::alloc(wdt, {vocab, dim});
      embedding_backward(it.t, g.t, dw3.t, EmbeddingGradMode::atomic, false, stream());
      sync();
      EXPECT_TRUE(test::all_close(test::download_values(dw3), rdw, wdt, scale));
      EXPECT_TRUE(workspace_zeroed(stream(), ws));
      // Deterministic after atomic on the same stream: bit for bit as before.
      DeviceTensor dw4 = test::alloc(wdt, {vocab, dim});
      embedding_backward(it.t, g.t, dw4.t, EmbeddingGradMode::deterministic, false, stream());
      sync();
      EXPECT_TRUE(
          test::bit_exact(test::download_bytes(dw4), test::download_bytes(dw1), dtype_size(wdt)));
      EXPECT_TRUE(workspace_zeroed(stream(), ws));
    }
  }
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_d" +
         std::to_string(std::get<1>(info.param)) + "_" + dtype_name(std::get<2>(info.param));
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
  EXPECT_TRUE(test::all_close(test::download_values(dw),
                              ref::embedding_backward(ids, gv, vocab, dim), DType::f32,
                              abs_scatter(ids, gv, vocab, dim)));
  // Unique ids: a 16-bit atomic dweight is exact (one addition to zero per row).
  std::vector<int64_t> uniq(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) uniq[i] = (i * 7) % vocab;
  DeviceTensor iu = upload_ids(DType::i32, uniq), dw16 = test::alloc(dt, {vocab, dim});
  embedding_backward(iu.t, g.t, dw16.t, EmbeddingGradMode::atomic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(dw16),
                              ref::embedding_backward(uniq, gv, vocab, dim), dt));
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
    EXPECT_NE(std::string(e.what()).find("id 50 at flat position 37"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::deterministic, true, stream()), Error);
  sync();
  for (uint8_t b : test::download_bytes(out)) ASSERT_EQ(b, 0xFF);  // nothing written
  for (uint8_t b : test::download_bytes(dw)) ASSERT_EQ(b, 0xFF);
  // Unchecked: zero rows, ignored tokens.
  embedding(it.t, w.t, out.t, false, stream());
  embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::deterministic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(out), ref::embedding(ids, wv, vocab, dim), dt));
  EXPECT_TRUE(test::all_close(test::download_values(dw),
                              ref::embedding_backward(ids, gv, vocab, dim), DType::f32,
                              abs_scatter(ids, gv, vocab, dim)));
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingSpecialGpu, ::testing::ValuesIn(test::kFloatDTypes),
                         test::dtype_param_name);

// ---- atomic mode -----------------------------------------------------------------------------
// embedding.cu sends a row with more than kHotThreshold = 32 tokens to the hot path (zeros from
// the owner pass, then one atomic per chunk of kHotChunk = 64 tokens); the skewed ids have
// buckets either side of 32 and 64 (64 being the other threshold considered) and of one and
// two full chunks.
enum class Ids { uniform, skewed, all_equal };

const char* ids_name(Ids p) {
  return p == Ids::uniform ? "uniform" : p == Ids::skewed ? "skewed" : "all_equal";
}

//  uniform  : uniform random ids;
//  skewed   : 60 % of the tokens on the LAST row (n = 1601: 960 tokens, 15 chunks); rows 0..7
//             with exactly 31, 32, 33, 63, 64, 65, 128 and 129 tokens; the rest uniform over
//             rows 8..vocab-2 (a few tokens each); two out-of-range ids (-1 and vocab);
//  all_equal: every token on row 3 (n = 1601: 25 full chunks and one of a single token).
// Shuffled, so a row's tokens are spread over the batch.
std::vector<int64_t> make_ids(Ids p, int64_t n, int64_t vocab, test::Rng& r) {
  std::vector<int64_t> ids;
  if (p == Ids::all_equal) return std::vector<int64_t>(static_cast<size_t>(n), 3);
  if (p == Ids::uniform) {
    for (int64_t i = 0; i < n; ++i) ids.push_back(r.integer(0, vocab - 1));
    return ids;
  }
  const int64_t sizes[] = {31, 32, 33, 63, 64, 65, 128, 129};
  ids.assign(static_cast<size_t>(n * 6 / 10), vocab - 1);
  for (int64_t k = 0; k < static_cast<int64_t>(std::size(sizes)); ++k)
    ids.insert(ids.end(), static_cast<size_t>(sizes[k]), k);
  ids.push_back(-1);
  ids.push_back(vocab);
  if (static_cast<int64_t>(ids.size()) > n) throw std::invalid_argument("make_ids: n too small");
  while (static_cast<int64_t>(ids.size()) < n)
    ids.push_back(r.integer(static_cast<int64_t>(std::size(sizes)), vocab - 2));
  for (size_t i = ids.size() - 1; i > 0; --i)
    std::swap(ids[i], ids[static_cast<size_t>(r.integer(0, static_cast<int64_t>(i)))]);
  return ids;
}

using AtomicParam = std::tuple<DType, int64_t, Ids>;
class EmbeddingAtomicGpu : public test::GpuTest,
                           public ::testing::WithParamInterface<AtomicParam> {};

TEST_P(EmbeddingAtomicGpu, MatchesReference) {
  const auto [dt, dim, pattern] = GetParam();
  const int64_t n = 1601, vocab = pattern == Ids::uniform ? 3000 : 300;
  const std::vector<int64_t> ids = make_ids(pattern, n, vocab, rng());
  const bool has_bad_ids = pattern == Ids::skewed;
  std::vector<double> gv = rng().uniform(static_cast<size_t>(n * dim), -1.0, 1.0);
  DeviceTensor it = upload_ids(pattern == Ids::skewed ? DType::i64 : DType::i32, ids);
  DeviceTensor g = test::to_device(dt, {n, dim}, gv);
  const std::vector<double> rdw = ref::embedding_backward(ids, gv, vocab, dim);
  const std::vector<double> scale = abs_scatter(ids, gv, vocab, dim);
  std::vector<DType> wdts = {DType::f32};
  if (dt != DType::f32) wdts.push_back(dt);
  // No call below grows the workspace (uniform ids, V = 3000, failed in 7b18b23 when the stream
  // kept the buffer of a V = 300 test: count[2688] and count[2944] started at 99, the status
  // words of its scan scratch).
  const void* ws = grow_workspace(stream());
  for (DType wdt : wdts) {
    SCOPED_TRACE(std::string("dweight ") + dtype_name(wdt));
    // Dense, then row-pitched (padding must stay poisoned), on the same stream: the second
    // call also checks that the first left the workspace's counters zeroed.
    DeviceTensor dw = test::alloc(wdt, {vocab, dim});
    embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::atomic, !has_bad_ids, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(dw), rdw, wdt, scale));
    EXPECT_TRUE(workspace_zeroed(stream(), ws));
    DeviceTensor dwp = test::alloc_pitched(wdt, {vocab, dim}, dim + 8);
    embedding_backward(it.t, g.t, dwp.t, EmbeddingGradMode::atomic, false, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(dwp), rdw, wdt, scale));
    EXPECT_TRUE(test::outside_untouched(dwp));
    EXPECT_TRUE(workspace_zeroed(stream(), ws));
    if (has_bad_ids) {  // checked: throws, nothing written
      DeviceTensor dwc = test::alloc(wdt, {vocab, dim});
      EXPECT_THROW(embedding_backward(it.t, g.t, dwc.t, EmbeddingGradMode::atomic, true, stream()),
                   Error);
      sync();
      for (uint8_t b : test::download_bytes(dwc)) ASSERT_EQ(b, 0xFF);
      EXPECT_TRUE(workspace_zeroed(stream(), ws));
    }
  }
  // Deterministic mode after atomic mode on the same stream: unaffected.
  DeviceTensor dwd = test::alloc(DType::f32, {vocab, dim});
  embedding_backward(it.t, g.t, dwd.t, EmbeddingGradMode::deterministic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(dwd), rdw, DType::f32, scale));
  EXPECT_TRUE(workspace_zeroed(stream(), ws));
  // Atomic mode after deterministic mode (its scan scratch ends inside this call's chunk list).
  DeviceTensor dwa = test::alloc(DType::f32, {vocab, dim});
  embedding_backward(it.t, g.t, dwa.t, EmbeddingGradMode::atomic, false, stream());
  sync();
  EXPECT_TRUE(test::all_close(test::download_values(dwa), rdw, DType::f32, scale));
  EXPECT_TRUE(workspace_zeroed(stream(), ws));
}

std::string atomic_name(const ::testing::TestParamInfo<AtomicParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_d" +
         std::to_string(std::get<1>(info.param)) + "_" + ids_name(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    All, EmbeddingAtomicGpu,
    ::testing::Combine(::testing::ValuesIn(test::kFloatDTypes), ::testing::Values(1, 7, 136, 4097),
                       ::testing::Values(Ids::uniform, Ids::skewed, Ids::all_equal)),
    atomic_name);

size_t kernel_nodes(cudaGraph_t graph) {
  size_t num = 0;
  TESSEL_TEST_CUDA(cudaGraphGetNodes(graph, nullptr, &num));
  std::vector<cudaGraphNode_t> nodes(num);
  if (num > 0) TESSEL_TEST_CUDA(cudaGraphGetNodes(graph, nodes.data(), &num));
  size_t kernels = 0;
  for (cudaGraphNode_t nd : nodes) {
    cudaGraphNodeType type{};
    TESSEL_TEST_CUDA(cudaGraphNodeGetType(nd, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

// Captures one atomic-mode call on `s` (no eager call on it before when `warm` is false), checks
// which path was captured, replays the graph twice (dweight poisoned before each: the replays
// also need the workspace left zeroed) and compares with float64.
void capture_atomic(cudaStream_t s, bool warm, DType dt, int64_t vocab, int64_t dim, int64_t n,
                    test::Rng& r) {
  const std::vector<int64_t> ids = make_ids(Ids::skewed, n, vocab, r);
  std::vector<double> gv = r.uniform(static_cast<size_t>(n * dim), -1.0, 1.0);
  DeviceTensor it = upload_ids(DType::i32, ids), g = test::to_device(dt, {n, dim}, gv);
  DeviceTensor dw = test::alloc(DType::f32, {vocab, dim});
  const std::vector<double> rdw = ref::embedding_backward(ids, gv, vocab, dim);
  const std::vector<double> scale = abs_scatter(ids, gv, vocab, dim);
  if (warm) {  // grows the stream's workspace
    embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::atomic, false, s);
    TESSEL_TEST_CUDA(cudaStreamSynchronize(s));
    EXPECT_TRUE(test::all_close(test::download_values(dw), rdw, DType::f32, scale));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Relaxed, like the other captures of public ops (argument checks query pointer
  // attributes); the kernel-node count below shows which path was captured.
  TESSEL_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    embedding_backward(it.t, g.t, dw.t, EmbeddingGradMode::atomic, false, s);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw under capture: " << e.what();
  }
  TESSEL_TEST_CUDA(cudaStreamEndCapture(s, &graph));
  const size_t kernels = kernel_nodes(graph);
  if (warm)  // count, scan (init + scan), fill, owner, hot rows
    EXPECT_GE(kernels, 5u) << "expected the full atomic path in the graph";
  else  // memset + per-token atomics
    EXPECT_LE(kernels, 2u) << "expected the no-workspace fallback in the graph";
  TESSEL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    test::poison(dw);
    TESSEL_TEST_CUDA(cudaGraphLaunch(exec, s));
    TESSEL_TEST_CUDA(cudaStreamSynchronize(s));
    EXPECT_TRUE(test::all_close(test::download_values(dw), rdw, DType::f32, scale))
        << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

class EmbeddingAtomicCaptureGpu : public test::GpuTest {};

// A fresh stream has no workspace and none may be allocated under capture: the dweight memset +
// per-token atomics are captured. The vocab is large (2^21 rows, a ~25 MB workspace) so that a
// recycled stream handle with a workspace from an earlier test is not large enough either.
TEST_F(EmbeddingAtomicCaptureGpu, FreshStreamFallback) {
  cudaStream_t s = nullptr;
  TESSEL_TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  capture_atomic(s, false, DType::f32, int64_t{1} << 21, 4, 1600, rng());
  cudaStreamDestroy(s);
}

// After an eager call has grown the workspace, the whole atomic path (hot rows included) is
// captured.
TEST_F(EmbeddingAtomicCaptureGpu, WarmStreamFullPath) {
  cudaStream_t s = nullptr;
  TESSEL_TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  capture_atomic(s, true, DType::bf16, 300, 136, 1600, rng());
  cudaStreamDestroy(s);
}

// ---- one stream, many problems ---------------------------------------------------------------
// One (V, N, ids) problem: its ids and dout on the device and its float64 gradient.
struct Problem {
  const char* name;
  int64_t vocab = 0, n = 0;
  std::vector<int64_t> ids;
  std::vector<double> gv, rdw, scale;
  DeviceTensor it, g;
};

Problem make_problem(const char* name, Ids p, int64_t vocab, int64_t n, DType idt, DType dt,
                     int64_t dim, test::Rng& r) {
  Problem pb;
  pb.name = name;
  pb.vocab = vocab;
  pb.n = n;
  pb.ids = make_ids(p, n, vocab, r);
  pb.gv = r.uniform(static_cast<size_t>(n * dim), -1.0, 1.0);
  pb.g = test::to_device(dt, {n, dim}, pb.gv);  // rounds gv to dt: the reference sees dout's values
  pb.it = upload_ids(idt, pb.ids);
  pb.rdw = ref::embedding_backward(pb.ids, pb.gv, vocab, dim);
  pb.scale = abs_scatter(pb.ids, pb.gv, vocab, dim);
  return pb;
}

class EmbeddingWorkspaceGpu : public test::GpuTest, public ::testing::WithParamInterface<DType> {};

// Calls with different V, N and modes on one stream whose workspace never grows, so each call
// finds exactly what the one before left there. 7b18b23 zeroed everything but cub's scan
// scratch, whose tile status words (99 = SCAN_TILE_INVALID for a one-tile scan, 256 bytes in;
// 101 / 100 and partial sums with several tiles) the next call could take for its counts, its
// bucket cursors or its hot-chunk counter. Every result is compared with float64, every
// deterministic one bit for bit with the first call of its problem (made on a zeroed workspace),
// and the workspace must be all zero after every call.
TEST_P(EmbeddingWorkspaceGpu, CallSequence) {
  const DType dt = GetParam();
  const int64_t dim = 36;  // f32 dweight: 4-column vectors; 16-bit dweight: the scalar path
  std::vector<Problem> pbs;
  // A: EmbeddingGpu's D >= 4096 problem (N = 97: a 256-byte chunk list, its counter where a
  //    deterministic call's lone scan tile status sits). B: hot rows (buckets of 31..129 tokens
  //    and 960 on the last row), out-of-range ids. C: EmbeddingAtomicGpu's uniform problem
  //    (V = 3000 after V = 300: count[2688] where a V = 300, N = 1601 deterministic call's tile
  //    status sits). D: V = 40000, several scan tiles, hot rows.
  pbs.push_back(make_problem("A", Ids::uniform, 300, 97, DType::i32, dt, dim, rng()));
  pbs.push_back(make_problem("B", Ids::skewed, 300, 1601, DType::i64, dt, dim, rng()));
  pbs.push_back(make_problem("C", Ids::uniform, 3000, 1601, DType::i32, dt, dim, rng()));
  pbs.push_back(make_problem("D", Ids::skewed, 40000, 3001, DType::i32, dt, dim, rng()));
  const auto det = EmbeddingGradMode::deterministic, atomic = EmbeddingGradMode::atomic;
  struct Step {
    int problem;
    EmbeddingGradMode mode;
    bool check_ids;  // uniform problems only (the skewed ones have out-of-range ids)
    bool w16;        // dweight of dout's dtype (f32 otherwise)
  };
  const Step steps[] = {
      {0, det, false, false},     // A, zeroed workspace: A's deterministic baseline
      {0, atomic, false, false},  // atomic after deterministic, same V and N
      {1, det, false, true},      // larger N
      {2, atomic, false, false},  // larger V
      {2, det, false, false},     // deterministic after atomic, same V and N
      {1, atomic, false, true},   // smaller V, hot rows
      {3, det, false, false},     // larger V and N, several scan tiles
      {0, atomic, false, false},  // much smaller after larger
      {3, atomic, false, false},  // larger after smaller, hot rows
      {0, det, true, false},      // deterministic after atomic, smaller; checked ids
      {2, det, false, false},     // larger after smaller
      {2, atomic, true, false},   // checked ids
      {1, det, false, true},      // smaller
      {3, det, false, false},     // larger
      {1, atomic, false, false},  // smaller after larger, hot rows
  };
  const void* ws = grow_workspace(stream());
  std::vector<std::vector<uint8_t>> baseline[2];  // [w16][problem]: first deterministic result
  baseline[0].resize(pbs.size());
  baseline[1].resize(pbs.size());
  int step_no = 0;
  for (const Step& st : steps) {
    const Problem& pb = pbs[static_cast<size_t>(st.problem)];
    const DType wdt = st.w16 ? dt : DType::f32;
    SCOPED_TRACE(std::string("step ") + std::to_string(step_no++) + ": problem " + pb.name +
                 (st.mode == det ? " deterministic" : " atomic") + ", dweight " + dtype_name(wdt));
    DeviceTensor dw = test::alloc(wdt, {pb.vocab, dim});
    embedding_backward(pb.it.t, pb.g.t, dw.t, st.mode, st.check_ids, stream());
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(dw), pb.rdw, wdt, pb.scale));
    EXPECT_TRUE(workspace_zeroed(stream(), ws));
    if (st.mode == det) {
      std::vector<uint8_t>& base = baseline[st.w16][static_cast<size_t>(st.problem)];
      if (base.empty())
        base = test::download_bytes(dw);
      else
        EXPECT_TRUE(test::bit_exact(test::download_bytes(dw), base, dtype_size(wdt)));
    }
  }
  // Captured atomic call of A after an eager deterministic one (the workspace is large
  // enough: the full path is captured); each replay, dweight poisoned before, must leave the
  // workspace zeroed for the next.
  const Problem& a = pbs[0];
  DeviceTensor dw = test::alloc(DType::f32, {a.vocab, dim});
  embedding_backward(a.it.t, a.g.t, dw.t, det, false, stream());
  sync();
  EXPECT_TRUE(workspace_zeroed(stream(), ws));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TESSEL_TEST_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
  try {
    embedding_backward(a.it.t, a.g.t, dw.t, atomic, false, stream());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw under capture: " << e.what();
  }
  TESSEL_TEST_CUDA(cudaStreamEndCapture(stream(), &graph));
  EXPECT_GE(kernel_nodes(graph), 5u) << "expected the full atomic path in the graph";
  TESSEL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    test::poison(dw);
    TESSEL_TEST_CUDA(cudaGraphLaunch(exec, stream()));
    sync();
    EXPECT_TRUE(test::all_close(test::download_values(dw), a.rdw, DType::f32, a.scale))
        << "replay " << rep;
    EXPECT_TRUE(workspace_zeroed(stream(), ws)) << "replay " << rep;
    // A deterministic call between the replays: the next replay runs after it.
    DeviceTensor dwd = test::alloc(DType::f32, {a.vocab, dim});
    embedding_backward(a.it.t, a.g.t, dwd.t, det, false, stream());
    sync();
    EXPECT_TRUE(test::bit_exact(test::download_bytes(dwd), baseline[0][0], 4));
    EXPECT_TRUE(workspace_zeroed(stream(), ws));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingWorkspaceGpu, ::testing::ValuesIn(test::kFloatDTypes),
                         test::dtype_param_name);

}  // namespace
}  // namespace tessel
