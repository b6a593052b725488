// The engine's GPU backend: every Backend op on tessel's public kernels, bf16 on the device.
// Weights are uploaded once as bf16 (matrices (N, K) row-major = tessel::gemm's B in nk layout,
// biases fused in its epilogue); activations are bf16 device buffers; only download() syncs.
// The small host arrays of a step (token ids, positions, cos/sin tables, the slot layout) are
// uploaded once per step: every layer passes the same host contents, so an upload is skipped
// when the contents equal the last ones. Memory comes from the stream-ordered allocator, so the
// per-step scratch of Model::forward costs no device sync.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "llm/backend.hpp"
#include "ops/llm_engine/rope_tables.hpp"
#include "runtime/check.hpp"
#include "tessel/activation.hpp"
#include "tessel/decode_attention.hpp"
#include "tessel/embedding.hpp"
#include "tessel/gemm.hpp"
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

// A device copy of a small host array, re-uploaded only when the contents change.
struct Staged {
  std::vector<unsigned char> host;
  void* dev = nullptr;
  size_t capacity = 0;
};

// Consecutive rows of one slot at consecutive positions: one decode_attention "sequence".
struct Run {
  int64_t start = 0, len = 0;
  int32_t slot = 0, seqlen = 0;  // seqlen: last position + 1
};

class GpuBackend final : public Backend {
 public:
  GpuBackend() {
    TESSEL_CUDA_CHECK(cudaGetDevice(&device_));
    TESSEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Keep freed scratch in the pool: Model::forward allocates and frees it every step.
    cudaMemPool_t pool;
    TESSEL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep = UINT64_MAX;
    TESSEL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cudaDeviceProp prop{};
    TESSEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
  }
  ~GpuBackend() override {
    cudaStreamSynchronize(stream_);
    for (Staged* s : {&tokens_, &positions_, &cos_, &sin_, &rows_, &layout_})
      if (s->dev) cudaFreeAsync(s->dev, stream_);
    if (k_cache_) cudaFreeAsync(k_cache_, stream_);
    if (v_cache_) cudaFreeAsync(v_cache_, stream_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "gpu (bf16, " + device_name_ + ")"; }

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
    std::vector<uint16_t> h(static_cast<size_t>(b.rows * b.cols));
    TESSEL_CUDA_CHECK(
        cudaMemcpyAsync(h.data(), b.ptr, h.size() * 2, cudaMemcpyDeviceToHost, stream_));
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the one sync of a step
    for (size_t i = 0; i < h.size(); ++i) dst[i] = from_bf16(h[i]);
  }
  size_t bytes_in_use() const override { return bytes_ + 2 * kv_bytes_; }

  void kv_reserve(int64_t n_layers, int64_t slots, int64_t max_seq, int64_t kv_dim) override {
    if (k_cache_) TESSEL_CUDA_CHECK(cudaFreeAsync(k_cache_, stream_));
    if (v_cache_) TESSEL_CUDA_CHECK(cudaFreeAsync(v_cache_, stream_));
    k_cache_ = v_cache_ = nullptr;
    n_layers_ = n_layers;
    slots_ = slots;
    max_seq_ = max_seq;
    kv_dim_ = kv_dim;
    kv_bytes_ = static_cast<size_t>(n_layers * slots * max_seq * kv_dim) * 2;
    TESSEL_CUDA_CHECK(cudaMallocAsync(&k_cache_, std::max<size_t>(kv_bytes_, 16), stream_));
    TESSEL_CUDA_CHECK(cudaMallocAsync(&v_cache_, std::max<size_t>(kv_bytes_, 16), stream_));
    layout_.host.clear();  // force a fresh slot layout
  }

