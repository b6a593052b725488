"""GEMM family (include/tessel/gemm.hpp): Hopper tensor-core matrix products with fused
epilogues, ``d = act(alpha * a @ op(b) + bias) + beta * c``.

``a`` is (M, K) (``a_layout="mk"``, the default) or stored transposed, (K, M) (``"km"``: the
weight-gradient form ``x.T @ dy`` without a transpose pass); ``b`` is the nn.Linear weight (N, K) (``b_layout="nk"``, the default) or a
(K, N) matrix (``"kn"``); ``d`` is (M, N), f32/f16/bf16; inputs bf16 or f16. ``bias`` (N,) is
f32 or d's dtype; ``activation`` one of none, relu, gelu_tanh, gelu, silu; ``c`` (like d, may
be d itself) is added after the activation (the residual). Outputs are written in place;
nothing is allocated. Results are deterministic (split-K sums in a fixed order).
"""

from __future__ import annotations

from . import _tessel

__all__ = ["bmm", "gemm"]

ACTIVATIONS = ("none", "relu", "gelu_tanh", "gelu", "silu")


def _plain(t):
    if t is not None and type(t).__module__ == "torch" and getattr(t, "requires_grad", False):
        return t.detach()
    return t


def _stream(tensors, stream):
    from . import _stream_for

    return _stream_for(tensors, stream)


def gemm(a, b, d, bias=None, c=None, alpha=1.0, beta=0.0, b_layout="nk", activation="none",
         split_k=0, stream=None, a_layout="mk") -> None:
    """``d = act(alpha * a @ op(b) + bias) + beta * c``; ``op(b) = b.T`` for ``b_layout="nk"``.
    ``split_k``: 0 automatic, 1 never, S > 1 K slices."""
    _tessel.gemm(_plain(a), _plain(b), _plain(d), _plain(bias), _plain(c), float(alpha),
                 float(beta), b_layout, activation, int(split_k), _stream((a,), stream), a_layout)


def bmm(a, b, d, bias=None, c=None, alpha=1.0, beta=0.0, b_layout="nk", activation="none",
        split_k=0, stream=None, a_layout="mk") -> None:
    """Strided batched :func:`gemm`: ``a`` (B, M, K) or 2-D (shared), ``b`` (B, N, K) /
    (B, K, N) or 2-D (shared), ``d`` and ``c`` (B, M, N)."""
    _tessel.bmm(_plain(a), _plain(b), _plain(d), _plain(bias), _plain(c), float(alpha),
                float(beta), b_layout, activation, int(split_k), _stream((a,), stream), a_layout)
