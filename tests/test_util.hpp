// Shared helpers of the tessel GoogleTest suites (header-only).
//
//   tolerance(DType)          THE per-dtype tolerance table (docs/testing.md shows the same)
//   SeededTest / GpuTest      fixtures: fresh random seed per test (traced on failure);
//                             GpuTest skips without a GPU, or fails with TESSEL_REQUIRE_GPU=1
//   Rng                       random inputs, never zero, never the poison pattern
//   DeviceTensor              device allocation + (possibly strided/offset) tensor view,
//                             poisoned with 0xFF bytes (a NaN in f32/f16/bf16) when allocated
//   upload_* / download_*     host <-> device by value (rounded to the dtype) or by bytes
//   all_close / bit_exact     comparisons; NaN never passes, every element is checked
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "ref/reference.hpp"
#include "runtime/scoped_env.hpp"
#include "tessel/ops.hpp"
#include "tessel/tensor.hpp"

namespace tessel::test {

using detail::ScopedEnv;  // runtime/scoped_env.hpp

// ---- enum mapping between the library and the references ------------------------------
static_assert(static_cast<int>(UnaryOp::identity) == static_cast<int>(ref::UnaryOp::identity) &&
              static_cast<int>(UnaryOp::neg) == static_cast<int>(ref::UnaryOp::neg) &&
              static_cast<int>(UnaryOp::abs) == static_cast<int>(ref::UnaryOp::abs) &&
              static_cast<int>(UnaryOp::exp) == static_cast<int>(ref::UnaryOp::exp) &&
              static_cast<int>(UnaryOp::relu) == static_cast<int>(ref::UnaryOp::relu) &&
              static_cast<int>(UnaryOp::sigmoid) == static_cast<int>(ref::UnaryOp::sigmoid) &&
              static_cast<int>(UnaryOp::silu) == static_cast<int>(ref::UnaryOp::silu) &&
              static_cast<int>(UnaryOp::square) == static_cast<int>(ref::UnaryOp::square));
static_assert(static_cast<int>(BinaryOp::add) == static_cast<int>(ref::BinaryOp::add) &&
              static_cast<int>(BinaryOp::sub) == static_cast<int>(ref::BinaryOp::sub) &&
              static_cast<int>(BinaryOp::mul) == static_cast<int>(ref::BinaryOp::mul) &&
              static_cast<int>(BinaryOp::div) == static_cast<int>(ref::BinaryOp::div) &&
              static_cast<int>(BinaryOp::maximum) == static_cast<int>(ref::BinaryOp::maximum) &&
              static_cast<int>(BinaryOp::minimum) == static_cast<int>(ref::BinaryOp::minimum));

inline ref::UnaryOp to_ref(UnaryOp op) { return static_cast<ref::UnaryOp>(op); }
inline ref::BinaryOp to_ref(BinaryOp op) { return static_cast<ref::BinaryOp>(op); }

inline constexpr UnaryOp kAllUnaryOps[] = {UnaryOp::identity, UnaryOp::neg,   UnaryOp::abs,
                                           UnaryOp::exp,      UnaryOp::relu,  UnaryOp::sigmoid,
                                           UnaryOp::silu,     UnaryOp::square};
inline constexpr BinaryOp kAllBinaryOps[] = {BinaryOp::add, BinaryOp::sub,     BinaryOp::mul,
                                             BinaryOp::div, BinaryOp::maximum, BinaryOp::minimum};
inline constexpr DType kFloatDTypes[] = {DType::f32, DType::f16, DType::bf16};
inline constexpr DType kAllDTypes[] = {DType::f32,     DType::f16, DType::bf16, DType::f8_e4m3,
                                       DType::f8_e5m2, DType::i32, DType::i64,  DType::u8};

inline bool is_float(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

inline ref::Storage storage(DType d) {
  switch (d) {
    case DType::f32: return ref::Storage::f32;
    case DType::f16: return ref::Storage::f16;
    case DType::bf16: return ref::Storage::bf16;
    default: break;
  }
  throw std::invalid_argument(std::string("tessel::test::storage: no value storage for ") +
                              dtype_name(d));
}

// ---- THE tolerance table -----------------------------------------------------------------
// Keep in sync with the "Tolerances" table of docs/testing.md (the test
// Docs.ToleranceTableMatchesTestUtil parses the document and compares).
//   rel_l2  : ||out - ref||_2 / ||ref||_2 over the whole output
//   max_abs : max_i |out_i - ref_i| / max_i |ref_i|  (the largest single-element error,
//             measured against the output's scale)
// Both must hold; a NaN/inf output where the reference is finite always fails. Values are
// for float outputs compared with the float64 reference of the (already rounded) inputs;
// data-movement ops (copy, transpose) on any dtype, and the integer dtypes, are compared
// bit-exactly instead.
struct Tolerance {
  double rel_l2;
  double max_abs;
};

inline Tolerance tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return {1e-5, 2e-5};
    case DType::f16: return {2e-3, 4e-3};
    case DType::bf16: return {8e-3, 1.6e-2};
    default: return {0.0, 0.0};  // exact
  }
}

