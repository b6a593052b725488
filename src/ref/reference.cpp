// tessel float64 CPU references (see reference.hpp).
#include "ref/reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace tessel::ref {
namespace {

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(uint32_t b) { return std::bit_cast<float>(b); }

// double -> float, round to nearest even, overflow to ±inf (spelled out: a plain cast of
// an out-of-range double is undefined behaviour in C++).
float double_to_float_rne(double d) {
  // Halfway between FLT_MAX (odd significand) and 2^128: ties to even go to inf.
  constexpr double kOverflow = 0x1.ffffffp+127;
  if (std::fabs(d) >= kOverflow)
    return std::signbit(d) ? -std::numeric_limits<float>::infinity()
                           : std::numeric_limits<float>::infinity();
  return static_cast<float>(d);
}

// Rounds `d` to float with round-to-odd: truncate toward zero, then set the last bit if
// the result is inexact. Rounding that float to a format with at least 2 fewer
// significand bits (f16: 11, bf16: 8, float: 24) gives the correctly rounded result of
// `d`, which plain double->float->half conversion (two round-to-nearest steps) does not.
float double_to_float_round_odd(double d) {
  float f = double_to_float_rne(d);
  if (!std::isfinite(d) || static_cast<double>(f) == d) return f;
  uint32_t b = float_bits(f);
  // Sign-magnitude: b - 1 steps one ulp toward zero (inf -> max finite, min subnormal -> 0).
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) b -= 1;
  return bits_float(b | 1u);
}

void check_size(const char* fn, const char* arg, size_t got, size_t expected) {
  if (got != expected)
    throw std::invalid_argument(std::string("tessel::ref::") + fn + ": '" + arg + "' has " +
                                std::to_string(got) + " elements, expected " +
                                std::to_string(expected));
}

size_t matrix_size(const char* fn, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(std::string("tessel::ref::") + fn + ": negative rows/cols (" +
                                std::to_string(rows) + ", " + std::to_string(cols) + ")");
  return static_cast<size_t>(rows) * static_cast<size_t>(cols);
}

// Neumaier's compensated sum over x[0], x[stride], ... (n terms).
class CompensatedSum {
 public:
  void add(double v) {
    const double t = sum_ + v;
    if (std::fabs(sum_) >= std::fabs(v))
      comp_ += (sum_ - t) + v;
    else
      comp_ += (v - t) + sum_;
    sum_ = t;
  }
  double value() const {
    // Non-finite partial sums make the compensation meaningless (inf - inf = NaN).
    return std::isfinite(sum_) ? sum_ + comp_ : sum_;
  }

 private:
  double sum_ = 0.0;
  double comp_ = 0.0;
};

}  // namespace

// ---- storage formats ------------------------------------------------------------------

const char* storage_name(Storage s) {
  switch (s) {
    case Storage::f32: return "f32";
    case Storage::f16: return "f16";
    case Storage::bf16: return "bf16";
  }
  return "unknown";
}

size_t storage_size(Storage s) { return s == Storage::f32 ? 4 : 2; }

double unit_roundoff(Storage s) {
  switch (s) {
    case Storage::f32: return std::ldexp(1.0, -24);
    case Storage::f16: return std::ldexp(1.0, -11);
    case Storage::bf16: return std::ldexp(1.0, -8);
  }
  return 0.0;
}

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  }
  // Normal: rebias the exponent from 15 to 127.
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_f16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {
    if (mag == 0x7f800000u) return sign | 0x7c00u;  // inf
    // NaN: keep the top payload bits, force the quiet bit so it stays a NaN.
    return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  }
  // 65520 = 0x477ff000 is halfway between 65504 (max f16, odd significand) and 2^16:
  // ties to even rounds it, and everything above, to inf.
  if (mag >= 0x477ff000u) return sign | 0x7c00u;
  if (mag < 0x38800000u) {
    // Below 2^-14, the f16 normal range: the result is a multiple of 2^-24 (subnormal).
    // 2^-25 (0x33000000) is a tie between 0 and 2^-24 and rounds to even, i.e. 0.
    if (mag <= 0x33000000u) return sign;
    const uint32_t exp = mag >> 23;  // biased, 102..112 here
    const uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp-150); in units of 2^-24 that is mant >> (126 - exp).
    const uint32_t shift = 126u - exp;  // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the normal range
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15), drop 13 mantissa bits with rounding; a carry
  // out of the mantissa correctly bumps the exponent.
  const uint32_t r = mag - 0x38000000u;
  uint32_t q = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  // Round to nearest even on the low 16 bits; overflow carries into inf as IEEE requires.
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

