// tessel normalization ops: RMSNorm (optionally fused with the residual add), LayerNorm,
// GroupNorm; forward and backward. Conventions as in ops.hpp: inputs, then outputs, then eps,
// then the stream; every argument validated (dtype -> shape -> strides -> empty: return ->
// device pointers) before anything is launched; f32/f16/bf16 storage, fp32 math.
//
// Row ops (RMS, LN) normalize over the last axis of x (..., C); leading axes fold into rows,
// which may have a row pitch (last axis contiguous). C ≤ 262144. Weight w and bias b are
// (C) with x's dtype; statistics (mean, rstd) are f32 with shape x.shape[:-1], contiguous.
// Optional arguments are pointers (nullptr = absent). Weight gradients are deterministic
// (partial sums per CTA in a workspace, summed in a fixed order; no float atomics).
#pragma once

#include "tessel/tensor.hpp"

namespace tessel {

// ---- RMSNorm -------------------------------------------------------------------------
// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). rstd (optional) receives rstd.
void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, Tensor* rstd, float eps,
              cudaStream_t stream);
// Fused residual add: h = x + residual (written, x's dtype); y = rms_norm(h) * w, with the
// statistics of the fp32 sum. h may alias residual or x exactly (in-place residual stream).
void rms_norm_add(const Tensor& x, const Tensor& residual, const Tensor& w, Tensor& h, Tensor& y,
                  Tensor* rstd, float eps, cudaStream_t stream);
// Backward of rms_norm given the forward's input x (for rms_norm_add: h) and rstd:
//   dx = rstd * (g - xhat * mean(g * xhat)) [+ dh],  g = dy * w, xhat = x * rstd
//   dw = sum over rows of dy * xhat
// dh (optional, x's shape): a gradient added to dx — for rms_norm_add, the gradient of h
// from its other consumers, so that dx is the gradient of both x and residual.
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       const Tensor* dh, Tensor& dx, Tensor& dw, cudaStream_t stream);

// ---- LayerNorm -----------------------------------------------------------------------
// y = (x - mean) * rstd * w [+ b], rstd = 1 / sqrt(var + eps) (biased variance).
void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, Tensor* mean,
                Tensor* rstd, float eps, cudaStream_t stream);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; dw = sum dy * xhat;
// db (optional) = sum dy.
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dw, Tensor* db,
                         cudaStream_t stream);

// ---- GroupNorm -----------------------------------------------------------------------
// x (N, C, *spatial), dense; `groups` divides C; statistics over each (n, g): C/groups
// channels x prod(spatial) elements (≤ 262144). w, b (C) per channel, x's dtype; mean, rstd
// (N, groups) f32. y = (x - mean) * rstd * w[c] [+ b[c]].
void group_norm(const Tensor& x, int64_t groups, const Tensor& w, const Tensor* b, Tensor& y,
                Tensor* mean, Tensor* rstd, float eps, cudaStream_t stream);
// dx as for LayerNorm over each (n, g) with per-channel w; dw[c] = sum_{n,hw} dy * xhat;
// db (optional)[c] = sum_{n,hw} dy.
void group_norm_backward(const Tensor& dy, const Tensor& x, int64_t groups, const Tensor& w,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dw,
                         Tensor* db, cudaStream_t stream);

}  // namespace tessel