// ---- environment -------------------------------------------------------------------------
inline bool require_gpu() {
  const char* v = std::getenv("TESSEL_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

inline bool have_gpu() {
  static const bool have = cuda_device_count() > 0;
  return have;
}

// Throws std::runtime_error on a CUDA error (GoogleTest reports it as a test failure).
inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}
#define TESSEL_TEST_CUDA(expr) ::tessel::test::cuda_check((expr), #expr)

// ---- random inputs -----------------------------------------------------------------------
// A fresh seed per test (std::random_device), or TESSEL_TEST_SEED=<n> to replay one.
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("TESSEL_TEST_SEED"); s != nullptr && *s != '\0')
    return std::strtoull(s, nullptr, 0);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed), gen_(seed) {}
  uint64_t seed() const { return seed_; }
  std::mt19937_64& engine() { return gen_; }

  // n values uniform in [lo, hi]; values closer to zero than 1e-3 * max(|lo|, |hi|) are
  // redrawn, so an input is never (rounded to) zero.
  std::vector<double> uniform(size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    const double gap = 1e-3 * std::max(std::fabs(lo), std::fabs(hi));
    std::vector<double> v(n);
    for (double& x : v) {
      do x = dist(gen_);
      while (std::fabs(x) < gap);
    }
    return v;
  }

  // n values with |v| uniform in [min_abs, max_abs] and a random sign (min_abs > 0).
  std::vector<double> signed_magnitude(size_t n, double min_abs, double max_abs) {
    std::uniform_real_distribution<double> dist(min_abs, max_abs);
    std::bernoulli_distribution neg(0.5);
    std::vector<double> v(n);
    for (double& x : v) x = neg(gen_) ? -dist(gen_) : dist(gen_);
    return v;
  }

  // n values k / 2 with k a nonzero integer in [-8, 8]: sums of up to 2^21 of them are
  // exact in fp32 in any order, so a sum kernel must match the reference bit for bit.
  std::vector<double> small_halves(size_t n) {
    std::uniform_int_distribution<int> dist(1, 8);
    std::bernoulli_distribution neg(0.5);
    std::vector<double> v(n);
    for (double& x : v) x = (neg(gen_) ? -0.5 : 0.5) * dist(gen_);
    return v;
  }

  // n elements of elem_size random bytes; no element is all 0xFF bytes (the poison
  // pattern), so an element left unwritten is always detected.
  std::vector<uint8_t> bytes(size_t n, size_t elem_size) {
    std::uniform_int_distribution<int> dist(0, 255);
    std::vector<uint8_t> v(n * elem_size);
    for (size_t i = 0; i < n; ++i) {
      bool all_ff = true;
      do {
        all_ff = true;
        for (size_t b = 0; b < elem_size; ++b) {
          v[i * elem_size + b] = static_cast<uint8_t>(dist(gen_));
          all_ff &= v[i * elem_size + b] == 0xFF;
        }
      } while (all_ff);
    }
    return v;
  }

  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }

 private:
  uint64_t seed_;
  std::mt19937_64 gen_;
};

