// float32 CPU backend: a persistent thread pool and a register-blocked matmul (4 weight rows
// per pass share each activation load; AVX2/FMA clone chosen at run time where available).
#pragma GCC diagnostic ignored "-Wpsabi"  // the AVX2 clone passes 32-byte vectors

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "llm/backend.hpp"
#include "tessel/tensor.hpp"

namespace tessel::llm {

namespace {

// Runs fn(begin, end) over [0, n) split into one contiguous range per thread.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { loop(t); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    const int parts = static_cast<int>(std::min<int64_t>(size(), (n + grain - 1) / grain));
    if (parts <= 1) {
      if (n > 0) fn(0, n);
      return;
    }
    // Ranges rounded to the grain so blocked kernels see whole blocks.
    auto range = [n, grain, parts](int part, int64_t& b, int64_t& e) {
      const int64_t blocks = (n + grain - 1) / grain;
      b = std::min(n, blocks * part / parts * grain);
      e = std::min(n, blocks * (part + 1) / parts * grain);
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = [&](int part) {
        int64_t b, e;
        range(part, b, e);
        if (b < e) fn(b, e);
      };
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    cv_.notify_all();
    job_(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      std::function<void(int)> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (id >= parts_) continue;
        job = job_;
      }
      job(id);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void(int)> job_;
  int parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline float hsum(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// out[m, n0..n1) = x[m] · w[n]ᵀ for all rows m; 4 weight rows per pass.
__attribute__((target_clones("arch=haswell", "default"))) void matmul_block(
    const float* x, const float* w, const float* bias, float* out, int64_t M, int64_t N, int64_t K,
    int64_t n0, int64_t n1) {
  const int64_t K8 = K / 8 * 8;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const float* w0 = w + n * K;
    const float* w1 = w0 + K;
    const float* w2 = w1 + K;
    const float* w3 = w2 + K;
    int64_t m = 0;
    // Prefill: 2 activation rows × 4 weight rows per pass (6 loads feed 8 FMAs).
    for (; m + 2 <= M && K8 == K; m += 2) {
      const float* xa = x + m * K;
      const float* xb = xa + K;
      v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
      for (int64_t k = 0; k < K; k += 8) {
        const v8f xv = load8(xa + k), yv = load8(xb + k);
        const v8f v0 = load8(w0 + k), v1 = load8(w1 + k), v2 = load8(w2 + k), v3 = load8(w3 + k);
        a0 += xv * v0;
        a1 += xv * v1;
        a2 += xv * v2;
        a3 += xv * v3;
        b0 += yv * v0;
        b1 += yv * v1;
        b2 += yv * v2;
        b3 += yv * v3;
      }
      float* oa = out + m * N + n;
      float* ob = oa + N;
      const float c0 = bias ? bias[n] : 0.f, c1 = bias ? bias[n + 1] : 0.f;
      const float c2 = bias ? bias[n + 2] : 0.f, c3 = bias ? bias[n + 3] : 0.f;
      oa[0] = hsum(a0) + c0;
      oa[1] = hsum(a1) + c1;
      oa[2] = hsum(a2) + c2;
      oa[3] = hsum(a3) + c3;
      ob[0] = hsum(b0) + c0;
      ob[1] = hsum(b1) + c1;
      ob[2] = hsum(b2) + c2;
      ob[3] = hsum(b3) + c3;
    }
    for (; m < M; ++m) {
      const float* xr = x + m * K;
      v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t k = 0; k < K8; k += 8) {
        const v8f xv = load8(xr + k);
        a0 += xv * load8(w0 + k);
        a1 += xv * load8(w1 + k);
        a2 += xv * load8(w2 + k);
        a3 += xv * load8(w3 + k);
      }
      float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
      for (int64_t k = K8; k < K; ++k) {
        s0 += xr[k] * w0[k];
        s1 += xr[k] * w1[k];
        s2 += xr[k] * w2[k];
        s3 += xr[k] * w3[k];
      }
      float* o = out + m * N + n;
      o[0] = s0 + (bias ? bias[n] : 0.f);
      o[1] = s1 + (bias ? bias[n + 1] : 0.f);
      o[2] = s2 + (bias ? bias[n + 2] : 0.f);
      o[3] = s3 + (bias ? bias[n + 3] : 0.f);
    }
  }
  for (; n < n1; ++n) {
    const float* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      v8f a = {};
      for (int64_t k = 0; k < K8; k += 8) a += load8(xr + k) * load8(wr + k);
      float s = hsum(a);
      for (int64_t k = K8; k < K; ++k) s += xr[k] * wr[k];
      out[m * N + n] = s + (bias ? bias[n] : 0.f);
    }
  }
}

[[noreturn]] void shape_error(const char* op, const char* arg, const std::string& expected,
                              const Buf& got) {
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              std::string("tessel::llm_cpu_") + op + ": '" + arg + "' expected " + expected +
                  ", got (" + std::to_string(got.rows) + ", " + std::to_string(got.cols) + ")");
}

