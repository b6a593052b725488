// tessel LLM activations: SwiGLU / GEGLU (gated linear units) and GELU, forward and backward.
// Style of ops.hpp: inputs, outputs, parameters, stream. Tensors are f32/f16/bf16 (all of one
// call the same dtype), math in fp32, one rounding per output. Every tensor is a rows view:
// last axis contiguous, leading axes collapsing into one row pitch (slices of wider buffers
// are fine). Zero-size tensors are a no-op. Nothing is written when validation fails.
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

// GELU flavour: none = exact 0.5·x·(1 + erf(x/√2)); tanh = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))).
enum class GeluApprox : int32_t { none = 0, tanh = 1 };
const char* gelu_approx_name(GeluApprox approx);

// ---- fused (..., 2H) layout, as llama's gate_up projection produces it -------------------
// out (..., H) = silu(x[..., :H]) * x[..., H:]
void silu_and_mul(const Tensor& x, Tensor& out, cudaStream_t stream);
// dx (..., 2H): dx[..., :H] = dout·up·silu'(gate), dx[..., H:] = dout·silu(gate)
void silu_and_mul_backward(const Tensor& x, const Tensor& dout, Tensor& dx, cudaStream_t stream);
// GEGLU: out = gelu(x[..., :H]) * x[..., H:]
void gelu_and_mul(const Tensor& x, Tensor& out, GeluApprox approx, cudaStream_t stream);
void gelu_and_mul_backward(const Tensor& x, const Tensor& dout, Tensor& dx, GeluApprox approx,
                           cudaStream_t stream);

// ---- two-tensor layout: gate, up, out, dout, dgate, dup all (..., H) ----------------------
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t stream);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                     Tensor& dup, cudaStream_t stream);
void geglu(const Tensor& gate, const Tensor& up, Tensor& out, GeluApprox approx,
           cudaStream_t stream);
void geglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                    Tensor& dup, GeluApprox approx, cudaStream_t stream);

// ---- GELU ---------------------------------------------------------------------------------
// y = gelu(x); x, y same shape.
void gelu(const Tensor& x, Tensor& y, GeluApprox approx, cudaStream_t stream);
// dx = dy · gelu'(x)
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluApprox approx,
                   cudaStream_t stream);

}  // namespace tessel