// ---- fixtures ----------------------------------------------------------------------------
// Every test gets its own fresh seed; failures print it (SCOPED_TRACE) and the XML report
// records it as the property "seed".
class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ostringstream msg;
    msg << "random seed " << rng_.seed() << " (replay with TESSEL_TEST_SEED=" << rng_.seed() << ")";
    trace_.emplace(__FILE__, __LINE__, msg.str());
    RecordProperty("seed", std::to_string(rng_.seed()));
  }
  Rng& rng() { return rng_; }

 private:
  Rng rng_{fresh_seed()};
  std::optional<::testing::ScopedTrace> trace_;
};

// Base of every GPU test (their suite names contain "Gpu": CTest labels them `gpu`).
// Without a CUDA GPU the test is skipped, unless TESSEL_REQUIRE_GPU=1 makes it fail.
// Ops run on a non-blocking stream of the fixture (stream()); the transfer helpers below
// synchronize the device, so results are always complete before they are read.
class GpuTest : public SeededTest {
 protected:
  void SetUp() override {
    SeededTest::SetUp();
    if (!have_gpu()) {
      if (require_gpu()) FAIL() << "TESSEL_REQUIRE_GPU=1 but no CUDA GPU found";
      GTEST_SKIP() << "no CUDA GPU (TESSEL_REQUIRE_GPU=1 turns this skip into a failure)";
    }
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
      stream_ = nullptr;
    }
  }
  cudaStream_t stream() const { return stream_; }
  // Waits for the stream and surfaces asynchronous kernel errors.
  void sync() {
    TESSEL_TEST_CUDA(cudaStreamSynchronize(stream_));
    TESSEL_TEST_CUDA(cudaGetLastError());
  }

 private:
  cudaStream_t stream_ = nullptr;
};

// ---- device tensors ----------------------------------------------------------------------
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ',';
  os << ')';
  return os.str();
}

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

// Offsets (in elements, from t.data) of every element of t, in row-major logical order.
inline std::vector<int64_t> element_offsets(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<int64_t> offs;
  offs.reserve(static_cast<size_t>(n));
  if (n == 0) return offs;
  std::vector<int64_t> idx(static_cast<size_t>(t.ndim), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    offs.push_back(off);
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) {
        off += t.strides[d];
        break;
      }
      off -= (t.shape[d] - 1) * t.strides[d];
      idx[d] = 0;
    }
  }
  return offs;
}

// A device allocation and a view into it. The buffer is exactly large enough for the view
// (plus `offset` leading elements) and starts out poisoned with 0xFF bytes.
struct DeviceTensor {
  DeviceBuffer buf;
  Tensor t;            // the view handed to the ops
  int64_t offset = 0;  // elements between buf.data() and t.data
  size_t elem_size() const { return dtype_size(t.dtype); }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(t.shape, t.shape + t.ndim); }
};

inline void poison(const DeviceTensor& d) {
  if (d.buf.bytes() == 0) return;
  TESSEL_TEST_CUDA(cudaMemset(d.buf.data(), 0xFF, d.buf.bytes()));
  TESSEL_TEST_CUDA(cudaDeviceSynchronize());
}