uint16_t double_to_f16_bits(double d) { return float_to_f16_bits(double_to_float_round_odd(d)); }

uint16_t double_to_bf16_bits(double d) { return float_to_bf16_bits(double_to_float_round_odd(d)); }

std::vector<double> decode(Storage s, const void* data, size_t n) {
  std::vector<double> out(n);
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    if (s == Storage::f32) {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      out[i] = s == Storage::f16 ? f16_bits_to_float(h) : bf16_bits_to_float(h);
    }
  }
  return out;
}

void encode(Storage s, std::span<const double> values, void* data) {
  auto* bytes = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < values.size(); ++i) {
    if (s == Storage::f32) {
      const float f = double_to_float_rne(values[i]);
      std::memcpy(bytes + 4 * i, &f, 4);
    } else {
      const uint16_t h =
          s == Storage::f16 ? double_to_f16_bits(values[i]) : double_to_bf16_bits(values[i]);
      std::memcpy(bytes + 2 * i, &h, 2);
    }
  }
}

double quantize(Storage s, double v) {
  switch (s) {
    case Storage::f32: return double_to_float_rne(v);
    case Storage::f16: return f16_bits_to_float(double_to_f16_bits(v));
    case Storage::bf16: return bf16_bits_to_float(double_to_bf16_bits(v));
  }
  return v;
}

std::vector<double> quantize(Storage s, std::span<const double> values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = quantize(s, values[i]);
  return out;
}

// ---- element-wise ---------------------------------------------------------------------

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::identity: return "identity";
    case UnaryOp::neg: return "neg";
    case UnaryOp::abs: return "abs";
    case UnaryOp::exp: return "exp";
    case UnaryOp::relu: return "relu";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::silu: return "silu";
    case UnaryOp::square: return "square";
  }
  return "unknown";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
  }
  return "unknown";
}

double apply(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::identity: return x;
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::relu: return x > 0.0 ? x : (std::isnan(x) ? x : 0.0);
    case UnaryOp::sigmoid: return 1.0 / (1.0 + std::exp(-x));  // exp overflow -> 0, fine
    case UnaryOp::silu: return x / (1.0 + std::exp(-x));
    case UnaryOp::square: return x * x;
  }
  throw std::invalid_argument("tessel::ref::apply: unknown UnaryOp " +
                              std::to_string(static_cast<int>(op)));
}

double apply(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return std::fmax(a, b);
    case BinaryOp::minimum: return std::fmin(a, b);
  }
  throw std::invalid_argument("tessel::ref::apply: unknown BinaryOp " +
                              std::to_string(static_cast<int>(op)));
}

void unary(UnaryOp op, std::span<const double> x, std::span<double> y) {
  check_size("unary", "y", y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = apply(op, x[i]);
}

std::vector<double> unary(UnaryOp op, std::span<const double> x) {
  std::vector<double> y(x.size());
  unary(op, x, y);
  return y;
}

const char* broadcast_name(Broadcast mode) {
  switch (mode) {
    case Broadcast::same: return "same";
    case Broadcast::row: return "row";
    case Broadcast::scalar: return "scalar";
  }
  return "unknown";
}

size_t broadcast_size(Broadcast mode, int64_t rows, int64_t cols) {
  const size_t n = matrix_size("broadcast_size", rows, cols);
  switch (mode) {
    case Broadcast::same: return n;
    case Broadcast::row: return static_cast<size_t>(cols);
    case Broadcast::scalar: return 1;
  }
  throw std::invalid_argument("tessel::ref::broadcast_size: unknown Broadcast mode");
}

void binary(BinaryOp op, std::span<const double> a, std::span<const double> b,
            std::span<double> out, int64_t rows, int64_t cols, Broadcast mode) {
  const size_t n = matrix_size("binary", rows, cols);
  check_size("binary", "a", a.size(), n);
  check_size("binary", "b", b.size(), broadcast_size(mode, rows, cols));
  check_size("binary", "out", out.size(), n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const double bv = mode == Broadcast::same  ? b[i]
                        : mode == Broadcast::row ? b[static_cast<size_t>(c)]
                                                 : b[0];
      out[i] = apply(op, a[i], bv);
    }
  }
}

