"""Normalization ops (include/tessel/norm.hpp): RMSNorm (optionally fused with the residual
add), LayerNorm and GroupNorm, forward and backward.

Arguments are inputs, then outputs, then ``eps``, then ``stream``; outputs are written in
place, nothing is allocated; optional tensors are ``None``. Weights/biases have x's dtype;
statistics (``mean``, ``rstd``) are f32 with shape ``x.shape[:-1]`` (GroupNorm: ``(N, groups)``).
Weight gradients are deterministic (no float atomics).
"""

from __future__ import annotations

from . import _tessel

__all__ = [
    "group_norm",
    "group_norm_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_add",
    "rms_norm_backward",
]


def _plain(t):
    if t is not None and type(t).__module__ == "torch" and getattr(t, "requires_grad", False):
        return t.detach()
    return t


def _stream(tensors, stream):
    from . import _stream_for

    return _stream_for(tensors, stream)


def rms_norm(x, w, y, rstd=None, eps=1e-6, stream=None) -> None:
    """``y = x * rstd * w`` over the last axis, ``rstd = 1/sqrt(mean(x^2) + eps)`` (written to
    ``rstd`` if given)."""
    _tessel.rms_norm(_plain(x), _plain(w), _plain(y), _plain(rstd), eps, _stream((x,), stream))


def rms_norm_add(x, residual, w, h, y, rstd=None, eps=1e-6, stream=None) -> None:
    """``h = x + residual`` (``h`` may be ``residual``); ``y = rms_norm(h) * w``."""
    _tessel.rms_norm_add(_plain(x), _plain(residual), _plain(w), _plain(h), _plain(y),
                         _plain(rstd), eps, _stream((x,), stream))


def rms_norm_backward(dy, x, w, rstd, dx, dw, dh=None, stream=None) -> None:
    """``dx = rstd*(g - xhat*mean(g*xhat)) [+ dh]``, ``g = dy*w``, ``xhat = x*rstd``;
    ``dw = sum over rows of dy*xhat``. ``x`` is the forward's input (``h`` for rms_norm_add)."""
    _tessel.rms_norm_backward(_plain(dy), _plain(x), _plain(w), _plain(rstd), _plain(dx),
                              _plain(dw), _plain(dh), _stream((dy,), stream))


def layer_norm(x, w, b, y, mean=None, rstd=None, eps=1e-5, stream=None) -> None:
    """``y = (x - mean) * rstd * w [+ b]`` over the last axis (``b`` may be None)."""
    _tessel.layer_norm(_plain(x), _plain(w), _plain(b), _plain(y), _plain(mean), _plain(rstd),
                       eps, _stream((x,), stream))


def layer_norm_backward(dy, x, w, mean, rstd, dx, dw, db=None, stream=None) -> None:
    """LayerNorm backward: ``dx``, ``dw = sum dy*xhat`` and ``db = sum dy`` (if given)."""
    _tessel.layer_norm_backward(_plain(dy), _plain(x), _plain(w), _plain(mean), _plain(rstd),
                                _plain(dx), _plain(dw), _plain(db), _stream((dy,), stream))


def group_norm(x, groups, w, b, y, mean=None, rstd=None, eps=1e-5, stream=None) -> None:
    """GroupNorm of ``x (N, C, *spatial)`` with ``groups`` groups, per-channel ``w``, ``b``."""
    _tessel.group_norm(_plain(x), int(groups), _plain(w), _plain(b), _plain(y), _plain(mean),
                       _plain(rstd), eps, _stream((x,), stream))


def group_norm_backward(dy, x, groups, w, mean, rstd, dx, dw, db=None, stream=None) -> None:
    """GroupNorm backward: ``dx``, per-channel ``dw`` and ``db`` (if given)."""
    _tessel.group_norm_backward(_plain(dy), _plain(x), int(groups), _plain(w), _plain(mean),
                                _plain(rstd), _plain(dx), _plain(dw), _plain(db),
                                _stream((dy,), stream))