std::string dims(int64_t r, int64_t c) {
  return "(" + std::to_string(r) + ", " + std::to_string(c) + ")";
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : pool_(threads > 0 ? threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}
  ~CpuBackend() override = default;

  std::string name() const override {
    return "cpu (float32, " + std::to_string(pool_.size()) + " threads)";
  }

  Buf upload(const HostTensor& t) override {
    const int64_t rows = t.shape.size() > 1 ? t.shape[0] : 1;
    Buf b = alloc(rows, t.numel() / std::max<int64_t>(rows, 1));
    std::memcpy(b.ptr, t.data.data(), t.data.size() * sizeof(float));
    return b;
  }
  Buf alloc(int64_t rows, int64_t cols) override {
    Buf b;
    b.rows = rows;
    b.cols = cols;
    b.ptr = new float[static_cast<size_t>(std::max<int64_t>(rows * cols, 1))]();
    bytes_ += static_cast<size_t>(rows * cols) * sizeof(float);
    return b;
  }
  void release(Buf& b) override {
    if (!b.ptr) return;
    delete[] static_cast<float*>(b.ptr);
    bytes_ -= static_cast<size_t>(b.rows * b.cols) * sizeof(float);
    b = Buf{};
  }
  void download(const Buf& b, float* dst) override {
    std::memcpy(dst, b.ptr, static_cast<size_t>(b.rows * b.cols) * sizeof(float));
  }
  size_t bytes_in_use() const override { return bytes_ + (k_.size() + v_.size()) * sizeof(float); }
  Buf cols_view(const Buf& b, int64_t col0, int64_t n) const override {
    if (col0 < 0 || n < 0 || col0 + n > b.cols || b.ld != 0)
      shape_error("cols_view", "b", "a dense buffer of >= " + std::to_string(col0 + n) + " cols",
                  b);
    Buf v;
    v.ptr = f(b) + col0;
    v.rows = b.rows;
    v.cols = n;
    v.ld = b.cols;
    return v;
  }

  void kv_reserve(int64_t n_layers, int64_t slots, int64_t max_seq, int64_t kv_dim) override {
    n_layers_ = n_layers;
    slots_ = slots;
    max_seq_ = max_seq;
    kv_dim_ = kv_dim;
    const size_t n = static_cast<size_t>(n_layers * slots * max_seq * kv_dim);
    k_.assign(n, 0.f);
    v_.assign(n, 0.f);
  }

  void embedding(const int32_t* tokens, const Buf& table, Buf& out) override {
    if (out.cols != table.cols) shape_error("embedding", "out", dims(out.rows, table.cols), out);
    for (int64_t r = 0; r < out.rows; ++r) {
      if (tokens[r] < 0 || tokens[r] >= table.rows)
        throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                    "tessel::llm_cpu_embedding: 'tokens' expected ids in [0, " +
                        std::to_string(table.rows) + "), got " + std::to_string(tokens[r]));
      std::memcpy(f(out) + r * out.cols, f(table) + tokens[r] * table.cols,
                  static_cast<size_t>(table.cols) * sizeof(float));
    }
  }

  void add_rows(const int32_t* positions, const Buf& table, Buf& x) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      if (positions[r] < 0 || positions[r] >= table.rows)
        throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                    "tessel::llm_cpu_add_rows: 'positions' expected [0, " +
                        std::to_string(table.rows) + "), got " + std::to_string(positions[r]));
      const float* src = f(table) + positions[r] * table.cols;
      float* dst = f(x) + r * x.cols;
      for (int64_t c = 0; c < x.cols; ++c) dst[c] += src[c];
    }
  }

  void rms_norm(const Buf& x, const Buf& w, float eps, Buf& out) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = f(x) + r * x.cols;
      float* o = f(out) + r * x.cols;
      double ss = 0;
      for (int64_t c = 0; c < x.cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / x.cols + eps));
      for (int64_t c = 0; c < x.cols; ++c) o[c] = xr[c] * inv * f(w)[c];
    }
  }

  void add_rms_norm(Buf& x, const Buf& y, const Buf& w, float eps, Buf& out) override {
    add(x, y);
    rms_norm(x, w, eps, out);
  }

  void layer_norm(const Buf& x, const Buf& w, const Buf& b, float eps, Buf& out) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = f(x) + r * x.cols;
      float* o = f(out) + r * x.cols;
      double mean = 0, var = 0;
      for (int64_t c = 0; c < x.cols; ++c) mean += xr[c];
      mean /= x.cols;
      for (int64_t c = 0; c < x.cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
      const double inv = 1.0 / std::sqrt(var / x.cols + eps);
      for (int64_t c = 0; c < x.cols; ++c)
        o[c] = static_cast<float>((xr[c] - mean) * inv) * f(w)[c] + f(b)[c];
    }
  }

  void matmul(const Buf& x, const Buf& w, const Buf* bias, Buf& out) override {
    if (w.cols != x.cols) shape_error("matmul", "w", dims(w.rows, x.cols), w);
    if (out.rows != x.rows || out.cols != w.rows)
      shape_error("matmul", "out", dims(x.rows, w.rows), out);
    const float* xp = f(x);
    const float* wp = f(w);
    const float* bp = bias && bias->ptr ? f(*bias) : nullptr;
    float* op = f(out);
    const int64_t M = x.rows, N = w.rows, K = x.cols;
    // Weight-row blocks of 64 stay in L2 while every activation row passes over them.
    pool_.parallel_for(N, 64, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; n += 64)
        matmul_block(xp, wp, bp, op, M, N, K, n, std::min(e, n + 64));
    });
  }

  void rope(Buf& x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, RopeStyle style,
            const float* cos, const float* sin) override {
    if (style == RopeStyle::none) return;
    const int64_t half = rope_dim / 2;
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* cr = cos + r * half;
      const float* sr = sin + r * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = f(x) + r * x.pitch() + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          // neox pairs (i, i + half); gpt-j pairs (2i, 2i + 1)
          const int64_t a = style == RopeStyle::neox ? i : 2 * i;
          const int64_t b = style == RopeStyle::neox ? i + half : 2 * i + 1;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * cr[i] - x1 * sr[i];
          v[b] = x0 * sr[i] + x1 * cr[i];
        }
      }
    }
  }

  void kv_store(int64_t layer, const Buf& k, const Buf& v, const RowLayout& rows) override {
    for (int64_t r = 0; r < rows.rows; ++r) {
      check_slot_pos(rows, r);
      const size_t off = cache_offset(layer, rows.slot[r], rows.pos[r]);
      std::memcpy(k_.data() + off, f(k) + r * k.pitch(), static_cast<size_t>(kv_dim_) * 4);
      std::memcpy(v_.data() + off, f(v) + r * v.pitch(), static_cast<size_t>(kv_dim_) * 4);
    }
  }

  void attention(int64_t layer, const Buf& q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                 const RowLayout& rows, Buf& out) override {
    const int64_t group = n_heads / n_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    pool_.parallel_for(rows.rows * n_heads, 1, [&](int64_t b, int64_t e) {
      std::vector<float> scores;
      for (int64_t item = b; item < e; ++item) {
        const int64_t r = item / n_heads, h = item % n_heads;
        check_slot_pos(rows, r);
        const int64_t len = rows.pos[r] + 1;
        const float* qv = f(q) + r * q.pitch() + h * head_dim;
        const int64_t kvh = h / group;
        const size_t base = cache_offset(layer, rows.slot[r], 0) + kvh * head_dim;
        scores.resize(static_cast<size_t>(len));
        float mx = -INFINITY;
        for (int64_t t = 0; t < len; ++t) {
          const float* kv = k_.data() + base + t * kv_dim_;
          float s = 0;
          for (int64_t d = 0; d < head_dim; ++d) s += qv[d] * kv[d];
          scores[t] = s * scale;
          mx = std::max(mx, scores[t]);
        }
        double sum = 0;
        for (int64_t t = 0; t < len; ++t) sum += scores[t] = std::exp(scores[t] - mx);
        const float inv = static_cast<float>(1.0 / sum);
        float* o = f(out) + r * out.cols + h * head_dim;
        std::fill(o, o + head_dim, 0.f);
        for (int64_t t = 0; t < len; ++t) {
          const float* vv = v_.data() + base + t * kv_dim_;
          const float p = scores[t] * inv;
          for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
        }
      }
    });
  }

  void silu_mul(const Buf& gate, const Buf& up, Buf& out) override {
    for (int64_t r = 0; r < gate.rows; ++r) {
      const float* gr = f(gate) + r * gate.pitch();
      const float* ur = f(up) + r * up.pitch();
      float* o = f(out) + r * out.pitch();
      for (int64_t c = 0; c < gate.cols; ++c) o[c] = gr[c] / (1.f + std::exp(-gr[c])) * ur[c];
    }
  }

  void gelu(Buf& x) override {
    const int64_t n = x.rows * x.cols;
    for (int64_t i = 0; i < n; ++i) {
      const float v = f(x)[i];
      f(x)[i] = 0.5f * v * (1.f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
  }

  void add(Buf& x, const Buf& y) override {
    const int64_t n = x.rows * x.cols;
    for (int64_t i = 0; i < n; ++i) f(x)[i] += f(y)[i];
  }

  void gather_rows(const Buf& x, const int64_t* rows, int64_t n, Buf& out) override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(f(out) + i * x.cols, f(x) + rows[i] * x.cols,
                  static_cast<size_t>(x.cols) * sizeof(float));
  }

 private:
  static float* f(const Buf& b) { return static_cast<float*>(b.ptr); }
  size_t cache_offset(int64_t layer, int64_t slot, int64_t pos) const {
    return static_cast<size_t>(((layer * slots_ + slot) * max_seq_ + pos) * kv_dim_);
  }
  void check_slot_pos(const RowLayout& rows, int64_t r) const {
    if (rows.slot[r] < 0 || rows.slot[r] >= slots_ || rows.pos[r] < 0 || rows.pos[r] >= max_seq_)
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                  "tessel::llm_cpu_kv_cache: 'slot/pos' expected slot < " + std::to_string(slots_) +
                      " and pos < " + std::to_string(max_seq_) + ", got " +
                      std::to_string(rows.slot[r]) + "/" + std::to_string(rows.pos[r]));
  }

  ThreadPool pool_;
  size_t bytes_ = 0;
  int64_t n_layers_ = 0, slots_ = 0, max_seq_ = 0, kv_dim_ = 0;
  std::vector<float> k_, v_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace tessel::llm