  // ---- ops
  void embedding(const int32_t* tokens, const Buf& table, Buf& out) override {
    for (int64_t r = 0; r < out.rows; ++r)
      if (tokens[r] < 0 || tokens[r] >= table.rows)
        fail("embedding", "'tokens' expected ids in [0, " + std::to_string(table.rows) + "), got " +
                              std::to_string(tokens[r]));
    const Tensor ids =
        Tensor::contiguous(stage(tokens_, tokens, out.rows * 4), DType::i32, {out.rows});
    Tensor o = mat(out);
    tessel::embedding(ids, mat(table), o, false, stream_);
  }
  void add_rows(const int32_t* positions, const Buf& table, Buf& x) override {
    for (int64_t r = 0; r < x.rows; ++r)
      if (positions[r] < 0 || positions[r] >= table.rows)
        fail("add_rows", "'positions' expected [0, " + std::to_string(table.rows) + "), got " +
                             std::to_string(positions[r]));
    const Tensor ids =
        Tensor::contiguous(stage(positions_, positions, x.rows * 4), DType::i32, {x.rows});
    Buf tmp = alloc(x.rows, x.cols);
    Tensor t = mat(tmp), xt = mat(x);
    tessel::embedding(ids, mat(table), t, false, stream_);
    tessel::add(xt, t, xt, stream_);
    release(tmp);
  }
  void rms_norm(const Buf& x, const Buf& w, float eps, Buf& out) override {
    Tensor o = mat(out);
    tessel::rms_norm(mat(x), vec(w), o, nullptr, eps, stream_);
  }
  void layer_norm(const Buf& x, const Buf& w, const Buf& b, float eps, Buf& out) override {
    Tensor o = mat(out);
    const Tensor bt = b ? vec(b) : Tensor{};
    tessel::layer_norm(mat(x), vec(w), b ? &bt : nullptr, o, nullptr, nullptr, eps, stream_);
  }
  void matmul(const Buf& x, const Buf& w, const Buf* bias, Buf& out) override {
    GemmOptions opt;
    const Tensor bt = bias && *bias ? vec(*bias) : Tensor{};
    if (bias && *bias) opt.bias = &bt;
    Tensor o = mat(out);
    tessel::gemm(mat(x), mat(w), o, stream_, opt);
  }
  void rope(Buf& x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, RopeStyle style,
            const float* cos, const float* sin) override {
    if (style == RopeStyle::none) return;
    if (x.cols != n_heads * head_dim || rope_dim % 2 != 0 || rope_dim > head_dim)
      fail("rope", "'x' expected (rows, " + std::to_string(n_heads * head_dim) +
                       ") and an even rope_dim <= head_dim, got cols " + std::to_string(x.cols) +
                       ", rope_dim " + std::to_string(rope_dim));
    const size_t n = static_cast<size_t>(x.rows * (rope_dim / 2)) * 4;
    const float* c = static_cast<const float*>(stage(cos_, cos, n));
    const float* s = static_cast<const float*>(stage(sin_, sin, n));
    llm_engine::rope_tables_bf16(x.ptr, x.rows, n_heads, head_dim, rope_dim,
                                 style == RopeStyle::neox, c, s, stream_);
  }
  void kv_store(int64_t layer, const Buf& k, const Buf& v, const RowLayout& rows) override {
    if (!k_cache_) fail("kv_store", "'kv cache' expected kv_reserve() first, got none");
    if (k.cols != kv_dim_ || v.cols != kv_dim_ || v.rows != k.rows || k.rows != rows.rows)
      fail("kv_store", "'k/v' expected (" + std::to_string(rows.rows) + ", " +
                           std::to_string(kv_dim_) + "), got (" + std::to_string(k.rows) + ", " +
                           std::to_string(k.cols) + ")");
    // A cache row is kv_dim contiguous elements whatever the head split: append whole rows.
    const int64_t D = kv_dim_;
    plan(rows);
    for_each_call(
        [&](int64_t start, int64_t B, int64_t Sq, const Tensor& seqlens, const Tensor& table) {
          const Tensor kn = rows_view(k, start, B, Sq, kv_dim_ / D, D);
          const Tensor vn = rows_view(v, start, B, Sq, kv_dim_ / D, D);
          Tensor kc = cache_view(k_cache_, layer, D), vc = cache_view(v_cache_, layer, D);
          tessel::append_kv(kn, vn, kc, vc, &table, seqlens, false, stream_);
        });
  }
  void attention(int64_t layer, const Buf& q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                 const RowLayout& rows, Buf& out) override {
    if (!k_cache_) fail("attention", "'kv cache' expected kv_reserve() first, got none");
    if (n_kv_heads * head_dim != kv_dim_ || q.cols != n_heads * head_dim || out.cols != q.cols)
      fail("attention", "'q/out' expected (rows, " + std::to_string(n_heads * head_dim) +
                            ") with n_kv_heads·head_dim " + std::to_string(kv_dim_) + ", got " +
                            std::to_string(q.cols) + "/" + std::to_string(out.cols) + ", " +
                            std::to_string(n_kv_heads * head_dim));
    plan(rows);
    const Tensor kc = cache_view(k_cache_, layer, head_dim);
    const Tensor vc = cache_view(v_cache_, layer, head_dim);
    for_each_call(
        [&](int64_t start, int64_t B, int64_t Sq, const Tensor& seqlens, const Tensor& table) {
          const Tensor qv = rows_view(q, start, B, Sq, n_heads, head_dim);
          Tensor ov = rows_view(out, start, B, Sq, n_heads, head_dim);
          DecodeParams p;
          p.block_table = &table;
          tessel::decode_attention(qv, kc, vc, seqlens, ov, nullptr, p, stream_);
        });
  }
  void silu_mul(const Buf& gate, const Buf& up, Buf& out) override {
    Tensor o = mat(out);
    tessel::swiglu(mat(gate), mat(up), o, stream_);
  }
  void gelu(Buf& x) override {
    Tensor t = mat(x);
    tessel::gelu(t, t, GeluApprox::tanh, stream_);
  }
  void add(Buf& x, const Buf& y) override {
    Tensor t = mat(x);
    tessel::add(t, mat(y), t, stream_);
  }
  void gather_rows(const Buf& x, const int64_t* rows, int64_t n, Buf& out) override {
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] < 0 || rows[i] >= x.rows)
        fail("gather_rows",
             "'rows' expected [0, " + std::to_string(x.rows) + "), got " + std::to_string(rows[i]));
    const Tensor ids = Tensor::contiguous(stage(rows_, rows, n * 8), DType::i64, {n});
    Tensor o = mat(out);
    tessel::embedding(ids, mat(x), o, false, stream_);
  }

 private:
  static size_t bytes(const Buf& b) { return static_cast<size_t>(b.rows * b.cols) * 2; }
  static Tensor mat(const Buf& b) {
    return Tensor::contiguous(b.ptr, DType::bf16, {b.rows, b.cols});
  }
  static Tensor vec(const Buf& b) {
    return Tensor::contiguous(b.ptr, DType::bf16, {b.rows * b.cols});
  }

  void* stage(Staged& s, const void* host, size_t n) {
    if (s.host.size() == n && s.dev && std::memcmp(s.host.data(), host, n) == 0) return s.dev;
    if (n > s.capacity) {
      if (s.dev) TESSEL_CUDA_CHECK(cudaFreeAsync(s.dev, stream_));
      s.capacity = std::max<size_t>(n, 256);
      TESSEL_CUDA_CHECK(cudaMallocAsync(&s.dev, s.capacity, stream_));
    }
    s.host.assign(static_cast<const unsigned char*>(host),
                  static_cast<const unsigned char*>(host) + n);
    // Pageable source: staged by the driver before the call returns, ordered in the stream.
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(s.dev, s.host.data(), n, cudaMemcpyHostToDevice, stream_));
    return s.dev;
  }

  // Splits a step's rows into runs and uploads seqlens / block tables once per layout:
  // [seqlens (n) | table (n) | per run: seqlen,0,0,0, slot,0,0,0], each part 16-byte aligned.
  void plan(const RowLayout& rows) {
    std::vector<int32_t> key(static_cast<size_t>(2 * rows.rows));
    for (int64_t r = 0; r < rows.rows; ++r) {
      if (rows.slot[r] < 0 || rows.slot[r] >= slots_ || rows.pos[r] < 0 || rows.pos[r] >= max_seq_)
        fail("kv_cache", "'slot/pos' expected slot < " + std::to_string(slots_) + " and pos < " +
                             std::to_string(max_seq_) + ", got " + std::to_string(rows.slot[r]) +
                             "/" + std::to_string(rows.pos[r]));
      key[2 * r] = rows.slot[r];
      key[2 * r + 1] = rows.pos[r];
    }
    if (key == plan_key_ && layout_.dev) return;
    plan_key_ = key;
    runs_.clear();
    for (int64_t r = 0; r < rows.rows; ++r) {
      if (r > 0 && rows.slot[r] == rows.slot[r - 1] && rows.pos[r] == rows.pos[r - 1] + 1) {
        ++runs_.back().len;
        ++runs_.back().seqlen;
      } else {
        runs_.push_back({r, 1, rows.slot[r], rows.pos[r] + 1});
      }
    }
    const int64_t n = static_cast<int64_t>(runs_.size());
    padded_ = (n + 3) / 4 * 4;
    std::vector<int32_t> h(static_cast<size_t>(2 * padded_ + 8 * n), 0);
    uniform_ = true;
    for (int64_t i = 0; i < n; ++i) {
      h[i] = runs_[i].seqlen;
      h[padded_ + i] = runs_[i].slot;
      h[2 * padded_ + 8 * i] = runs_[i].seqlen;
      h[2 * padded_ + 8 * i + 4] = runs_[i].slot;
      uniform_ = uniform_ && runs_[i].len == runs_[0].len;
    }
    layout_.host.clear();
    stage(layout_, h.data(), h.size() * 4);
  }

  // One decode_attention / append_kv call for all runs when they have one length (decode
  // steps, equal prompts), otherwise one call per run.
  template <class F>
  void for_each_call(F&& call) {
    auto* base = static_cast<int32_t*>(layout_.dev);
    const int64_t n = static_cast<int64_t>(runs_.size());
    if (uniform_) {
      const Tensor seqlens = Tensor::contiguous(base, DType::i32, {n});
      const Tensor table = Tensor::contiguous(base + padded_, DType::i32, {n, 1});
      call(0, n, runs_[0].len, seqlens, table);
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      int32_t* e = base + 2 * padded_ + 8 * i;
      const Tensor seqlens = Tensor::contiguous(e, DType::i32, {1});
      const Tensor table = Tensor::contiguous(e + 4, DType::i32, {1, 1});
      call(runs_[i].start, 1, runs_[i].len, seqlens, table);
    }
  }

  // Rows start.. of a (rows, heads·D) buffer as (B, Sq, heads, D).
  static Tensor rows_view(const Buf& b, int64_t start, int64_t B, int64_t Sq, int64_t heads,
                          int64_t D) {
    Tensor t = Tensor::contiguous(static_cast<uint16_t*>(b.ptr) + start * b.cols, DType::bf16,
                                  {B, Sq, heads, D});
    return t;
  }
  // The cache of one layer, (slots, max_seq, Hkv, D), as a paged cache with one page per slot:
  // the block table then maps each run to its slot in any order.
  Tensor cache_view(void* cache, int64_t layer, int64_t D) const {
    return Tensor::contiguous(static_cast<uint16_t*>(cache) + layer * slots_ * max_seq_ * kv_dim_,
                              DType::bf16, {slots_, max_seq_, kv_dim_ / D, D});
  }

  int device_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  size_t bytes_ = 0, kv_bytes_ = 0;
  void* k_cache_ = nullptr;
  void* v_cache_ = nullptr;
  int64_t n_layers_ = 0, slots_ = 0, max_seq_ = 0, kv_dim_ = 0;
  Staged tokens_, positions_, cos_, sin_, rows_, layout_;
  std::vector<int32_t> plan_key_;
  std::vector<Run> runs_;
  int64_t padded_ = 0;
  bool uniform_ = true;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend() {
  if (cuda_device_count() == 0)
    throw Error(TESSEL_ERROR_NO_DEVICE,
                "tessel::run: 'backend' gpu expected a CUDA GPU, got none (use --backend cpu)");
  return std::make_unique<GpuBackend>();
}

}  // namespace tessel::llm
