// The engine's GPU backend: every Backend op on tessel's public kernels, bf16 on the device.
// Weights are uploaded once as bf16 (matrices (N, K) row-major = tessel::gemm's B in nk layout,
// biases fused in its epilogue); activations are bf16 device buffers; only download() syncs.
//
// Steps. begin_step() packs the step's small host arrays (token ids, positions, logits rows,
// cos/sin tables, per-sequence lengths and block tables) into one pinned buffer and copies it
// with ONE cudaMemcpyAsync into a fixed device buffer; the ops of the step read from there.
// run_step() with a key >= 0 (Model's decode steps of one batch size) records the step's
// launches into a CUDA graph on its second occurrence (the first runs eagerly, so tessel's
// autotuner and per-stream scratch are settled before capture) and replays the graph from then
// on: a replay is the input copy plus one cudaGraphLaunch. TESSEL_CUDA_GRAPHS=0 turns graphs
// off. Steps launch with programmatic dependent launch (TESSEL_DEPENDENT_LAUNCH=0 turns it
// off). A recorded step is only valid while the buffers it captured live: growing the KV pool
// or the input buffer, or kv_reserve(), drops every graph.
//
// KV cache: a paged pool per layer, (pages, page_size, kv_dim) for K and for V, page_size 64
// (TESSEL_KV_PAGE_SIZE overrides). Each slot owns a list of pages, allocated on the host as its
// sequence grows (begin_step), returned when a step rewrites the slot from an earlier position
// or kv_free(); the pool grows by doubling up to slots · ceil(max_seq / page_size) pages, so
// memory follows the tokens actually cached.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "llm/backend.hpp"
#include "llm/op_profile.hpp"
#include "ops/attention_decode/decode_rope_append.hpp"
#include "ops/gemm/gemm_small_m.hpp"
#include "ops/llm_engine/argmax_rows.hpp"
#include "ops/llm_engine/rope_tables.hpp"
#include "runtime/check.hpp"
#include "tessel/activation.hpp"
#include "tessel/attention.hpp"
#include "tessel/decode_attention.hpp"
#include "tessel/embedding.hpp"
#include "tessel/gemm.hpp"
#include "tessel/launch.hpp"
#include "tessel/norm.hpp"
#include "tessel/ops.hpp"

namespace tessel::llm {
namespace {

uint16_t to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT, std::string("tessel::llm_gpu_") + op + ": " + what);
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

// A device copy of a small host array, for ops called outside a step (tests, tools).
struct Staged {
  void* dev = nullptr;
  size_t capacity = 0;
};

// Consecutive rows of one slot at consecutive positions: one decode_attention "sequence".
struct Run {
  int64_t start = 0, len = 0;
  int32_t slot = 0, seqlen = 0;  // seqlen: last position + 1
};

// Byte offsets of the parts of a step's input buffer (each 256-byte aligned).
struct InputLayout {
  size_t tokens = 0, pos = 0, rows = 0, cos = 0, sin = 0, seqlens = 0, seq_each = 0, table = 0;
  size_t total = 0;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// What a recorded step depends on besides the buffers: the model's key and the step's shape.
using GraphKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, int64_t>;

class GpuBackend final : public Backend {
 public:
  GpuBackend() {
    TESSEL_CUDA_CHECK(cudaGetDevice(&device_));
    TESSEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Keep freed scratch in the pool: Model::forward allocates and frees prefill scratch.
    cudaMemPool_t pool;
    TESSEL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep = UINT64_MAX;
    TESSEL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cudaDeviceProp prop{};
    TESSEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
    TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&input_copied_, cudaEventDisableTiming));
    const char* g = std::getenv("TESSEL_CUDA_GRAPHS");
    graphs_enabled_ = !(g && std::string(g) == "0");
    const char* dl = std::getenv("TESSEL_DEPENDENT_LAUNCH");
    dependent_launch_ = !(dl && std::string(dl) == "0");
  }
  ~GpuBackend() override {
    cudaStreamSynchronize(stream_);
    if (const std::string r = profile_.report(); !r.empty()) std::fputs(r.c_str(), stderr);
    drop_graphs();
    for (Staged* s : {&tokens_, &positions_, &cos_, &sin_, &rows_})
      if (s->dev) cudaFreeAsync(s->dev, stream_);
    for (void* p : {k_pool_, v_pool_, input_dev_, pos_tmp_, ids_dev_, picks_[0].dev, picks_[1].dev})
      if (p) cudaFreeAsync(p, stream_);
    cudaStreamSynchronize(stream_);
    if (input_host_) cudaFreeHost(input_host_);
    if (download_host_) cudaFreeHost(download_host_);
    if (ids_host_) cudaFreeHost(ids_host_);
    for (Picks& p : picks_) {
      if (p.host) cudaFreeHost(p.host);
      if (p.ready) cudaEventDestroy(p.ready);
    }
    cudaEventDestroy(input_copied_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override {
    return "gpu (bf16, " + device_name_ + (graphs_enabled_ ? ", CUDA graphs)" : ")");
  }

  // ---- memory
  Buf upload(const HostTensor& t) override {
    const int64_t rows = t.shape.size() > 1 ? t.shape[0] : 1;
    Buf b = alloc(rows, t.numel() / std::max<int64_t>(rows, 1));
    std::vector<uint16_t> h(t.data.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(t.data[i]);
    // Synchronous: `h` dies here, and uploads happen at load time only.
    TESSEL_CUDA_CHECK(
        cudaMemcpyAsync(b.ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice, stream_));
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return b;
  }
  Buf alloc(int64_t rows, int64_t cols) override {
    Buf b;
    b.rows = rows;
    b.cols = cols;
    TESSEL_CUDA_CHECK(cudaMallocAsync(&b.ptr, std::max<size_t>(bytes(b), 16), stream_));
    bytes_ += bytes(b);
    return b;
  }
  void release(Buf& b) override {
    if (!b.ptr) return;
    TESSEL_CUDA_CHECK(cudaFreeAsync(b.ptr, stream_));
    bytes_ -= bytes(b);
    b = Buf{};
  }
  void download(const Buf& b, float* dst) override {
    // Through a kept pinned buffer: batch-16 logits of a 128k vocabulary are 4 MB per step.
    const size_t n = static_cast<size_t>(b.rows * b.cols);
    if (n * 2 > download_capacity_) {
      if (download_host_) TESSEL_CUDA_CHECK(cudaFreeHost(download_host_));
      download_host_ = nullptr;
      download_capacity_ = std::max<size_t>(n * 2, 1 << 20);
      TESSEL_CUDA_CHECK(cudaMallocHost(&download_host_, download_capacity_));
    }
    if (b.ld == 0 || b.ld == b.cols)
      TESSEL_CUDA_CHECK(
          cudaMemcpyAsync(download_host_, b.ptr, n * 2, cudaMemcpyDeviceToHost, stream_));
    else
      TESSEL_CUDA_CHECK(cudaMemcpy2DAsync(download_host_, b.cols * 2, b.ptr, b.ld * 2, b.cols * 2,
                                          b.rows, cudaMemcpyDeviceToHost, stream_));
    const auto w0 = std::chrono::steady_clock::now();
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the one sync of a step
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    const auto* h = static_cast<const uint16_t*>(download_host_);
    for (size_t i = 0; i < n; ++i) dst[i] = from_bf16(h[i]);
  }
  bool argmax_rows(const Buf& b, int32_t* out) override {
    if (b.rows <= 0) return true;
    const size_t n = static_cast<size_t>(b.rows) * 4;
    if (n > ids_capacity_) {
      if (ids_dev_) TESSEL_CUDA_CHECK(cudaFreeAsync(ids_dev_, stream_));
      if (ids_host_) TESSEL_CUDA_CHECK(cudaFreeHost(ids_host_));
      ids_capacity_ = std::max<size_t>(n, 1024);
      TESSEL_CUDA_CHECK(cudaMallocAsync(&ids_dev_, ids_capacity_, stream_));
      TESSEL_CUDA_CHECK(cudaMallocHost(&ids_host_, ids_capacity_));
    }
    llm_engine::argmax_rows_bf16(b.ptr, b.rows, b.cols, b.pitch(), static_cast<int32_t*>(ids_dev_),
                                 stream_);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(ids_host_, ids_dev_, n, cudaMemcpyDeviceToHost, stream_));
    const auto w0 = std::chrono::steady_clock::now();
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the one sync of a greedy step
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    std::memcpy(out, ids_host_, n);
    return true;
  }
  bool can_pipeline_greedy() const override { return pipeline_enabled_ && !profile_.on(); }
  void argmax_rows_start(const Buf& b) override {
    if (pending_.size() >= 2)
      fail("argmax_rows_start", "'pending picks' expected at most 2 unfinished, got 3");
    const int i = next_pick_;
    Picks& p = picks_[i];
    const size_t n = static_cast<size_t>(std::max<int64_t>(b.rows, 1)) * 4;
    if (n > p.capacity) {  // this slot's last download was finished: nothing reads it now
      if (p.dev) TESSEL_CUDA_CHECK(cudaFreeAsync(p.dev, stream_));
      if (p.host) TESSEL_CUDA_CHECK(cudaFreeHost(p.host));
      p.capacity = std::max<size_t>(n, 1024);
      TESSEL_CUDA_CHECK(cudaMallocAsync(&p.dev, p.capacity, stream_));
      TESSEL_CUDA_CHECK(cudaMallocHost(&p.host, p.capacity));
      if (!p.ready) TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&p.ready, cudaEventDisableTiming));
    }
    p.rows = b.rows;
    if (b.rows > 0) {
      llm_engine::argmax_rows_bf16(b.ptr, b.rows, b.cols, b.pitch(), static_cast<int32_t*>(p.dev),
                                   stream_);
      TESSEL_CUDA_CHECK(cudaMemcpyAsync(p.host, p.dev, static_cast<size_t>(b.rows) * 4,
                                        cudaMemcpyDeviceToHost, stream_));
    }
    TESSEL_CUDA_CHECK(cudaEventRecord(p.ready, stream_));
    pending_.push_back(i);
    last_pick_ = i;
    next_pick_ ^= 1;
  }
  void argmax_rows_finish(int32_t* out) override {
    if (pending_.empty()) fail("argmax_rows_finish", "'pending picks' expected one, got none");
    Picks& p = picks_[pending_.front()];
    pending_.pop_front();
    const auto w0 = std::chrono::steady_clock::now();
    TESSEL_CUDA_CHECK(cudaEventSynchronize(p.ready));
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    std::memcpy(out, p.host, static_cast<size_t>(p.rows) * 4);
  }
  void feed_picked_tokens() override {
    if (last_pick_ < 0) fail("feed_picked_tokens", "'picks' expected a started argmax, got none");
    feed_next_ = true;
  }
  double device_wait_seconds() const override { return wait_seconds_; }
  size_t bytes_in_use() const override { return bytes_ + 2 * pool_bytes(pool_pages_); }
  Buf cols_view(const Buf& b, int64_t col0, int64_t n) const override {
    if (col0 < 0 || n < 0 || col0 + n > b.cols || b.ld != 0)
      fail("cols_view", "'b' expected a dense buffer of >= " + std::to_string(col0 + n) +
                            " cols, got (" + std::to_string(b.rows) + ", " +
                            std::to_string(b.cols) + ") pitch " + std::to_string(b.pitch()));
    Buf v;
    v.ptr = static_cast<uint16_t*>(b.ptr) + col0;
    v.rows = b.rows;
    v.cols = n;
    v.ld = b.cols;
    return v;
  }