// A view of `shape` with arbitrary (non-negative) `strides`, `offset` elements into a
// fresh poisoned buffer.
inline DeviceTensor alloc_view(DType dtype, const std::vector<int64_t>& shape,
                               const std::vector<int64_t>& strides, int64_t offset = 0) {
  if (shape.size() != strides.size() || shape.size() > static_cast<size_t>(kMaxDims))
    throw std::invalid_argument("alloc_view: bad shape/strides");
  int64_t span = 1;  // elements covered by the view
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 0) span += (shape[d] - 1) * strides[d];
  const size_t es = dtype_size(dtype);
  DeviceTensor d;
  d.buf = DeviceBuffer(static_cast<size_t>(offset + span) * es);
  d.offset = offset;
  d.t.data = static_cast<char*>(d.buf.data()) + offset * static_cast<int64_t>(es);
  d.t.dtype = dtype;
  d.t.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    d.t.shape[i] = shape[i];
    d.t.strides[i] = strides[i];
  }
  int dev = 0;
  TESSEL_TEST_CUDA(cudaGetDevice(&dev));
  d.t.device = Device{DeviceKind::cuda, dev};
  poison(d);
  return d;
}

// Dense row-major view, poisoned.
inline DeviceTensor alloc(DType dtype, const std::vector<int64_t>& shape, int64_t offset = 0) {
  return alloc_view(dtype, shape, contiguous_strides(shape), offset);
}

