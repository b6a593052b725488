// The engine's compute interface: every op the model graph needs, on backend-owned buffers.
// The CPU backend (cpu_backend.cpp) implements it in float32; a GPU backend on tessel's kernels
// implements the same calls. Activations are row-major (rows, cols) float32 matrices; weights
// are whatever the backend chose at upload (the CPU keeps float32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "llm/config.hpp"
#include "llm/weights.hpp"

namespace tessel::llm {

// Opaque storage owned by a backend (host or device memory). A column view of a wider buffer
// (Backend::cols_view) has a row pitch `ld` > cols; ld 0 means dense (pitch = cols).
struct Buf {
  void* ptr = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int64_t pitch() const { return ld ? ld : cols; }
  explicit operator bool() const { return ptr != nullptr; }
};

// Rows of one forward step: row r is token r of sequence slot[r] at position pos[r]
// (host arrays of `rows` entries).
struct RowLayout {
  const int32_t* slot = nullptr;
  const int32_t* pos = nullptr;
  int64_t rows = 0;
};

// The small host inputs of one Model::forward step, handed to the backend once before the
// step's ops (begin_step); the ops of that step then receive these same host pointers.
struct StepInputs {
  const int32_t* tokens = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* pos = nullptr;
  int64_t rows = 0;
  const float* cos = nullptr;  // (rows, rope_half) or nullptr without RoPE
  const float* sin = nullptr;
  int64_t rope_half = 0;
  const int64_t* logits_rows = nullptr;
  int64_t n_logits = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory
  virtual Buf upload(const HostTensor& t) = 0;  // (shape[0], rest) matrix or a vector (1, n)
  virtual Buf alloc(int64_t rows, int64_t cols) = 0;
  virtual void release(Buf& b) = 0;
  virtual void download(const Buf& b, float* dst) = 0;  // rows·cols floats
  virtual size_t bytes_in_use() const = 0;
  // Seconds download() spent waiting for the device so far (0 for the CPU): how much of a
  // step's time is device work rather than host work.
  virtual double device_wait_seconds() const { return 0; }
  // Greedy sampling where the logits live: out[r] (host) = the lowest index of the largest
  // non-NaN value of row r (0 for an all-NaN row). Returns false when the backend has no such
  // op (the caller downloads and picks on the host; same rule).
  virtual bool argmax_rows(const Buf& logits, int32_t* out) {
    (void)logits;
    (void)out;
    return false;
  }
  // Pipelined greedy decode (generate() keeps the next step in flight while the host reads
  // this one's tokens). argmax_rows_start picks like argmax_rows but returns at once: the picks
  // stay on the device for feed_picked_tokens and reach the host at argmax_rows_finish
  // (finishes in start order, at most two started and not finished).
  virtual bool can_pipeline_greedy() const { return false; }
  virtual void argmax_rows_start(const Buf& logits) { (void)logits; }
  virtual void argmax_rows_finish(int32_t* out) { (void)out; }
  // The next begin_step takes its token ids from the last argmax_rows_start's picks, row for
  // row (its StepInputs::tokens are placeholders).
  virtual void feed_picked_tokens() {}
  // Columns col0 .. col0+n of every row of b, sharing b's memory (b itself may be dense only).
  virtual Buf cols_view(const Buf& b, int64_t col0, int64_t n) const = 0;

  // ---- steps
  // Called by Model::forward before a step's ops with the step's host arrays (the GPU uploads
  // them at once; the CPU ignores it).
  virtual void begin_step(const StepInputs& in) { (void)in; }
  // Runs `ops` (all launches of the step after begin_step). key >= 0 marks a step whose op
  // sequence and buffers are the same for every step of that key (Model's decode steps of one
  // batch size), which a backend may record once and replay (CUDA graphs); key < 0: run as is.
  virtual void run_step(int64_t key, const std::function<void()>& ops) {
    (void)key;
    ops();
  }

  // ---- KV cache: n_layers × slots × max_seq × kv_dim, for keys and for values
  virtual void kv_reserve(int64_t n_layers, int64_t slots, int64_t max_seq, int64_t kv_dim) = 0;
  // Forgets the cached positions of `slot` (a paged cache returns its pages to the pool).
  virtual void kv_free(int64_t slot) { (void)slot; }