  // ---- KV cache
  void kv_reserve(int64_t n_layers, int64_t slots, int64_t max_seq, int64_t kv_dim) override {
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    drop_graphs();
    for (void** p : {&k_pool_, &v_pool_})
      if (*p) {
        TESSEL_CUDA_CHECK(cudaFreeAsync(*p, stream_));
        *p = nullptr;
      }
    n_layers_ = n_layers;
    slots_ = slots;
    max_seq_ = max_seq;
    kv_dim_ = kv_dim;
    page_size_ = std::clamp<int64_t>(env_int("TESSEL_KV_PAGE_SIZE", 64), 1, 1 << 16);
    pages_per_slot_ = (max_seq + page_size_ - 1) / page_size_;
    table_width_ = (pages_per_slot_ + 3) / 4 * 4;  // rows of the block table stay 16-byte aligned
    max_pool_pages_ = slots * pages_per_slot_;
    pool_pages_ = 0;
    slot_pages_.assign(static_cast<size_t>(slots), {});
    free_pages_.clear();
    step_ = StepInputs{};
  }
  void kv_free(int64_t slot) override {
    if (slot < 0 || slot >= slots_)
      fail("kv_free",
           "'slot' expected < " + std::to_string(slots_) + ", got " + std::to_string(slot));
    std::vector<int32_t>& pages = slot_pages_[slot];
    free_pages_.insert(free_pages_.end(), pages.rbegin(), pages.rend());
    pages.clear();
  }

