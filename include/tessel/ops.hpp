// tessel ops: plain functions, inputs then outputs then the stream.
// Every op validates its arguments before touching memory and throws tessel::Error naming
// the op, the argument, what was expected and what it got; on error no output is written.
// Zero-size tensors are a no-op. Unless said otherwise tensors must be dense row-major
// CUDA tensors of f32, f16 or bf16, with math done in fp32.
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

// ---- element-wise --------------------------------------------------------------------
enum class UnaryOp : int32_t { identity, neg, abs, exp, relu, sigmoid, silu, square };
enum class BinaryOp : int32_t { add, sub, mul, div, maximum, minimum };

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);

// y = op(x); x and y same shape and dtype.
void unary(UnaryOp op, const Tensor& x, Tensor& y, cudaStream_t stream);
// out = a op b. b has a's shape, or is a row vector broadcast over a's last axis
// (shape (C) or (1, …, 1, C)), or has one element (a scalar broadcast). out has a's shape.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream);
inline void add(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream) {
  binary(BinaryOp::add, a, b, out, stream);
}
inline void mul(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream) {
  binary(BinaryOp::mul, a, b, out, stream);
}

// ---- data movement (bit-exact; also i32/i64/u8/fp8 for copy) -------------------------
void copy(const Tensor& src, Tensor& dst, cudaStream_t stream);
// dst(C, R) = src(R, C)ᵀ. src may have a row stride (last stride 1).
void transpose(const Tensor& src, Tensor& dst, cudaStream_t stream);

// ---- reductions (fp32 accumulation, deterministic) -----------------------------------
// Whole tensor: out has one element (shape () or (1)), dtype f32 or x's dtype.
void reduce_sum(const Tensor& x, Tensor& out, cudaStream_t stream);
// Along the last axis: x (..., C) -> out (...), dtype f32 or x's dtype.
void reduce_sum_rows(const Tensor& x, Tensor& out, cudaStream_t stream);

// ---- softmax along the last axis -----------------------------------------------------
// y = exp(x - max) / sum(exp(x - max)); x and y same shape and dtype.
void softmax(const Tensor& x, Tensor& y, cudaStream_t stream);
// dx = y * (dy - sum(dy * y)); all three same shape and dtype.
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, cudaStream_t stream);

// Library version string, e.g. "0.1.0".
const char* version();

}  // namespace tessel