// Last axis dense, leading axes collapsing into rows `pitch` elements apart (pitch >=
// cols): a row-pitched slice of a wider matrix. Padding stays poisoned.
inline DeviceTensor alloc_pitched(DType dtype, const std::vector<int64_t>& shape, int64_t pitch,
                                  int64_t offset = 0) {
  if (shape.empty()) throw std::invalid_argument("alloc_pitched: needs at least 1 dimension");
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t s = pitch;
  for (size_t d = shape.size() - 1; d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  return alloc_view(dtype, shape, strides, offset);
}

inline std::vector<uint8_t> download_buffer(const DeviceTensor& d) {
  std::vector<uint8_t> img(d.buf.bytes());
  TESSEL_TEST_CUDA(cudaDeviceSynchronize());
  if (!img.empty())
    TESSEL_TEST_CUDA(cudaMemcpy(img.data(), d.buf.data(), img.size(), cudaMemcpyDeviceToHost));
  return img;
}

// Writes `bytes` (the view's elements in logical order) into the view; other bytes of the
// buffer are left as they are.
inline void upload_bytes(const DeviceTensor& d, const std::vector<uint8_t>& bytes) {
  const size_t es = d.elem_size();
  const std::vector<int64_t> offs = element_offsets(d.t);
  if (bytes.size() != offs.size() * es) throw std::invalid_argument("upload_bytes: wrong size");
  if (offs.empty()) return;
  std::vector<uint8_t> img = d.t.is_contiguous() && d.offset == 0
                                 ? std::vector<uint8_t>(d.buf.bytes(), 0xFF)
                                 : download_buffer(d);
  for (size_t i = 0; i < offs.size(); ++i)
    std::memcpy(img.data() + (d.offset + offs[i]) * es, bytes.data() + i * es, es);
  TESSEL_TEST_CUDA(cudaMemcpy(d.buf.data(), img.data(), img.size(), cudaMemcpyHostToDevice));
  TESSEL_TEST_CUDA(cudaDeviceSynchronize());
}

// The view's elements in logical order.
inline std::vector<uint8_t> download_bytes(const DeviceTensor& d) {
  const size_t es = d.elem_size();
  const std::vector<int64_t> offs = element_offsets(d.t);
  const std::vector<uint8_t> img = download_buffer(d);
  std::vector<uint8_t> out(offs.size() * es);
  for (size_t i = 0; i < offs.size(); ++i)
    std::memcpy(out.data() + i * es, img.data() + (d.offset + offs[i]) * es, es);
  return out;
}

// Every byte of the buffer outside the view's elements still holds `fill` (0xFF: the
// poison): the op wrote nothing outside its output.
inline ::testing::AssertionResult outside_untouched(const DeviceTensor& d, uint8_t fill = 0xFF) {
  const size_t es = d.elem_size();
  std::vector<uint8_t> inside(d.buf.bytes(), 0);
  for (int64_t off : element_offsets(d.t))
    std::fill_n(inside.begin() + (d.offset + off) * static_cast<int64_t>(es), es, uint8_t{1});
  const std::vector<uint8_t> img = download_buffer(d);
  for (size_t i = 0; i < img.size(); ++i)
    if (!inside[i] && img[i] != fill)
      return ::testing::AssertionFailure()
             << "byte " << i << " of the buffer, outside the view " << shape_str(d.shape())
             << ", was overwritten (0x" << std::hex << int{img[i]} << ")";
  return ::testing::AssertionSuccess();
}

// Values <-> storage bytes of a float dtype.
inline std::vector<uint8_t> encode(DType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  ref::encode(storage(dtype), values, bytes.data());
  return bytes;
}

inline std::vector<double> decode(DType dtype, const std::vector<uint8_t>& bytes) {
  return ref::decode(storage(dtype), bytes.data(), bytes.size() / dtype_size(dtype));
}

// Rounds `values` to the view's dtype IN PLACE (so the reference sees exactly the inputs
// the GPU sees) and uploads them.
inline void upload_values(const DeviceTensor& d, std::vector<double>& values) {
  values = ref::quantize(storage(d.t.dtype), values);
  upload_bytes(d, encode(d.t.dtype, values));
}

inline std::vector<double> download_values(const DeviceTensor& d) {
  return decode(d.t.dtype, download_bytes(d));
}

// A dense i32 tensor of `shape` holding `values` (lengths, block tables, ids).
inline DeviceTensor upload_i32(const std::vector<int64_t>& shape,
                               const std::vector<int32_t>& values) {
  DeviceTensor d = alloc(DType::i32, shape);
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  upload_bytes(d, bytes);
  return d;
}

// alloc + upload_values.
inline DeviceTensor to_device(DType dtype, const std::vector<int64_t>& shape,
                              std::vector<double>& values) {
  DeviceTensor d = alloc(dtype, shape);
  upload_values(d, values);
  return d;
}

// ---- comparisons -------------------------------------------------------------------------
// out vs the float64 reference under `tol` (see tolerance()). Fails on a size mismatch, on
// any NaN/inf output where the reference is finite (a poisoned element that was never
// written reads back as NaN), on any NaN reference, and when either error bound is exceeded.
//
// `scale` (optional, scale_i >= |ref_i|) replaces |ref| as the magnitude errors are measured
// against. Use it for results that cancel, where fp32 can only be accurate relative to the
// size of the terms: dx = y*(dy - d) of softmax_backward (scale y*(|dy| + |d|)) and sums of
// mixed signs (scale sum |x|).
inline ::testing::AssertionResult all_close(const std::vector<double>& out,
                                            const std::vector<double>& ref, Tolerance tol,
                                            const std::vector<double>& scale = {}) {
  if (out.size() != ref.size() || (!scale.empty() && scale.size() != ref.size()))
    return ::testing::AssertionFailure()
           << "size mismatch: " << out.size() << " outputs vs " << ref.size() << " references";
  size_t bad = 0;
  std::ostringstream first_bad;
  double err2 = 0.0, ref2 = 0.0, max_err = 0.0, max_ref = 0.0;
  size_t max_at = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool ok_special =
        !std::isfinite(ref[i]) && !std::isnan(ref[i]) && out[i] == ref[i];  // matching inf
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) {
      if (ok_special) continue;
      if (bad++ < 4)
        first_bad << "\n  [" << i << "] out " << out[i] << " ref " << ref[i]
                  << (std::isnan(out[i]) ? " (NaN: unwritten/poisoned element?)" : "");
      continue;
    }
    const double e = std::fabs(out[i] - ref[i]);
    const double mag = scale.empty() ? std::fabs(ref[i]) : std::max(scale[i], std::fabs(ref[i]));
    err2 += e * e;
    ref2 += mag * mag;
    max_ref = std::max(max_ref, mag);
    if (e > max_err) {
      max_err = e;
      max_at = i;
    }
  }
  const double rel = ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  const double max_rel = max_ref > 0.0 ? max_err / max_ref : max_err;
  std::ostringstream stats;
  stats.precision(4);
  stats << out.size() << " elements: rel_l2 " << rel << " (tol " << tol.rel_l2 << "), max_abs "
        << max_rel << " (tol " << tol.max_abs << ")" << (scale.empty() ? "" : " vs term scale");
  if (!out.empty())
    stats << ", worst [" << max_at << "] out " << out[max_at] << " ref " << ref[max_at];
  if (bad > 0)
    return ::testing::AssertionFailure()
           << bad << " non-finite element(s) where the reference is finite (or NaN reference)"
           << first_bad.str() << "\n  " << stats.str();
  if (!(rel <= tol.rel_l2) || !(max_rel <= tol.max_abs))
    return ::testing::AssertionFailure() << stats.str();
  return ::testing::AssertionSuccess() << stats.str();
}