  // ---- steps
  void begin_step(const StepInputs& in) override {
    if (!k_pool_ && max_pool_pages_ == 0)
      fail("kv_store", "'kv cache' expected kv_reserve() first, got none");
    for (int64_t r = 0; r < in.rows; ++r)
      if (in.slot[r] < 0 || in.slot[r] >= slots_ || in.pos[r] < 0 || in.pos[r] >= max_seq_)
        fail("kv_cache", "'slot/pos' expected slot < " + std::to_string(slots_) + " and pos < " +
                             std::to_string(max_seq_) + ", got " + std::to_string(in.slot[r]) +
                             "/" + std::to_string(in.pos[r]));
    // Runs of the step.
    runs_.clear();
    for (int64_t r = 0; r < in.rows; ++r) {
      if (r > 0 && in.slot[r] == in.slot[r - 1] && in.pos[r] == in.pos[r - 1] + 1) {
        ++runs_.back().len;
        ++runs_.back().seqlen;
      } else {
        runs_.push_back({r, 1, in.slot[r], in.pos[r] + 1});
      }
    }
    uniform_ = true;
    for (const Run& run : runs_) uniform_ = uniform_ && run.len == runs_[0].len;
    // Pages: each slot written by this step keeps exactly the pages of positions 0..last.
    std::map<int32_t, int32_t> last;
    for (int64_t r = 0; r < in.rows; ++r) {
      auto [it, fresh] = last.emplace(in.slot[r], in.pos[r]);
      if (!fresh) it->second = std::max(it->second, in.pos[r]);
    }
    int64_t missing = 0;
    for (const auto& [slot, p] : last) {
      std::vector<int32_t>& pages = slot_pages_[slot];
      const size_t need = static_cast<size_t>(p / page_size_ + 1);
      while (pages.size() > need) free_pages_.push_back(pages.back()), pages.pop_back();
      missing += static_cast<int64_t>(need - pages.size());
    }
    grow_pool(missing);
    for (const auto& [slot, p] : last) {
      std::vector<int32_t>& pages = slot_pages_[slot];
      while (pages.size() < static_cast<size_t>(p / page_size_ + 1)) {
        pages.push_back(free_pages_.back());
        free_pages_.pop_back();
      }
    }
    // Pack the inputs.
    const int64_t n = static_cast<int64_t>(runs_.size());
    InputLayout L;
    size_t at = 0;
    auto part = [&](size_t bytes) {
      const size_t off = at;
      at += align256(bytes);
      return off;
    };
    L.tokens = part(in.tokens ? in.rows * 4 : 0);
    L.pos = part(in.rows * 4);
    L.rows = part(in.n_logits * 8);
    L.cos = part(in.cos ? in.rows * in.rope_half * 4 : 0);
    L.sin = part(in.cos ? in.rows * in.rope_half * 4 : 0);
    L.seqlens = part(n * 4);
    L.seq_each = part(n * 16);
    L.table = part(n * table_width_ * 4);
    L.total = at;
    ensure_input_capacity(L.total);
    // The previous step's copy out of the pinned buffer must be done before it is rewritten.
    TESSEL_CUDA_CHECK(cudaEventSynchronize(input_copied_));
    auto* h = static_cast<unsigned char*>(input_host_);
    if (in.tokens) std::memcpy(h + L.tokens, in.tokens, in.rows * 4);
    std::memcpy(h + L.pos, in.pos, in.rows * 4);
    if (in.n_logits) std::memcpy(h + L.rows, in.logits_rows, in.n_logits * 8);
    if (in.cos) {
      std::memcpy(h + L.cos, in.cos, in.rows * in.rope_half * 4);
      std::memcpy(h + L.sin, in.sin, in.rows * in.rope_half * 4);
    }
    auto* seqlens = reinterpret_cast<int32_t*>(h + L.seqlens);
    auto* each = reinterpret_cast<int32_t*>(h + L.seq_each);
    auto* table = reinterpret_cast<int32_t*>(h + L.table);
    std::memset(each, 0, n * 16);
    std::memset(table, 0, n * table_width_ * 4);
    for (int64_t i = 0; i < n; ++i) {
      seqlens[i] = runs_[i].seqlen;
      each[4 * i] = runs_[i].seqlen;
      const std::vector<int32_t>& pages = slot_pages_[runs_[i].slot];
      std::copy(pages.begin(), pages.end(), table + i * table_width_);
    }
    TESSEL_CUDA_CHECK(
        cudaMemcpyAsync(input_dev_, input_host_, L.total, cudaMemcpyHostToDevice, stream_));
    TESSEL_CUDA_CHECK(cudaEventRecord(input_copied_, stream_));
    if (feed_next_) {  // the token ids are the last started argmax's picks, still on the device
      feed_next_ = false;
      const Picks& p = picks_[last_pick_];
      if (!in.tokens || p.rows != in.rows)
        fail("begin_step", "'fed tokens' expected " + std::to_string(in.rows) + " picks, got " +
                               std::to_string(p.rows));
      TESSEL_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(input_dev_) + L.tokens, p.dev,
                                        static_cast<size_t>(in.rows) * 4, cudaMemcpyDeviceToDevice,
                                        stream_));
    }
    step_ = in;
    in_ = L;
    in_step_ = true;
  }

  void run_step(int64_t key, const std::function<void()>& ops) override {
    struct End {
      GpuBackend* b;
      ~End() { b->in_step_ = false; }  // later direct op calls do not see this step's inputs
    } end{this};
    // The step's kernels may start while their predecessor drains (include/tessel/launch.hpp):
    // the small-M GEMMs stream their weights during the previous kernel's tail.
    if (profile_.on()) {  // eager, no dependent launch: each op's time is its own
      profile_.begin_step(key >= 0, step_.rows, stream_);
      ops();
      profile_.end_step();
      return;
    }
    const DependentLaunchScope dependent(dependent_launch_);
    if (key < 0 || !graphs_enabled_) return ops();
    const GraphKey gk{key,
                      step_.rows,
                      step_.n_logits,
                      static_cast<int64_t>(runs_.size()),
                      runs_.empty() ? 0 : runs_[0].len,
                      uniform_,
                      step_.rope_half,
                      plan_len()};
    if (auto it = graphs_.find(gk); it != graphs_.end()) {
      TESSEL_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
      return;
    }
    // The first step of a shape runs eagerly: it tunes GEMM configs and sizes the per-stream
    // scratch that the capture then reuses (no tuning, allocation or sync inside a capture).
    if (warmed_.insert(gk).second) return ops();
    TESSEL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
      ops();
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    cudaGraph_t g = nullptr;
    TESSEL_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    TESSEL_CUDA_CHECK(err);
    graphs_[gk] = exec;
    TESSEL_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  }

  // ---- ops
  void embedding(const int32_t* tokens, const Buf& table, Buf& out) override {
    void* ids_dev = nullptr;
    if (in_step_ && tokens == step_.tokens && out.rows == step_.rows) {
      ids_dev = input(in_.tokens);
    } else {
      for (int64_t r = 0; r < out.rows; ++r)
        if (tokens[r] < 0 || tokens[r] >= table.rows)
          fail("embedding", "'tokens' expected ids in [0, " + std::to_string(table.rows) +
                                "), got " + std::to_string(tokens[r]));
      ids_dev = stage(tokens_, tokens, out.rows * 4);
    }
    const Tensor ids = Tensor::contiguous(ids_dev, DType::i32, {out.rows});
    Tensor o = mat(out);
    tessel::embedding(ids, mat(table), o, false, stream_);
    mark("embedding", 0, [&] { return dims(out); });
  }
  void add_rows(const int32_t* positions, const Buf& table, Buf& x) override {
    for (int64_t r = 0; r < x.rows; ++r)
      if (positions[r] < 0 || positions[r] >= table.rows)
        fail("add_rows", "'positions' expected [0, " + std::to_string(table.rows) + "), got " +
                             std::to_string(positions[r]));
    void* ids_dev = in_step_ && positions == step_.pos && x.rows == step_.rows
                        ? input(in_.pos)
                        : stage(positions_, positions, x.rows * 4);
    const Tensor ids = Tensor::contiguous(ids_dev, DType::i32, {x.rows});
    // A kept scratch (grown outside captures: the eager first step of a shape sizes it).
    const size_t need = static_cast<size_t>(x.rows * x.cols) * 2;
    if (need > pos_tmp_bytes_) {
      if (pos_tmp_) TESSEL_CUDA_CHECK(cudaFreeAsync(pos_tmp_, stream_));
      TESSEL_CUDA_CHECK(cudaMallocAsync(&pos_tmp_, need, stream_));
      pos_tmp_bytes_ = need;
    }
    Tensor t = Tensor::contiguous(pos_tmp_, DType::bf16, {x.rows, x.cols}), xt = mat(x);
    tessel::embedding(ids, mat(table), t, false, stream_);
    tessel::add(xt, t, xt, stream_);
    mark("add_rows", 0, [&] { return dims(x); });
  }
  void rms_norm(const Buf& x, const Buf& w, float eps, Buf& out) override {
    Tensor o = mat(out);
    tessel::rms_norm(mat(x), vec(w), o, nullptr, eps, stream_);
    mark("rms_norm", 0, [&] { return dims(x); });
  }
  void add_rms_norm(Buf& x, const Buf& y, const Buf& w, float eps, Buf& out) override {
    Tensor h = mat(x), o = mat(out);
    tessel::rms_norm_add(mat(x), mat(y), vec(w), h, o, nullptr, eps, stream_);
    mark("add_rms_norm", 0, [&] { return dims(x); });
  }
  void layer_norm(const Buf& x, const Buf& w, const Buf& b, float eps, Buf& out) override {
    Tensor o = mat(out);
    const Tensor bt = b ? vec(b) : Tensor{};
    tessel::layer_norm(mat(x), vec(w), b ? &bt : nullptr, o, nullptr, nullptr, eps, stream_);
    mark("layer_norm", 0, [&] { return dims(x); });
  }
  void matmul(const Buf& x, const Buf& w, const Buf* bias, Buf& out) override {
    GemmOptions opt;
    const Tensor bt = bias && *bias ? vec(*bias) : Tensor{};
    if (bias && *bias) opt.bias = &bt;
    Tensor o = mat(out);
    tessel::gemm(mat(x), mat(w), o, stream_, opt);
    mark("matmul", 2.0 * static_cast<double>(w.rows * w.cols),
         [&] { return dims(x) + " x " + dims(w); });
  }
  void rope(Buf& x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, RopeStyle style,
            const float* cos, const float* sin) override {
    if (style == RopeStyle::none) return;
    if (x.cols != n_heads * head_dim || rope_dim % 2 != 0 || rope_dim > head_dim)
      fail("rope", "'x' expected (rows, " + std::to_string(n_heads * head_dim) +
                       ") and an even rope_dim <= head_dim, got cols " + std::to_string(x.cols) +
                       ", rope_dim " + std::to_string(rope_dim));
    const float* c;
    const float* s;
    if (in_step_ && cos == step_.cos && x.rows == step_.rows && rope_dim / 2 == step_.rope_half) {
      c = static_cast<const float*>(input(in_.cos));
      s = static_cast<const float*>(input(in_.sin));
    } else {
      const size_t n = static_cast<size_t>(x.rows * (rope_dim / 2)) * 4;
      c = static_cast<const float*>(stage(cos_, cos, n));
      s = static_cast<const float*>(stage(sin_, sin, n));
    }
    llm_engine::rope_tables_bf16(x.ptr, x.rows, x.pitch(), n_heads, head_dim, rope_dim,
                                 style == RopeStyle::neox, c, s, stream_);
    mark("rope", 0, [&] { return dims(x); });
  }
  // Whether this step's tables and paged pool serve a RoPE of qk (q heads, then the k heads of
  // k) whose k / v rows go to the cache: what the fused rope kernels have in common.
  bool step_rope_applies(const Buf& qk, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         int64_t rope_dim, RopeStyle style, const float* cos, const Buf& k,
                         const Buf& v, const RowLayout& rows) const {
    return style != RopeStyle::none && in_step_ && cos == step_.cos && qk.rows == step_.rows &&
           rope_dim / 2 == step_.rope_half && rope_dim % 2 == 0 && rope_dim <= head_dim &&
           n_kv_heads * head_dim == kv_dim_ && max_pool_pages_ > 0 &&
           k.ptr == static_cast<uint16_t*>(qk.ptr) + n_heads * head_dim && k.cols == kv_dim_ &&
           v.cols == kv_dim_ && v.rows == k.rows && k.rows == rows.rows;
  }
  void rope_kv_store(int64_t layer, Buf& qk, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     int64_t rope_dim, RopeStyle style, const float* cos, const float* sin,
                     const Buf& k, const Buf& v, const RowLayout& rows) override {
    // One launch per call: rotation of q and k and the cache append (llm_engine::rope_append).
    const bool fusable =
        step_rope_applies(qk, n_heads, n_kv_heads, head_dim, rope_dim, style, cos, k, v, rows) &&
        qk.cols == (n_heads + n_kv_heads) * head_dim && k.pitch() == qk.pitch();
    if (!fusable)
      return Backend::rope_kv_store(layer, qk, n_heads, n_kv_heads, head_dim, rope_dim, style, cos,
                                    sin, k, v, rows);
    ensure_layout(rows);
    fresh_k_ = k;
    fresh_v_ = v;
    fresh_layer_ = layer;
    const auto* c = static_cast<const float*>(input(in_.cos));
    const auto* s = static_cast<const float*>(input(in_.sin));
    const Tensor kc = cache_view(k_pool_, layer, kv_dim_), vc = cache_view(v_pool_, layer, kv_dim_);
    for_each_call(
        [&](int64_t start, int64_t B, int64_t Sq, const Tensor& seqlens, const Tensor& table) {
          llm_engine::RopeAppendArgs a{};
          a.qk = static_cast<uint16_t*>(qk.ptr) + start * qk.pitch();
          a.ld = qk.pitch();
          a.v = static_cast<const uint16_t*>(v.ptr) + start * v.pitch();
          a.v_ld = v.pitch();
          a.rows = B * Sq;
          a.hq = static_cast<int>(n_heads);
          a.hkv = static_cast<int>(n_kv_heads);
          a.head_dim = static_cast<int>(head_dim);
          a.rope_dim = static_cast<int>(rope_dim);
          a.neox = style == RopeStyle::neox;
          a.cos = c + start * (rope_dim / 2);
          a.sin = s + start * (rope_dim / 2);
          a.k_cache = kc.data;
          a.v_cache = vc.data;
          a.page_size = static_cast<int>(page_size_);
          a.num_pages = static_cast<int>(pool_pages_);
          a.seqlens = static_cast<const int32_t*>(seqlens.data);
          a.block_table = static_cast<const int32_t*>(table.data);
          a.table_stride = table.strides[0];
          a.max_pages = static_cast<int>(table.shape[1]);
          a.sq = static_cast<int>(Sq);
          llm_engine::rope_append_bf16(a, stream_);
        });
    mark("rope_kv_store", 0, [&] { return dims(qk); });
  }
  // Steps whose attention runs the decode kernel (no run long enough for the tiled prefill
  // kernel): RoPE and the cache append inside the decode kernel
  // (detail::decode_attention_rope_append, the bits of rope_append + decode_attention), one
  // launch and one kernel boundary fewer per layer. TESSEL_FUSE_ROPE_ATTENTION=0: two launches.
  void rope_kv_attention(int64_t layer, Buf& qk, const Buf& q, int64_t n_heads, int64_t n_kv_heads,
                         int64_t head_dim, int64_t rope_dim, RopeStyle style, const float* cos,
                         const float* sin, const Buf& k, const Buf& v, const RowLayout& rows,
                         Buf& out) override {
    bool fusable =
        fuse_rope_attention_ &&
        step_rope_applies(qk, n_heads, n_kv_heads, head_dim, rope_dim, style, cos, k, v, rows) &&
        rope_dim % 16 == 0 && (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
        q.ptr == qk.ptr && q.cols == n_heads * head_dim && out.cols == q.cols;
    if (fusable && prefill_kernel_)  // (a run of prefill_min_rows_ may take the tiled kernel)
      for (const Run& r : runs_) fusable = fusable && r.len < prefill_min_rows_;
    if (fusable && timing_skip_attention_) return;
    if (!fusable)
      return Backend::rope_kv_attention(layer, qk, q, n_heads, n_kv_heads, head_dim, rope_dim,
                                        style, cos, sin, k, v, rows, out);
    ensure_layout(rows);
    fresh_layer_ = -1;
    const auto* c = static_cast<const float*>(input(in_.cos));
    const auto* sn = static_cast<const float*>(input(in_.sin));
    const int64_t half = rope_dim / 2;
    Tensor kc = cache_view(k_pool_, layer, head_dim), vc = cache_view(v_pool_, layer, head_dim);
    for_each_call(
        [&](int64_t start, int64_t B, int64_t Sq, const Tensor& seqlens, const Tensor& table) {
          const Tensor qv = rows_view(q, start, B, Sq, n_heads, head_dim);
          const Tensor kn = rows_view(k, start, B, Sq, n_kv_heads, head_dim);
          const Tensor vn = rows_view(v, start, B, Sq, n_kv_heads, head_dim);
          Tensor ov = rows_view(out, start, B, Sq, n_heads, head_dim);
          const Tensor ct =
              Tensor::contiguous(const_cast<float*>(c) + start * half, DType::f32, {B * Sq, half});
          const Tensor st =
              Tensor::contiguous(const_cast<float*>(sn) + start * half, DType::f32, {B * Sq, half});
          detail::DecodeRopeAppend ra;
          ra.k_new = &kn;
          ra.v_new = &vn;
          ra.cos = &ct;
          ra.sin = &st;
          ra.rope_dim = rope_dim;
          ra.neox = style == RopeStyle::neox;
          DecodeParams p;
          p.block_table = &table;
          p.max_seqlen = plan_len();
          p.num_splits = decode_splits_;
          detail::decode_attention_rope_append(qv, ra, kc, vc, seqlens, ov, nullptr, p, stream_);
        });
    mark("rope+kv_store+attention", 0,
         [&] { return dims(q) + " (decode kernel, rope and append fused)"; });
  }
  void kv_store(int64_t layer, const Buf& k, const Buf& v, const RowLayout& rows) override {
    if (max_pool_pages_ == 0) fail("kv_store", "'kv cache' expected kv_reserve() first, got none");
    if (k.cols != kv_dim_ || v.cols != kv_dim_ || v.rows != k.rows || k.rows != rows.rows)
      fail("kv_store", "'k/v' expected (" + std::to_string(rows.rows) + ", " +
                           std::to_string(kv_dim_) + "), got (" + std::to_string(k.rows) + ", " +
                           std::to_string(k.cols) + ")");
    ensure_layout(rows);
    // attention() of this layer may read these rows directly (prompts that start the sequence).
    fresh_k_ = k;
    fresh_v_ = v;
    fresh_layer_ = layer;
    // A cache row is kv_dim contiguous elements whatever the head split: append whole rows.
    const int64_t D = kv_dim_;
    for_each_call(
        [&](int64_t start, int64_t B, int64_t Sq, const Tensor& seqlens, const Tensor& table) {
          const Tensor kn = rows_view(k, start, B, Sq, kv_dim_ / D, D);
          const Tensor vn = rows_view(v, start, B, Sq, kv_dim_ / D, D);
          Tensor kc = cache_view(k_pool_, layer, D), vc = cache_view(v_pool_, layer, D);
          tessel::append_kv(kn, vn, kc, vc, &table, seqlens, false, stream_);
        });
    mark("kv_store", 0, [&] { return dims(k); });
  }
  void attention(int64_t layer, const Buf& q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                 const RowLayout& rows, Buf& out) override {
    if (max_pool_pages_ == 0) fail("attention", "'kv cache' expected kv_reserve() first, got none");
    if (n_kv_heads * head_dim != kv_dim_ || q.cols != n_heads * head_dim || out.cols != q.cols)
      fail("attention", "'q/out' expected (rows, " + std::to_string(n_heads * head_dim) +
                            ") with n_kv_heads·head_dim " + std::to_string(kv_dim_) + ", got " +
                            std::to_string(q.cols) + "/" + std::to_string(out.cols) + ", " +
                            std::to_string(n_kv_heads * head_dim));
    ensure_layout(rows);
    const Tensor kc = cache_view(k_pool_, layer, head_dim);
    const Tensor vc = cache_view(v_pool_, layer, head_dim);
    // Prompt runs that start their sequence (position 0) see exactly the keys this step
    // stored: the tiled prefill kernel (TMA + WGMMA) can read them from the step's k/v rows,
    // far faster than the decode kernel for many queries (see prefill_min_rows_).
    const bool have_fresh = prefill_kernel_ && fresh_layer_ == layer && fresh_k_.rows == q.rows;
    fresh_layer_ = -1;
    int64_t call = 0;
    bool tiled = false;
    for_each_call(
        [&](int64_t start, int64_t B, int64_t Sq, const Tensor& seqlens, const Tensor& table) {
          const Tensor qv = rows_view(q, start, B, Sq, n_heads, head_dim);
          Tensor ov = rows_view(out, start, B, Sq, n_heads, head_dim);
          bool fresh = have_fresh && Sq >= prefill_min_rows_;
          for (int64_t i = uniform_ ? 0 : call; fresh && i < (uniform_ ? B : call + 1); ++i)
            fresh = runs_[i].seqlen == runs_[i].len;
          ++call;
          if (fresh) {
            const Tensor kv = rows_view(fresh_k_, start, B, Sq, n_kv_heads, head_dim);
            const Tensor vv = rows_view(fresh_v_, start, B, Sq, n_kv_heads, head_dim);
            AttentionParams ap;
            ap.causal = true;
            tessel::attention_forward(qv, kv, vv, ov, nullptr, ap, stream_);
            tiled = true;
            if (prefill_check_) check_prefill(layer, qv, kv, vv, ov, kc, vc, seqlens, table);
            return;
          }
          DecodeParams p;
          p.block_table = &table;
          p.max_seqlen = plan_len();
          p.num_splits = decode_splits_;
          tessel::decode_attention(qv, kc, vc, seqlens, ov, nullptr, p, stream_);
        });
    mark("attention", 0, [&] { return dims(q) + (tiled ? " (tiled)" : " (decode kernel)"); });
  }
  void silu_mul(const Buf& gate, const Buf& up, Buf& out) override {
    Tensor o = mat(out);
    tessel::swiglu(mat(gate), mat(up), o, stream_);
    mark("silu_mul", 0, [&] { return dims(out); });
  }
  // Decode rows (M <= 32, no bias, small-M kernel): the activation is computed inside the down
  // GEMM's A staging (detail::gemm_small_m_swiglu, bit-identical to swiglu + gemm): one launch
  // fewer per layer. TESSEL_FUSE_SWIGLU=0 keeps the two launches.
  void silu_mul_matmul(const Buf& gate_up, int64_t F, Buf& act, const Buf& w_down, const Buf* bias,
                       Buf& out) override {
    // Only where gemm would run the small-M kernel anyway (detail::gemm_small_m_preferred):
    // elsewhere the TMA kernel's rate beats the saved launch.
    if (fuse_swiglu_ && !(bias && *bias) && gate_up.rows <= 32 && gate_up.cols == 2 * F &&
        w_down.cols == F && out.rows == gate_up.rows && out.cols == w_down.rows &&
        detail::gemm_small_m_preferred(gate_up.rows, w_down.rows, false,
                                       detail::current_sm_count())) {
      Tensor o = mat(out);
      if (detail::gemm_small_m_swiglu(mat(gate_up), mat(w_down), o, GemmOptions{}, stream_)) {
        mark("silu_mul+matmul", 2.0 * static_cast<double>(w_down.rows * w_down.cols),
             [&] { return dims(gate_up) + " x " + dims(w_down); });
        return;
      }
    }
    Backend::silu_mul_matmul(gate_up, F, act, w_down, bias, out);
  }
  // The decode layer with its RMSNorms and residual adds inside the small-M GEMMs
  // (detail::gemm_small_m_rms: x · w_norm staged as A, the row scale on the sums; the residual
  // as C = D): two launches fewer per layer than the add+RMSNorm kernels. Each op falls back to
  // the unfused pair where the small-M kernel does not run the problem (bias, more rows, a
  // ring config whose A warps cannot stage the rows). TESSEL_FUSE_NORM=0: separate norms (A/B).
  bool fuses_norm_matmul(int64_t rows) const override { return fuse_norm_ && rows <= 16; }
  bool small_m_runs(int64_t rows, const Buf& w, const Buf* bias) const {
    return !(bias && *bias) && rows <= 32 &&
           detail::gemm_small_m_preferred(rows, w.rows, false, detail::current_sm_count());
  }
  void norm_matmul(const Buf& x, const Buf& w_norm, float eps, const Buf& w, const Buf* bias,
                   Buf& xn, Buf& out) override {
    if (small_m_runs(x.rows, w, bias)) {
      Tensor o = mat(out);
      if (detail::gemm_small_m_rms(mat(x), vec(w_norm), eps, mat(w), o, GemmOptions{}, stream_)) {
        mark("rms_norm+matmul", 2.0 * static_cast<double>(w.rows * w.cols),
             [&] { return dims(x) + " x " + dims(w); });
        return;
      }
    }
    Backend::norm_matmul(x, w_norm, eps, w, bias, xn, out);
  }
  // x += y · wᵀ: the residual as the GEMM's C (beta 1, C = D).
  void matmul_add(const Buf& y, const Buf& w, const Buf* bias, Buf& tmp, Buf& x) override {
    if (small_m_runs(y.rows, w, bias)) {
      Tensor xt = mat(x);
      GemmOptions opt;
      opt.c = &xt;
      opt.beta = 1.f;
      if (detail::gemm_small_m(mat(y), mat(w), xt, opt, stream_)) {
        mark("matmul+add", 2.0 * static_cast<double>(w.rows * w.cols),
             [&] { return dims(y) + " x " + dims(w); });
        return;
      }
    }
    Backend::matmul_add(y, w, bias, tmp, x);
  }
  void silu_mul_matmul_add(const Buf& gate_up, int64_t F, Buf& act, const Buf& w_down,
                           const Buf* bias, Buf& tmp, Buf& x) override {
    if (fuse_swiglu_ && gate_up.cols == 2 * F && w_down.cols == F &&
        small_m_runs(gate_up.rows, w_down, bias)) {
      Tensor xt = mat(x);
      GemmOptions opt;
      opt.c = &xt;
      opt.beta = 1.f;
      if (detail::gemm_small_m_swiglu(mat(gate_up), mat(w_down), xt, opt, stream_)) {
        mark("silu_mul+matmul+add", 2.0 * static_cast<double>(w_down.rows * w_down.cols),
             [&] { return dims(gate_up) + " x " + dims(w_down); });
        return;
      }
    }
    silu_mul(cols_view(gate_up, 0, F), cols_view(gate_up, F, F), act);
    matmul_add(act, w_down, bias, tmp, x);
  }
  void gelu(Buf& x) override {
    Tensor t = mat(x);
    tessel::gelu(t, t, GeluApprox::tanh, stream_);
    mark("gelu", 0, [&] { return dims(x); });
  }
  void add(Buf& x, const Buf& y) override {
    Tensor t = mat(x);
    tessel::add(t, mat(y), t, stream_);
    mark("add", 0, [&] { return dims(x); });
  }
  void gather_rows(const Buf& x, const int64_t* rows, int64_t n, Buf& out) override {
    void* ids_dev = nullptr;
    if (in_step_ && rows == step_.logits_rows && n == step_.n_logits) {
      ids_dev = input(in_.rows);
    } else {
      for (int64_t i = 0; i < n; ++i)
        if (rows[i] < 0 || rows[i] >= x.rows)
          fail("gather_rows", "'rows' expected [0, " + std::to_string(x.rows) + "), got " +
                                  std::to_string(rows[i]));
      ids_dev = stage(rows_, rows, n * 8);
    }
    const Tensor ids = Tensor::contiguous(ids_dev, DType::i64, {n});
    Tensor o = mat(out);
    tessel::embedding(ids, mat(x), o, false, stream_);
    mark("gather_rows", 0, [&] { return dims(out); });
  }

 private:
  // The decode kernels' split plan follows the cached lengths, not the table's capacity (a
  // 600-token sequence in a 128k-token table still spreads over the SMs). Rounded up to a power
  // of two: a recorded step stays valid while the lengths stay in its bucket (graph key).
  int64_t plan_len() const {
    if (!plan_decode_) return 0;  // TESSEL_DECODE_PLAN=0: plan for the table's capacity
    int64_t longest = 0;
    for (const Run& r : runs_) longest = std::max<int64_t>(longest, r.seqlen);
    int64_t p = 64;
    while (p < longest) p *= 2;
    return p;
  }
  // Ends the op `name` in the profile (TESSEL_PROFILE_OPS=1); the shape text is built only then.
  template <class Detail>
  void mark(const char* name, double streamed_bytes, Detail detail) {
    if (profile_.on()) profile_.mark(name, detail(), streamed_bytes);
  }
  static std::string dims(const Buf& b) {
    return std::to_string(b.rows) + "x" + std::to_string(b.cols);
  }
  static size_t bytes(const Buf& b) { return static_cast<size_t>(b.rows * b.cols) * 2; }
  static Tensor mat(const Buf& b) {
    Tensor t = Tensor::contiguous(b.ptr, DType::bf16, {b.rows, b.cols});
    t.strides[0] = b.pitch();
    return t;
  }
  static Tensor vec(const Buf& b) {
    return Tensor::contiguous(b.ptr, DType::bf16, {b.rows * b.cols});
  }
  void* input(size_t offset) const { return static_cast<unsigned char*>(input_dev_) + offset; }
  size_t pool_bytes(int64_t pages) const {
    return static_cast<size_t>(n_layers_ * pages * page_size_ * kv_dim_) * 2;
  }

  // Ops called outside a step: a pageable copy (not capturable; never used by Model::forward).
  void* stage(Staged& s, const void* host, size_t n) {
    if (n > s.capacity) {
      if (s.dev) TESSEL_CUDA_CHECK(cudaFreeAsync(s.dev, stream_));
      s.capacity = std::max<size_t>(n, 256);
      TESSEL_CUDA_CHECK(cudaMallocAsync(&s.dev, s.capacity, stream_));
    }
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(s.dev, host, n, cudaMemcpyHostToDevice, stream_));
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` may die after the call
    return s.dev;
  }

  void ensure_input_capacity(size_t bytes) {
    if (bytes <= input_capacity_) return;
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    drop_graphs();  // they captured the old device buffer
    if (input_host_) TESSEL_CUDA_CHECK(cudaFreeHost(input_host_));
    if (input_dev_) TESSEL_CUDA_CHECK(cudaFreeAsync(input_dev_, stream_));
    input_capacity_ = std::max<size_t>(bytes, 64 << 10);
    TESSEL_CUDA_CHECK(cudaMallocHost(&input_host_, input_capacity_));
    TESSEL_CUDA_CHECK(cudaMallocAsync(&input_dev_, input_capacity_, stream_));
  }

  // Makes `want` free pages available, growing the pool (at least doubling, at most every
  // slot's full length). Growing moves the pool: graphs that captured it are dropped.
  void grow_pool(int64_t want) {
    const int64_t lack = want - static_cast<int64_t>(free_pages_.size());
    if (lack > 0) {
      const int64_t grown = std::min(
          max_pool_pages_, std::max<int64_t>({2 * pool_pages_, pool_pages_ + lack, slots_, 4}));
      if (grown < pool_pages_ + lack)  // cannot happen: every slot fits max_seq
        fail("kv_cache",
             "'pages' expected at most " + std::to_string(max_pool_pages_) + " in use, got more");
      TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
      drop_graphs();
      for (void** p : {&k_pool_, &v_pool_}) {
        void* fresh = nullptr;
        TESSEL_CUDA_CHECK(
            cudaMallocAsync(&fresh, std::max<size_t>(pool_bytes(grown), 16), stream_));
        if (*p) {
          // Layer l's pages move from l·old to l·new pages into the pool.
          const size_t page_bytes = pool_bytes(1) / static_cast<size_t>(n_layers_);
          TESSEL_CUDA_CHECK(cudaMemcpy2DAsync(fresh, page_bytes * grown, *p,
                                              page_bytes * pool_pages_, page_bytes * pool_pages_,
                                              n_layers_, cudaMemcpyDeviceToDevice, stream_));
          TESSEL_CUDA_CHECK(cudaFreeAsync(*p, stream_));
        }
        *p = fresh;
      }
      for (int64_t i = grown - 1; i >= pool_pages_; --i)
        free_pages_.push_back(static_cast<int32_t>(i));
      pool_pages_ = grown;
    }
  }

  void drop_graphs() {
    for (auto& [k, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
    warmed_.clear();
  }

  // Direct kv_store / attention calls (not those of the current step) lay out their rows first.
  void ensure_layout(const RowLayout& rows) {
    if (in_step_ && rows.slot == step_.slot && rows.pos == step_.pos && rows.rows == step_.rows)
      return;
    StepInputs in;
    in.slot = rows.slot;
    in.pos = rows.pos;
    in.rows = rows.rows;
    begin_step(in);
    in_step_ = false;
  }

  // One decode_attention / append_kv call for all runs when they have one length (decode
  // steps, equal prompts), otherwise one call per run.
  template <class F>
  void for_each_call(F&& call) {
    const int64_t n = static_cast<int64_t>(runs_.size());
    auto* table = static_cast<int32_t*>(input(in_.table));
    if (uniform_) {
      const Tensor seqlens = Tensor::contiguous(input(in_.seqlens), DType::i32, {n});
      const Tensor t = Tensor::contiguous(table, DType::i32, {n, table_width_});
      call(0, n, runs_[0].len, seqlens, t);
      return;
    }
    auto* each = static_cast<int32_t*>(input(in_.seq_each));
    for (int64_t i = 0; i < n; ++i) {
      const Tensor seqlens = Tensor::contiguous(each + 4 * i, DType::i32, {1});
      const Tensor t = Tensor::contiguous(table + i * table_width_, DType::i32, {1, table_width_});
      call(runs_[i].start, 1, runs_[i].len, seqlens, t);
    }
  }

  // Rows start.. of a (rows, heads·D) buffer (dense or a column view) as (B, Sq, heads, D).
  static Tensor rows_view(const Buf& b, int64_t start, int64_t B, int64_t Sq, int64_t heads,
                          int64_t D) {
    Tensor t = Tensor::contiguous(static_cast<uint16_t*>(b.ptr) + start * b.pitch(), DType::bf16,
                                  {B, Sq, heads, D});
    t.strides[1] = b.pitch();
    t.strides[0] = Sq * b.pitch();
    return t;
  }
  // The pages of one layer, (pool_pages, page_size, kv_dim / D, D).
  Tensor cache_view(void* pool, int64_t layer, int64_t D) const {
    return Tensor::contiguous(
        static_cast<uint16_t*>(pool) + layer * pool_pages_ * page_size_ * kv_dim_, DType::bf16,
        {pool_pages_, page_size_, kv_dim_ / D, D});
  }

  int device_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  size_t bytes_ = 0;
  bool graphs_enabled_ = true;
  bool dependent_launch_ = true;  // TESSEL_DEPENDENT_LAUNCH=0 turns it off
  OpProfile profile_;             // TESSEL_PROFILE_OPS=1
  const int decode_splits_ =
      [] {  // TESSEL_DECODE_SPLITS=n: the decode KV splits (A/B; 0 heuristic)
        const char* e = std::getenv("TESSEL_DECODE_SPLITS");
        return e ? std::clamp(std::atoi(e), 0, 256) : 0;
      }();
  const bool plan_decode_ = [] {  // TESSEL_DECODE_PLAN=0: no max_seqlen hint (A/B)
    const char* e = std::getenv("TESSEL_DECODE_PLAN");
    return !(e && std::string(e) == "0");
  }();
  const bool fuse_rope_attention_ = [] {  // TESSEL_FUSE_ROPE_ATTENTION=0: rope_append launch
    const char* e = std::getenv("TESSEL_FUSE_ROPE_ATTENTION");
    return !(e && std::string(e) == "0");
  }();
  // TESSEL_TIMING_SKIP_ATTENTION=1: decode steps launch no attention at all (the output rows
  // keep whatever they held: the generated text is wrong). For timing only: the step time with
  // and without it is what the attention costs inside a pipelined (graphed, dependent-launch)
  // step, which per-op profiles cannot show.
  const bool timing_skip_attention_ = [] {
    const char* e = std::getenv("TESSEL_TIMING_SKIP_ATTENTION");
    return e && std::string(e) == "1";
  }();
  const bool fuse_norm_ = [] {  // TESSEL_FUSE_NORM=0: norms and residual adds not in the GEMMs
    const char* e = std::getenv("TESSEL_FUSE_NORM");
    return !(e && std::string(e) == "0");
  }();
  const bool fuse_swiglu_ = [] {  // TESSEL_FUSE_SWIGLU=0: separate activation launch
    const char* e = std::getenv("TESSEL_FUSE_SWIGLU");
    return !(e && std::string(e) == "0");
  }();
  // KV pool
  void* k_pool_ = nullptr;
  void* v_pool_ = nullptr;
  int64_t n_layers_ = 0, slots_ = 0, max_seq_ = 0, kv_dim_ = 0;
  int64_t page_size_ = 64, pages_per_slot_ = 0, table_width_ = 0;
  int64_t max_pool_pages_ = 0, pool_pages_ = 0;
  std::vector<std::vector<int32_t>> slot_pages_;
  std::vector<int32_t> free_pages_;
  // step inputs
  StepInputs step_;
  InputLayout in_;
  bool in_step_ = false;
  void* input_host_ = nullptr;  // pinned
  void* input_dev_ = nullptr;
  size_t input_capacity_ = 0;
  cudaEvent_t input_copied_ = nullptr;
  void* download_host_ = nullptr;  // pinned
  // argmax_rows_start: two alternating slots of device picks, their pinned host copies and
  // the event of each download (pending_: started, not finished, oldest first).
  struct Picks {
    void* dev = nullptr;
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t ready = nullptr;
    int64_t rows = 0;
  };
  Picks picks_[2];
  std::deque<int> pending_;
  int next_pick_ = 0, last_pick_ = -1;
  bool feed_next_ = false;
  const bool pipeline_enabled_ = [] {  // TESSEL_DECODE_PIPELINE=0: one step at a time (A/B)
    const char* e = std::getenv("TESSEL_DECODE_PIPELINE");
    return !(e && e[0] == '0');
  }();
  void* ids_dev_ = nullptr;  // argmax_rows: device ids and their pinned host copy
  void* ids_host_ = nullptr;
  size_t ids_capacity_ = 0;
  size_t download_capacity_ = 0;
  double wait_seconds_ = 0;
  std::vector<Run> runs_;
  bool uniform_ = true;
  // The k/v rows of the last kv_store (views into the step's qkv buffer) and its layer.
  static constexpr int64_t kPrefillMinRows = 128;
  // Prompt runs that start their sequence go to the tiled kernel from kPrefillMinRows rows on
  // (below that the decode kernel is as fast). TESSEL_PREFILL_ATTENTION: "decode" = never,
  // "tiled" = from 16 rows, "check" = "tiled" plus the decode kernel on the same call and the
  // per-layer difference printed (the first differing layer's tensors dumped to TESSEL_DUMP_DIR).
  static std::string prefill_mode() {
    const char* e = std::getenv("TESSEL_PREFILL_ATTENTION");
    return e ? e : "";
  }
  const bool prefill_check_ = prefill_mode() == "check";
  const bool prefill_kernel_ = prefill_mode() != "decode";
  const int64_t prefill_min_rows_ = prefill_mode().empty() ? kPrefillMinRows : 16;
  bool check_dumped_ = false;

  // Strided bf16 (B, S, H, D) view -> host floats in logical order.
  std::vector<float> host_values(const Tensor& t) {
    const int64_t B = t.shape[0], S = t.shape[1], H = t.shape[2], D = t.shape[3];
    std::vector<uint16_t> raw(static_cast<size_t>(B * S * H * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        TESSEL_CUDA_CHECK(cudaMemcpy2DAsync(
            raw.data() + ((b * S + s) * H) * D, D * 2,
            static_cast<const uint16_t*>(t.data) + b * t.strides[0] + s * t.strides[1],
            t.strides[2] * 2, D * 2, H, cudaMemcpyDeviceToHost, stream_));
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> out(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) out[i] = from_bf16(raw[i]);
    return out;
  }
  void check_prefill(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& tiled, const Tensor& kc, const Tensor& vc, const Tensor& seqlens,
                     const Tensor& table) {
    void* tmp = nullptr;
    const size_t n = static_cast<size_t>(tiled.numel());
    TESSEL_CUDA_CHECK(cudaMallocAsync(&tmp, n * 2, stream_));
    Tensor dec = Tensor::contiguous(
        tmp, DType::bf16, {tiled.shape[0], tiled.shape[1], tiled.shape[2], tiled.shape[3]});
    DecodeParams p;
    p.block_table = &table;
    tessel::decode_attention(q, kc, vc, seqlens, dec, nullptr, p, stream_);
    const std::vector<float> a = host_values(tiled), b = host_values(dec);
    TESSEL_CUDA_CHECK(cudaFreeAsync(tmp, stream_));
    double worst = 0, ref = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = std::abs(static_cast<double>(a[i]) - b[i]);
      if (!(d <= worst)) worst = d, at = i;
      ref = std::max(ref, std::abs(static_cast<double>(b[i])));
    }
    const int64_t H = tiled.shape[2], D = tiled.shape[3];
    std::fprintf(stderr,
                 "[prefill check] layer %lld: max |tiled - decode| %.4g at (row %lld, head %lld, "
                 "col %lld) of max |decode| %.4g\n",
                 static_cast<long long>(layer), worst, static_cast<long long>(at / (H * D)),
                 static_cast<long long>(at / D % H), static_cast<long long>(at % D), ref);
    const char* dir = std::getenv("TESSEL_DUMP_DIR");
    if (dir && !check_dumped_ && worst > 0.05 * ref + 0.02) {
      check_dumped_ = true;
      auto dump = [&](const char* name, const std::vector<float>& x) {
        const std::string path = std::string(dir) + "/" + name + ".f32";
        if (FILE* f = std::fopen(path.c_str(), "wb")) {
          std::fwrite(x.data(), 4, x.size(), f);
          std::fclose(f);
        }
      };
      dump("q", host_values(q));
      dump("k", host_values(k));
      dump("v", host_values(v));
      dump("tiled", a);
      dump("decode", b);
      std::fprintf(stderr,
                   "[prefill check] dumped layer %lld (B %lld S %lld Hq %lld Hkv %lld D %lld)\n",
                   static_cast<long long>(layer), static_cast<long long>(q.shape[0]),
                   static_cast<long long>(q.shape[1]), static_cast<long long>(q.shape[2]),
                   static_cast<long long>(k.shape[2]), static_cast<long long>(D));
    }
  }
  Buf fresh_k_, fresh_v_;
  int64_t fresh_layer_ = -1;
  void* pos_tmp_ = nullptr;
  size_t pos_tmp_bytes_ = 0;
  Staged tokens_, positions_, cos_, sin_, rows_;
  // recorded steps
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::set<GraphKey> warmed_;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend() {
  if (cuda_device_count() == 0)
    throw Error(TESSEL_ERROR_NO_DEVICE,
                "tessel::run: 'backend' gpu expected a CUDA GPU, got none (use --backend cpu)");
  return std::make_unique<GpuBackend>();
}

}  // namespace tessel::llm
