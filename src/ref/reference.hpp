// tessel float64 CPU references.
//
// Plain C++ (no CUDA headers): every op of include/tessel/ops.hpp computed in double
// precision on host arrays with explicit rows/cols, plus exact conversions between the
// host storage formats (f32, f16, bf16) and double. The GoogleTest suites compare the
// GPU kernels against these; bench uses them to validate results; a CPU backend can call
// them directly.
//
// Conventions
//  * Arrays are dense row-major: a (rows, cols) matrix is rows*cols doubles, row r at
//    offset r*cols. Leading axes of an N-D tensor fold into `rows`.
//  * Output spans may alias the matching input span exactly (in-place), except for
//    transpose (dst must not overlap src).
//  * Sizes are checked: a span whose size does not match rows/cols throws
//    std::invalid_argument naming the function and the argument.
//  * IEEE semantics throughout: NaN propagates, inf stays inf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tessel::ref {

// ---- storage formats ------------------------------------------------------------------
// Conversions are implemented by bit manipulation (no CUDA headers). float -> f16/bf16
// rounds to nearest, ties to even; overflow gives ±inf; NaN stays a (quiet) NaN with its
// sign. double -> f16/bf16 rounds once (not double->float->half double rounding).

enum class Storage : int32_t { f32, f16, bf16 };

const char* storage_name(Storage s);
size_t storage_size(Storage s);  // bytes per element: 4, 2, 2
// Unit roundoff u = 2^-p, p = significand bits including the implicit one: the largest
// relative error of one round-to-nearest. f32 (p=24) 2^-24, f16 (p=11) 2^-11,
// bf16 (p=8) 2^-8.
double unit_roundoff(Storage s);

float f16_bits_to_float(uint16_t h);   // exact
uint16_t float_to_f16_bits(float f);   // round to nearest even
float bf16_bits_to_float(uint16_t b);  // exact
uint16_t float_to_bf16_bits(float f);  // round to nearest even
uint16_t double_to_f16_bits(double d);
uint16_t double_to_bf16_bits(double d);

// `data` holds n elements of storage `s` (host memory, any alignment).
std::vector<double> decode(Storage s, const void* data, size_t n);
// Writes values.size() elements of storage `s` to `data`, rounding to nearest even.
void encode(Storage s, std::span<const double> values, void* data);
// Nearest value representable in `s` (what encode + decode gives).
double quantize(Storage s, double v);
std::vector<double> quantize(Storage s, std::span<const double> values);

// ---- element-wise ---------------------------------------------------------------------
// Same names and numeric values as tessel::UnaryOp / tessel::BinaryOp.
enum class UnaryOp : int32_t { identity, neg, abs, exp, relu, sigmoid, silu, square };
enum class BinaryOp : int32_t { add, sub, mul, div, maximum, minimum };

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);

// identity x; neg -x; abs |x|; exp e^x; relu max(x, 0); sigmoid 1/(1+e^-x);
// silu x*sigmoid(x); square x*x.
double apply(UnaryOp op, double x);
// add, sub, mul, div as IEEE; maximum/minimum as std::fmax/std::fmin (a NaN operand
// yields the other operand, matching CUDA fmaxf/fminf).
double apply(BinaryOp op, double a, double b);

// y[i] = op(x[i]); y.size() == x.size().
void unary(UnaryOp op, std::span<const double> x, std::span<double> y);
std::vector<double> unary(UnaryOp op, std::span<const double> x);

// How `b` maps onto a (rows, cols) `a`:
//   same   b is (rows, cols)
//   row    b is (cols): b[c] is used for every row (broadcast over the leading axes)
//   scalar b has one element
enum class Broadcast : int32_t { same, row, scalar };
const char* broadcast_name(Broadcast mode);
// Number of elements b must have for this mode.
size_t broadcast_size(Broadcast mode, int64_t rows, int64_t cols);

// out[r, c] = op(a[r, c], b[...]) with b broadcast per `mode`.
void binary(BinaryOp op, std::span<const double> a, std::span<const double> b,
            std::span<double> out, int64_t rows, int64_t cols, Broadcast mode);
std::vector<double> binary(BinaryOp op, std::span<const double> a, std::span<const double> b,
                           int64_t rows, int64_t cols, Broadcast mode);

// ---- data movement --------------------------------------------------------------------
// dst (cols, rows) = src (rows, cols) transposed: dst[c*rows + r] = src[r*cols + c].
void transpose(std::span<const double> src, std::span<double> dst, int64_t rows, int64_t cols);
std::vector<double> transpose(std::span<const double> src, int64_t rows, int64_t cols);

// ---- reductions -----------------------------------------------------------------------
// Compensated (Neumaier) summation in double: the result is the exact sum rounded, up to
// an error of about 2 ulp independent of n for any realistic input. Empty sum is 0.
double reduce_sum(std::span<const double> x);
// out[r] = sum_c x[r, c]; out.size() == rows.
void reduce_sum_rows(std::span<const double> x, std::span<double> out, int64_t rows, int64_t cols);
std::vector<double> reduce_sum_rows(std::span<const double> x, int64_t rows, int64_t cols);

// ---- softmax along the last axis ------------------------------------------------------
// y = exp(x - max) / sum(exp(x - max)) per row: never overflows for finite inputs. A row
// whose max is -inf or +inf gives NaN (as the IEEE arithmetic does).
void softmax(std::span<const double> x, std::span<double> y, int64_t rows, int64_t cols);
std::vector<double> softmax(std::span<const double> x, int64_t rows, int64_t cols);
// dx = y * (dy - sum(y * dy)) per row (the softmax vector-Jacobian product).
void softmax_backward(std::span<const double> y, std::span<const double> dy, std::span<double> dx,
                      int64_t rows, int64_t cols);
std::vector<double> softmax_backward(std::span<const double> y, std::span<const double> dy,
                                     int64_t rows, int64_t cols);

}  // namespace tessel::ref
