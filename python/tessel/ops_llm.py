"""tessel LLM operator set: activations, dropout, RoPE, embedding.

Every function takes (inputs..., outputs..., params..., stream=None), writes its outputs in
place and allocates nothing (bench/vs_torch.py calls them this way). See the C++ headers
include/tessel/{activation,dropout,rope,embedding}.hpp for the exact semantics.
"""

from __future__ import annotations

from . import _tessel
from . import _plain, _stream_for

__all__ = [
    "dropout", "dropout_backward", "embedding", "embedding_backward", "geglu", "geglu_backward",
    "gelu", "gelu_and_mul", "gelu_and_mul_backward", "gelu_backward", "rope", "rope_backward",
    "silu_and_mul", "silu_and_mul_backward", "swiglu", "swiglu_backward",
]


def silu_and_mul(x, out, stream=None) -> None:
    """``out (..., H) = silu(x[..., :H]) * x[..., H:]`` for ``x (..., 2H)``."""
    _tessel.silu_and_mul(_plain(x), _plain(out), _stream_for((x,), stream))


def silu_and_mul_backward(x, dout, dx, stream=None) -> None:
    """``dx (..., 2H)``: gradient of :func:`silu_and_mul` w.r.t. ``x``."""
    _tessel.silu_and_mul_backward(_plain(x), _plain(dout), _plain(dx), _stream_for((x,), stream))


def gelu_and_mul(x, out, approximate="none", stream=None) -> None:
    """GEGLU on the fused layout: ``out = gelu(x[..., :H]) * x[..., H:]``."""
    _tessel.gelu_and_mul(_plain(x), _plain(out), approximate, _stream_for((x,), stream))


def gelu_and_mul_backward(x, dout, dx, approximate="none", stream=None) -> None:
    _tessel.gelu_and_mul_backward(_plain(x), _plain(dout), _plain(dx), approximate,
                                  _stream_for((x,), stream))


def swiglu(gate, up, out, stream=None) -> None:
    """``out = silu(gate) * up`` (two tensors)."""
    _tessel.swiglu(_plain(gate), _plain(up), _plain(out), _stream_for((gate,), stream))


def swiglu_backward(gate, up, dout, dgate, dup, stream=None) -> None:
    _tessel.swiglu_backward(_plain(gate), _plain(up), _plain(dout), _plain(dgate), _plain(dup),
                            _stream_for((gate,), stream))


def geglu(gate, up, out, approximate="none", stream=None) -> None:
    """``out = gelu(gate) * up`` (two tensors)."""
    _tessel.geglu(_plain(gate), _plain(up), _plain(out), approximate, _stream_for((gate,), stream))


def geglu_backward(gate, up, dout, dgate, dup, approximate="none", stream=None) -> None:
    _tessel.geglu_backward(_plain(gate), _plain(up), _plain(dout), _plain(dgate), _plain(dup),
                           approximate, _stream_for((gate,), stream))


def gelu(x, y, approximate="none", stream=None) -> None:
    """``y = gelu(x)``; approximate 'none' (erf) or 'tanh' (torch's names)."""
    _tessel.gelu(_plain(x), _plain(y), approximate, _stream_for((x,), stream))


def gelu_backward(x, dy, dx, approximate="none", stream=None) -> None:
    _tessel.gelu_backward(_plain(x), _plain(dy), _plain(dx), approximate, _stream_for((x,), stream))


def dropout(x, y, mask=None, p=0.5, seed=0, offset=0, stream=None) -> None:
    """``y = x * keep / (1 - p)``, Philox mask from (seed, offset); ``mask`` (u8) optional."""
    _tessel.dropout(_plain(x), _plain(y), None if mask is None else _plain(mask), float(p),
                    int(seed), int(offset), _stream_for((x,), stream))


def dropout_backward(dy, dx, p=0.5, seed=0, offset=0, stream=None) -> None:
    """``dx = dy * keep / (1 - p)`` with the mask regenerated from (seed, offset)."""
    _tessel.dropout_backward(_plain(dy), _plain(dx), float(p), int(seed), int(offset),
                             _stream_for((dy,), stream))


def rope(q, k, positions, style="neox", rotary_dim=0, theta=10000.0, llama3_scaling=None,
         stream=None) -> None:
    """RoPE in place on ``q (T, Hq, D)`` and ``k (T, Hkv, D)``; ``llama3_scaling`` is None or a
    dict with factor, low_freq_factor, high_freq_factor, original_max_position_embeddings."""
    _tessel.rope(_plain(q), _plain(k), _plain(positions), style, int(rotary_dim), float(theta),
                 llama3_scaling, False, _stream_for((q,), stream))


def rope_backward(dq, dk, positions, style="neox", rotary_dim=0, theta=10000.0,
                  llama3_scaling=None, stream=None) -> None:
    """Inverse rotation of :func:`rope`, in place on ``dq``, ``dk``."""
    _tessel.rope(_plain(dq), _plain(dk), _plain(positions), style, int(rotary_dim), float(theta),
                 llama3_scaling, True, _stream_for((dq,), stream))


def embedding(ids, weight, out, check_ids=False, stream=None) -> None:
    """``out[n] = weight[ids[n]]``; ``check_ids=True`` range-checks on the device and syncs."""
    _tessel.embedding(_plain(ids), _plain(weight), _plain(out), bool(check_ids),
                      _stream_for((weight,), stream))


def embedding_backward(ids, dout, dweight, mode="deterministic", check_ids=False,
                       stream=None) -> None:
    """``dweight`` (overwritten) = scatter-add of ``dout`` rows; mode 'deterministic'/'atomic'."""
    _tessel.embedding_backward(_plain(ids), _plain(dout), _plain(dweight), mode, bool(check_ids),
                               _stream_for((dout,), stream))
