"""tessel: GPU kernels for NVIDIA Hopper.

Every function takes CUDA tensors from any framework: objects implementing DLPack
(``__dlpack__``: PyTorch, CuPy, JAX, ...) or ``__cuda_array_interface__`` (Numba, CuPy, ...).
Outputs are written in place; nothing is allocated. ``stream`` is a ``cudaStream_t`` address
(int) or a stream object (``torch.cuda.Stream``, ``cupy.cuda.Stream``, anything with
``__cuda_stream__``). When it is left as ``None``, tessel uses the current stream of the
framework the tensors come from (PyTorch, CuPy), else the legacy default stream (0).

Errors raise :class:`TesselArgumentError` (a ``ValueError``) for invalid arguments and
:class:`TesselError` (a ``RuntimeError``) otherwise; ``err.code`` is the tessel_status_t.

When PyTorch is importable, the ops are also registered as ``torch.library`` custom ops
(``torch.ops.tessel.softmax`` etc., usable under ``torch.compile``), and
``tessel.torch_ops`` holds output-allocating wrappers around them. Set
``TESSEL_NO_TORCH=1`` to skip that.
"""

from __future__ import annotations

import enum as _enum
import os as _os
import sys as _sys

from . import _tessel
from ._tessel import (TesselArgumentError, TesselError, cuda_device_count, describe,
                      set_dependent_launch)

__version__ = _tessel.version()

__all__ = [
    "Status",
    "TesselArgumentError",
    "TesselError",
    "add",
    "binary",
    "copy",
    "cuda_device_count",
    "describe",
    "mul",
    "reduce_sum",
    "reduce_sum_rows",
    "set_dependent_launch",
    "softmax",
    "softmax_backward",
    "torch_ops",
    "transpose",
    "unary",
    "version",
]


class Status(_enum.IntEnum):
    """tessel_status_t (include/tessel/status.h); the ``code`` of a TesselError."""

    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    CUDA = 3
    NO_DEVICE = 4
    OUT_OF_MEMORY = 5
    INTERNAL = 6


def version() -> str:
    """The library version, e.g. ``"0.1.0"``."""
    return _tessel.version()


def _stream_for(tensors, stream):
    """The stream to launch on: ``stream`` if given, else the current stream of the framework
    of the first tensor that is a PyTorch or CuPy array, else 0."""
    if stream is not None:
        return stream
    for t in tensors:
        module = type(t).__module__
        if module == "torch" and "torch" in _sys.modules:
            if t.device.type == "cuda":
                return _sys.modules["torch"].cuda.current_stream(t.device).cuda_stream
        elif module.startswith("cupy") and "cupy" in _sys.modules:
            return _sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def _plain(t):
    # torch refuses to export tensors that require grad through DLPack; tessel never records
    # autograd history (the torch.library ops below do).
    if type(t).__module__ == "torch" and getattr(t, "requires_grad", False):
        return t.detach()
    return t


def unary(op: str, x, y, stream=None) -> None:
    """``y = op(x)``; op one of identity, neg, abs, exp, relu, sigmoid, silu, square."""
    _tessel.unary(op, _plain(x), _plain(y), _stream_for((x,), stream))


def binary(op: str, a, b, out, stream=None) -> None:
    """``out = a op b``; op one of add, sub, mul, div, maximum, minimum. ``b`` has a's shape,
    is a row vector over a's last axis, or has one element."""
    _tessel.binary(op, _plain(a), _plain(b), _plain(out), _stream_for((a,), stream))


def add(a, b, out, stream=None) -> None:
    """``out = a + b`` (``b`` broadcast as in :func:`binary`)."""
    _tessel.add(_plain(a), _plain(b), _plain(out), _stream_for((a,), stream))


def mul(a, b, out, stream=None) -> None:
    """``out = a * b`` (``b`` broadcast as in :func:`binary`)."""
    _tessel.mul(_plain(a), _plain(b), _plain(out), _stream_for((a,), stream))


def copy(src, dst, stream=None) -> None:
    """``dst = src``, bit-exact (any tessel dtype)."""
    _tessel.copy(_plain(src), _plain(dst), _stream_for((src,), stream))


def transpose(src, dst, stream=None) -> None:
    """``dst (C, R) = src (R, C)`` transposed."""
    _tessel.transpose(_plain(src), _plain(dst), _stream_for((src,), stream))


def reduce_sum(x, out, stream=None) -> None:
    """``out`` (one element, f32 or x's dtype) = sum of all elements of ``x``."""
    _tessel.reduce_sum(_plain(x), _plain(out), _stream_for((x,), stream))


def reduce_sum_rows(x, out, stream=None) -> None:
    """``out (...)`` = ``x (..., C)`` summed over the last axis (f32 or x's dtype)."""
    _tessel.reduce_sum_rows(_plain(x), _plain(out), _stream_for((x,), stream))


def softmax(x, y, stream=None) -> None:
    """``y = softmax(x)`` along the last axis."""
    _tessel.softmax(_plain(x), _plain(y), _stream_for((x,), stream))


def softmax_backward(y, dy, dx, stream=None) -> None:
    """``dx = y * (dy - sum(dy * y))`` along the last axis."""
    _tessel.softmax_backward(_plain(y), _plain(dy), _plain(dx), _stream_for((y,), stream))


def _load_torch_ops():
    if _os.environ.get("TESSEL_NO_TORCH", "") not in ("", "0"):
        return None
    try:
        import torch  # noqa: F401
    except Exception:  # not installed, or a broken install: tessel works without it
        return None
    from . import _torch

    return _torch if _torch.registered else None


torch_ops = _load_torch_ops()


def _load_families():
    """Op families beyond the core live in ``ops_<family>.py`` (wrappers, re-exported here)
    and ``_torch_<family>.py`` (torch.library ops, loaded only with torch)."""
    import importlib
    import pkgutil

    names = sorted(m.name for m in pkgutil.iter_modules(__path__))
    for name in names:
        if name.startswith("ops_"):
            mod = importlib.import_module(f".{name}", __name__)
            for sym in getattr(mod, "__all__", ()):
                globals()[sym] = getattr(mod, sym)
                __all__.append(sym)
    if torch_ops is not None:
        for name in names:
            if name.startswith("_torch_"):
                importlib.import_module(f".{name}", __name__)


_load_families()
