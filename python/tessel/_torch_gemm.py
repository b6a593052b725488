"""GEMM ops as torch.library custom ops (loaded by tessel when torch imports).

    torch.ops.tessel.linear(x, weight, bias, activation, residual)
        act(x @ weight.T + bias) + residual; x (..., K), weight (N, K), bias (N,) or None,
        activation "none"/"relu"/"gelu_tanh"/"gelu"/"silu", residual (..., N) or None
    torch.ops.tessel.bmm(a, b)     a (B, M, K) @ b (B, K, N), like torch.bmm

Both have fake implementations (torch.compile) and autograd formulas (the backward matmuls
run on tessel too; activations are differentiated by recomputing the pre-activation).
Inputs are made contiguous and computed in x's dtype (bf16 / f16); bias is used in its own
dtype when f32. ``tessel.torch_ops`` gets ``linear`` and ``bmm``.
"""

from typing import Optional

import torch

from . import _tessel
from ._torch import _launch

registered = False

_ACTS = {
    "none": lambda p: p,
    "relu": torch.relu,
    "gelu_tanh": lambda p: torch.nn.functional.gelu(p, approximate="tanh"),
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
}


def _gemm(a, b, d, bias=None, c=None, beta=0.0, layout="nk", act="none"):
    _launch(_tessel.gemm, a, a, b, d, bias, c, 1.0, beta, layout, act, 0)


def _mm_kn(a, b):
    """a (M, K) @ b (K, N) in a's dtype: tessel where K and N are multiples of 8 (its TMA
    constraint), torch otherwise (backward passes contract over the token count)."""
    if a.shape[-1] % 8 == 0 and b.shape[-1] % 8 == 0:
        d = a.new_empty((*a.shape[:-1], b.shape[-1]))
        if a.dim() == 3:
            _launch(_tessel.bmm, a, a, b, d, None, None, 1.0, 0.0, "kn", "none", 0)
        else:
            _gemm(a, b, d, layout="kn")
        return d
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def _mm_tn(a, b):
    """a.T @ b for a (..., K, M), b (..., K, N) in a's dtype (weight gradients such as
    g.T @ x): tessel reads a transposed (a_layout "km", no transposed copy) where K, M and N
    are multiples of 8, torch otherwise."""
    if a.shape[-2] % 8 == 0 and a.shape[-1] % 8 == 0 and b.shape[-1] % 8 == 0:
        d = a.new_empty((*a.shape[:-2], a.shape[-1], b.shape[-1]))
        fn = _tessel.bmm if a.dim() == 3 else _tessel.gemm
        # (_launch appends the stream; a_layout comes after it)
        _launch(lambda *xs: fn(*xs, "km"), a, a, b, d, None, None, 1.0, 0.0, "kn", "none", 0)
        return d
    return torch.matmul(a.transpose(-1, -2).float(), b.float()).to(a.dtype)


def _register():
    custom_op = torch.library.custom_op

    @custom_op("tessel::linear", mutates_args=())
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               activation: str, residual: Optional[torch.Tensor]) -> torch.Tensor:
        k = x.shape[-1]
        x2 = x.reshape(-1, k).contiguous()
        w = weight.to(x.dtype).contiguous()
        b = None if bias is None else (bias.contiguous() if bias.dtype == torch.float32
                                       else bias.to(x.dtype).contiguous())
        y = x2.new_empty((x2.shape[0], w.shape[0]))
        r = None if residual is None else residual.to(x.dtype).reshape(-1, w.shape[0]).contiguous()
        _gemm(x2, w, y, b, r, 1.0 if r is not None else 0.0, "nk", activation)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @linear.register_fake
    def _(x, weight, bias, activation, residual):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    def linear_setup(ctx, inputs, output):
        x, weight, bias, activation, residual = inputs
        ctx.save_for_backward(x, weight, bias)
        ctx.activation = activation
        ctx.has_residual = residual is not None
        ctx.bias_dtype = None if bias is None else bias.dtype

    def linear_grad(ctx, g):
        x, weight, bias = ctx.saved_tensors
        k, n = x.shape[-1], weight.shape[0]
        x2 = x.reshape(-1, k).contiguous()
        w = weight.to(x.dtype).contiguous()
        g2 = g.reshape(-1, n).to(x.dtype).contiguous()
        if ctx.activation != "none":
            pre = linear(x, weight, bias, "none", None).reshape(-1, n)
            with torch.enable_grad():
                p = pre.detach().float().requires_grad_()
                (gp,) = torch.autograd.grad(_ACTS[ctx.activation](p), p, g2.float())
            g2 = gp.to(x.dtype).contiguous()
        dx = _mm_kn(g2, w)  # g (M, N) @ w (N, K)
        dw = _mm_tn(g2, x2)  # g.T (N, M) @ x (M, K), g read transposed
        db = None if bias is None else g2.float().sum(0).to(ctx.bias_dtype)
        dr = g.reshape(*x.shape[:-1], n) if ctx.has_residual else None
        return dx.reshape(x.shape), dw.to(weight.dtype), db, None, dr

    linear.register_autograd(linear_grad, setup_context=linear_setup)

    @custom_op("tessel::bmm", mutates_args=())
    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.to(a.dtype).contiguous()
        d = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        _launch(_tessel.bmm, a, a, b, d, None, None, 1.0, 0.0, "kn", "none", 0)
        return d

    @bmm.register_fake
    def _(a, b):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    def bmm_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def bmm_grad(ctx, g):
        a, b = ctx.saved_tensors
        g = g.to(a.dtype).contiguous()
        da = _mm_kn(g, b.to(a.dtype).transpose(1, 2).contiguous())  # g (M, N) @ b.T (N, K)
        db = _mm_tn(a, g)  # a.T (K, M) @ g (M, N), a read transposed
        return da, db.to(b.dtype)

    bmm.register_autograd(bmm_grad, setup_context=bmm_setup)
    return linear, bmm


def linear(x, weight, bias=None, activation="none", residual=None):
    """``act(x @ weight.T + bias) + residual`` on tessel (autograd-aware)."""
    return torch.ops.tessel.linear(x, weight, bias, activation, residual)


def bmm(a, b):
    """``a @ b`` for (B, M, K) x (B, K, N), like :func:`torch.bmm` (autograd-aware)."""
    return torch.ops.tessel.bmm(a, b)


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    try:
        _register()
        from . import _torch as _core

        _core.linear = linear  # tessel.torch_ops.linear / .bmm
        _core.bmm = bmm
        registered = True
    except Exception as e:  # e.g. registered by another copy of tessel
        import warnings

        warnings.warn(f"tessel: torch.library registration of the gemm ops failed: {e}",
                      RuntimeWarning, 2)
