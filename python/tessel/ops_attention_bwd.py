"""Attention backward (include/tessel/attention_backward.hpp): the gradients of
``attention_forward`` with respect to q, k, v (and the sinks), FlashAttention-2 style.

Layouts as ``attention_forward``: q/out/dout/dq ``(B, Sq, Hq, D)``, k/v/dk/dv
``(B, Skv, Hkv, D)``, lse ``(B, Hq, Sq)`` f32 (the forward's); varlen ``(Tq, Hq, D)``,
``(Tk, Hkv, D)``, lse ``(Hq, Tq)``. Only the last axis must be contiguous. Outputs are
written in place; the f32 workspaces come from the stream-ordered allocator.
"""

from __future__ import annotations

from . import _tessel

__all__ = ["attention_backward"]


def _plain(t):
    if t is not None and type(t).__module__ == "torch" and getattr(t, "requires_grad", False):
        return t.detach()
    return t


def _stream(tensors, stream):
    from . import _stream_for

    return _stream_for(tensors, stream)


def attention_backward(q, k, v, out, dout, lse, dq, dk, dv, scale=0.0, causal=False,
                       window_left=-1, window_right=-1, softcap=0.0, sinks=None, d_sinks=None,
                       cu_seqlens_q=None, cu_seqlens_k=None, deterministic=False,
                       stream=None) -> None:
    """Writes dq, dk, dv (and ``d_sinks``, f32 (Hq), when given with ``sinks``) for the
    forward call with the same masking arguments. GQA: dk/dv of a kv head sum over its q
    heads. ``deterministic=True``: bitwise reproducible (no float atomics; a little slower)."""
    _tessel.attention_backward(_plain(q), _plain(k), _plain(v), _plain(out), _plain(dout),
                               _plain(lse), _plain(dq), _plain(dk), _plain(dv), float(scale),
                               bool(causal), int(window_left), int(window_right),
                               float(softcap), _plain(sinks), _plain(d_sinks),
                               _plain(cu_seqlens_q), _plain(cu_seqlens_k), bool(deterministic),
                               _stream((q,), stream))