inline ::testing::AssertionResult all_close(const std::vector<double>& out,
                                            const std::vector<double>& ref, DType dtype,
                                            const std::vector<double>& scale = {}) {
  return all_close(out, ref, tolerance(dtype), scale);
}

// Term scale of softmax_backward: y * (|dy| + |sum_c y*dy|) per element.
inline std::vector<double> softmax_backward_scale(const std::vector<double>& y,
                                                  const std::vector<double>& dy, int64_t rows,
                                                  int64_t cols) {
  std::vector<double> prod(y.size()), scale(y.size());
  for (size_t i = 0; i < y.size(); ++i) prod[i] = y[i] * dy[i];
  const std::vector<double> d = ref::reduce_sum_rows(prod, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      scale[i] = std::fabs(y[i]) * (std::fabs(dy[i]) + std::fabs(d[static_cast<size_t>(r)]));
    }
  return scale;
}

// Term scale of a row sum: sum_c |x| per row.
inline std::vector<double> abs_row_sums(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> a(x.size());
  for (size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(x[i]);
  return ref::reduce_sum_rows(a, rows, cols);
}

// Byte-for-byte equality, reported per element.
inline ::testing::AssertionResult bit_exact(const std::vector<uint8_t>& out,
                                            const std::vector<uint8_t>& expected,
                                            size_t elem_size) {
  if (out.size() != expected.size())
    return ::testing::AssertionFailure()
           << "size mismatch: " << out.size() << " bytes vs " << expected.size() << " expected";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); i += elem_size)
    if (std::memcmp(out.data() + i, expected.data() + i, elem_size) != 0 && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << std::hex;
  for (size_t b = 0; b < elem_size; ++b) os << (b ? " " : "") << int{out[first + b]};
  os << " vs expected ";
  for (size_t b = 0; b < elem_size; ++b) os << (b ? " " : "") << int{expected[first + b]};
  return ::testing::AssertionFailure()
         << bad << " of " << out.size() / elem_size << " elements differ; first at element "
         << first / elem_size << ": bytes " << os.str();
}

// Parameter name generator for suites parametrized by a DType alone ("f16").
inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return dtype_name(info.param);
}

// Parameter name generator for suites parametrized by (DType, case index) ("bf16_case3").
inline std::string dtype_case_name(const ::testing::TestParamInfo<std::tuple<DType, int>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

}  // namespace tessel::test

// Readable parameter values in GoogleTest output ("f16" rather than "4-byte object <01-00…>").
namespace tessel {
inline void PrintTo(DType d, std::ostream* os) { *os << dtype_name(d); }
inline void PrintTo(UnaryOp op, std::ostream* os) { *os << unary_op_name(op); }
inline void PrintTo(BinaryOp op, std::ostream* os) { *os << binary_op_name(op); }
namespace ref {
inline void PrintTo(Broadcast b, std::ostream* os) { *os << broadcast_name(b); }
}  // namespace ref
}  // namespace tessel