std::vector<double> binary(BinaryOp op, std::span<const double> a, std::span<const double> b,
                           int64_t rows, int64_t cols, Broadcast mode) {
  std::vector<double> out(matrix_size("binary", rows, cols));
  binary(op, a, b, out, rows, cols, mode);
  return out;
}

// ---- data movement --------------------------------------------------------------------

void transpose(std::span<const double> src, std::span<double> dst, int64_t rows, int64_t cols) {
  const size_t n = matrix_size("transpose", rows, cols);
  check_size("transpose", "src", src.size(), n);
  check_size("transpose", "dst", dst.size(), n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[static_cast<size_t>(c * rows + r)] = src[static_cast<size_t>(r * cols + c)];
}

std::vector<double> transpose(std::span<const double> src, int64_t rows, int64_t cols) {
  std::vector<double> dst(matrix_size("transpose", rows, cols));
  transpose(src, dst, rows, cols);
  return dst;
}

// ---- reductions -----------------------------------------------------------------------

double reduce_sum(std::span<const double> x) {
  CompensatedSum s;
  for (double v : x) s.add(v);
  return s.value();
}

void reduce_sum_rows(std::span<const double> x, std::span<double> out, int64_t rows, int64_t cols) {
  check_size("reduce_sum_rows", "x", x.size(), matrix_size("reduce_sum_rows", rows, cols));
  check_size("reduce_sum_rows", "out", out.size(), static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    out[static_cast<size_t>(r)] =
        reduce_sum(x.subspan(static_cast<size_t>(r * cols), static_cast<size_t>(cols)));
}

std::vector<double> reduce_sum_rows(std::span<const double> x, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  reduce_sum_rows(x, out, rows, cols);
  return out;
}

// ---- softmax --------------------------------------------------------------------------

void softmax(std::span<const double> x, std::span<double> y, int64_t rows, int64_t cols) {
  const size_t n = matrix_size("softmax", rows, cols);
  check_size("softmax", "x", x.size(), n);
  check_size("softmax", "y", y.size(), n);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r * cols);
    double max = -std::numeric_limits<double>::infinity();
    bool has_nan = false;
    for (int64_t c = 0; c < cols; ++c) {
      const double v = x[base + static_cast<size_t>(c)];
      has_nan |= std::isnan(v);
      max = std::max(max, v);
    }
    if (has_nan) max = std::numeric_limits<double>::quiet_NaN();
    // exp(x - max) <= 1: no overflow; the max element contributes exactly 1 to the sum.
    CompensatedSum sum;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = base + static_cast<size_t>(c);
      y[i] = std::exp(x[i] - max);
      sum.add(y[i]);
    }
    const double total = sum.value();
    for (int64_t c = 0; c < cols; ++c) y[base + static_cast<size_t>(c)] /= total;
  }
}

std::vector<double> softmax(std::span<const double> x, int64_t rows, int64_t cols) {
  std::vector<double> y(matrix_size("softmax", rows, cols));
  softmax(x, y, rows, cols);
  return y;
}

void softmax_backward(std::span<const double> y, std::span<const double> dy, std::span<double> dx,
                      int64_t rows, int64_t cols) {
  const size_t n = matrix_size("softmax_backward", rows, cols);
  check_size("softmax_backward", "y", y.size(), n);
  check_size("softmax_backward", "dy", dy.size(), n);
  check_size("softmax_backward", "dx", dx.size(), n);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r * cols);
    CompensatedSum dot;
    for (int64_t c = 0; c < cols; ++c)
      dot.add(y[base + static_cast<size_t>(c)] * dy[base + static_cast<size_t>(c)]);
    const double d = dot.value();
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = base + static_cast<size_t>(c);
      dx[i] = y[i] * (dy[i] - d);
    }
  }
}

std::vector<double> softmax_backward(std::span<const double> y, std::span<const double> dy,
                                     int64_t rows, int64_t cols) {
  std::vector<double> dx(matrix_size("softmax_backward", rows, cols));
  softmax_backward(y, dy, dx, rows, cols);
  return dx;
}

}  // namespace tessel::ref
