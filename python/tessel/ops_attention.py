"""Attention forward (include/tessel/attention.hpp): fused scaled-dot-product attention for
Hopper (TMA + WGMMA), bf16/f16, head dims 64/128/256.

Layouts: q ``(B, Sq, Hq, D)``, k/v ``(B, Skv, Hkv, D)``, out like q, lse ``(B, Hq, Sq)`` f32;
variable length (``cu_seqlens_q`` and ``cu_seqlens_k``, int32 ``(B+1)``): q ``(Tq, Hq, D)``,
k/v ``(Tk, Hkv, D)``, lse ``(Hq, Tq)``. Only the last axis must be contiguous (slices of a
packed qkv work). Causal masks are bottom-right aligned when Sq != Skv. Outputs are written
in place, nothing is allocated.
"""

from __future__ import annotations

from . import _tessel

__all__ = ["attention_forward"]


def _plain(t):
    if t is not None and type(t).__module__ == "torch" and getattr(t, "requires_grad", False):
        return t.detach()
    return t


def _stream(tensors, stream):
    from . import _stream_for

    return _stream_for(tensors, stream)


def attention_forward(q, k, v, out, lse=None, scale=0.0, causal=False, window_left=-1,
                      window_right=-1, softcap=0.0, sinks=None, cu_seqlens_q=None,
                      cu_seqlens_k=None, stream=None) -> None:
    """``out = softmax(scale * q k^T) v`` per (batch, q head) with k/v head
    ``h // (Hq // Hkv)``. ``scale <= 0``: ``1/sqrt(D)``; ``softcap > 0``: logits pass through
    ``softcap * tanh(s / softcap)``; window_left/right (-1: unlimited) limit the keys around the
    (bottom-right aligned) diagonal; ``sinks`` (f32, Hq) adds ``exp(sink)`` to each softmax
    denominator; ``lse`` (optional) receives the natural-log log-sum-exp."""
    _tessel.attention_forward(_plain(q), _plain(k), _plain(v), _plain(out), _plain(lse),
                              float(scale), bool(causal), int(window_left), int(window_right),
                              float(softcap), _plain(sinks), _plain(cu_seqlens_q),
                              _plain(cu_seqlens_k), _stream((q,), stream))
