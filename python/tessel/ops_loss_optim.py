"""Loss, optimizer and shape ops (include/tessel/loss.hpp, optim.hpp, shape_ops.hpp).

Outputs are written in place, nothing is allocated; see ``tessel`` for tensors and streams.
"""

from __future__ import annotations

from . import _tessel

__all__ = [
    "AdamW",
    "adamw",
    "concat",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "transpose_batched",
]


def _plain(t):
    if t is not None and type(t).__module__ == "torch" and getattr(t, "requires_grad", False):
        return t.detach()
    return t


def _stream(tensors, stream):
    from . import _stream_for

    return _stream_for(tensors, stream)


def cross_entropy(logits, targets, loss, dlogits=None, *, ignore_index=-100,
                  label_smoothing=0.0, reduction="mean", grad_scale=1.0, stream=None) -> None:
    """Cross-entropy of ``logits (N, V)`` against ``targets (N)`` (i32/i64) into ``loss``
    ((N) for reduction ``"none"``, one element otherwise; f32 or the logits' dtype). With
    ``dlogits`` (may be ``logits`` itself) the gradient of the reduced loss times
    ``grad_scale`` is written in the same pass."""
    _tessel.cross_entropy(_plain(logits), _plain(targets), _plain(loss), _plain(dlogits),
                          ignore_index, label_smoothing, reduction, grad_scale,
                          _stream((logits,), stream))


def fused_linear_cross_entropy(hidden, weight, targets, loss, dhidden=None, dweight=None, *,
                               ignore_index=-100, label_smoothing=0.0, reduction="mean",
                               chunk_rows=0, stream=None) -> None:
    """``loss = cross_entropy(hidden @ weight.T, targets)`` in row chunks (the logits are never
    whole); ``dhidden`` ((N, H), hidden's dtype or f32) and ``dweight`` ((V, H) f32) optional."""
    _tessel.fused_linear_cross_entropy(
        _plain(hidden), _plain(weight), _plain(targets), _plain(loss), _plain(dhidden),
        _plain(dweight), ignore_index, label_smoothing, reduction, chunk_rows,
        _stream((hidden,), stream))


def adamw(params, grads, exp_avgs, exp_avg_sqs, masters=None, *, lr=1e-3, beta1=0.9,
          beta2=0.999, eps=1e-8, weight_decay=1e-2, step=1, bias_correction=True,
          stream=None) -> None:
    """One AdamW step over lists of tensors, one launch. ``masters`` (optional list, entries
    may be None): fp32 master weights; the params then receive the rounded copy."""
    params = list(params)
    _tessel.adamw([_plain(p) for p in params], [_plain(g) for g in grads],
                  [_plain(m) for m in exp_avgs], [_plain(v) for v in exp_avg_sqs],
                  None if masters is None else [_plain(m) for m in masters],
                  lr, beta1, beta2, eps, weight_decay, step, bias_correction,
                  _stream(params[:1], stream))


class AdamW:
    """Multi-tensor AdamW over fixed tensor lists, converted to kernel arguments once, so a
    training loop's ``step()`` costs one launch and no per-tensor Python work. The tensors
    are held by reference: update ``grads`` in place between steps (no ``set_to_none``)."""

    def __init__(self, params, grads, exp_avgs, exp_avg_sqs, masters=None):
        params = list(params)
        self._first = params[:1]
        self._group = _tessel.AdamWGroup(
            [_plain(p) for p in params], [_plain(g) for g in grads],
            [_plain(m) for m in exp_avgs], [_plain(v) for v in exp_avg_sqs],
            None if masters is None else [_plain(m) for m in masters])

    def __len__(self):
        return len(self._group)

    def step(self, *, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2, step=1,
             bias_correction=True, stream=None) -> None:
        self._group.step(lr, beta1, beta2, eps, weight_decay, step, bias_correction,
                         _stream(self._first, stream))


def concat(inputs, out, axis=0, stream=None) -> None:
    """``out = cat(inputs, axis)`` (dense tensors, any dtype)."""
    inputs = list(inputs)
    _tessel.concat([_plain(t) for t in inputs], _plain(out), axis, _stream(inputs[:1], stream))


def transpose_batched(src, dst, stream=None) -> None:
    """``dst (B, C, R) = src (B, R, C)`` transposed per batch."""
    _tessel.transpose_batched(_plain(src), _plain(dst), _stream((src,), stream))