  // ---- ops
  // out[r] = table[tokens[r]]
  virtual void embedding(const int32_t* tokens, const Buf& table, Buf& out) = 0;
  // x[r] += table[positions[r]]
  virtual void add_rows(const int32_t* positions, const Buf& table, Buf& x) = 0;
  virtual void rms_norm(const Buf& x, const Buf& w, float eps, Buf& out) = 0;
  // x += y, then out = rms_norm(x) (one fused kernel on the GPU: statistics of the fp32 sum).
  virtual void add_rms_norm(Buf& x, const Buf& y, const Buf& w, float eps, Buf& out) = 0;
  virtual void layer_norm(const Buf& x, const Buf& w, const Buf& b, float eps, Buf& out) = 0;
  // out = x · wᵀ (+ bias): x (M, K), w (N, K), out (M, N)
  virtual void matmul(const Buf& x, const Buf& w, const Buf* bias, Buf& out) = 0;
  // Rotates the first rope_dim features of every head of x (rows, n_heads·head_dim; may be a
  // column view) by the host tables cos/sin (rows, rope_dim/2).
  virtual void rope(Buf& x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, RopeStyle style,
                    const float* cos, const float* sin) = 0;
  // Stores k, v rows (rows, kv_dim; may be column views) into the cache of `layer` at (slot, pos)
  // of each row.
  virtual void kv_store(int64_t layer, const Buf& k, const Buf& v, const RowLayout& rows) = 0;
  // rope() of qk (the q heads then the k heads, k = qk's columns past n_heads·head_dim) followed
  // by kv_store() of the rotated k and v; backends may fuse the two.
  virtual void rope_kv_store(int64_t layer, Buf& qk, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim, int64_t rope_dim, RopeStyle style, const float* cos,
                             const float* sin, const Buf& k, const Buf& v, const RowLayout& rows) {
    rope(qk, n_heads + n_kv_heads, head_dim, rope_dim, style, cos, sin);
    kv_store(layer, k, v, rows);
  }
  // Causal attention of q (rows, n_heads·head_dim) over the cached positions 0..pos[r] of slot[r].
  virtual void attention(int64_t layer, const Buf& q, int64_t n_heads, int64_t n_kv_heads,
                         int64_t head_dim, const RowLayout& rows, Buf& out) = 0;
  // rope_kv_store() then attention() of q = qk's first n_heads·head_dim columns; backends may
  // fuse the two (and then leave qk as it was).
  virtual void rope_kv_attention(int64_t layer, Buf& qk, const Buf& q, int64_t n_heads,
                                 int64_t n_kv_heads, int64_t head_dim, int64_t rope_dim,
                                 RopeStyle style, const float* cos, const float* sin, const Buf& k,
                                 const Buf& v, const RowLayout& rows, Buf& out) {
    rope_kv_store(layer, qk, n_heads, n_kv_heads, head_dim, rope_dim, style, cos, sin, k, v, rows);
    attention(layer, q, n_heads, n_kv_heads, head_dim, rows, out);
  }
  // silu(gate)·up; gate and up may be column views (the halves of a fused gate|up output)
  virtual void silu_mul(const Buf& gate, const Buf& up, Buf& out) = 0;
  // The SwiGLU MLP's tail: act = silu(gate_up[:, :F]) · gate_up[:, F:], out = act · w_downᵀ
  // (+ bias). act is scratch of (rows, F); backends may fuse the two and not write it.
  virtual void silu_mul_matmul(const Buf& gate_up, int64_t F, Buf& act, const Buf& w_down,
                               const Buf* bias, Buf& out) {
    silu_mul(cols_view(gate_up, 0, F), cols_view(gate_up, F, F), act);
    matmul(act, w_down, bias, out);
  }
  virtual void gelu(Buf& x) = 0;               // tanh approximation
  virtual void add(Buf& x, const Buf& y) = 0;  // x += y

  // ---- the decode layer with its RMSNorms and residual adds fused into the GEMMs
  // Whether a step of `rows` rows should use norm_matmul / matmul_add / silu_mul_matmul_add
  // (one launch each where the backend fuses them) in place of the separate norms and adds.
  virtual bool fuses_norm_matmul(int64_t rows) const {
    (void)rows;
    return false;
  }
  // out = rms_norm(x, w_norm) · wᵀ (+ bias); xn is scratch of x's shape that a fusing backend
  // need not write.
  virtual void norm_matmul(const Buf& x, const Buf& w_norm, float eps, const Buf& w,
                           const Buf* bias, Buf& xn, Buf& out) {
    rms_norm(x, w_norm, eps, xn);
    matmul(xn, w, bias, out);
  }
  // x += y · wᵀ (+ bias); tmp is scratch of x's shape that a fusing backend need not write.
  virtual void matmul_add(const Buf& y, const Buf& w, const Buf* bias, Buf& tmp, Buf& x) {
    matmul(y, w, bias, tmp);
    add(x, tmp);
  }
  // x += silu_mul_matmul(gate_up, ...) (act, tmp: scratch as above).
  virtual void silu_mul_matmul_add(const Buf& gate_up, int64_t F, Buf& act, const Buf& w_down,
                                   const Buf* bias, Buf& tmp, Buf& x) {
    silu_mul_matmul(gate_up, F, act, w_down, bias, tmp);
    add(x, tmp);
  }
  // out[i] = x[rows[i]]
  virtual void gather_rows(const Buf& x, const int64_t* rows, int64_t n, Buf& out) = 0;
};

// float32 CPU backend using `threads` worker threads (0: hardware concurrency).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// "cpu", "gpu" or "auto" (the GPU backend when device 0 is a Hopper GPU, else the CPU one).
std::unique_ptr<Backend> make_backend(const std::string& kind, int threads = 0);

}  // namespace tessel::llm
