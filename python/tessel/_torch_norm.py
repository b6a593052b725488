"""Norm ops as torch.library custom ops (loaded by tessel when torch imports).

    torch.ops.tessel.rms_norm(x, w, eps)                -> (y, rstd)
    torch.ops.tessel.rms_norm_add(x, residual, w, eps)  -> (y, h, rstd)
    torch.ops.tessel.layer_norm(x, w, b, eps)           -> (y, mean, rstd)      b may be None
    torch.ops.tessel.group_norm(x, groups, w, b, eps)   -> (y, mean, rstd)      b may be None
    torch.ops.tessel.{rms,layer,group}_norm_backward(...) the matching gradients

Each forward has a fake implementation (torch.compile) and an autograd formula through the
backward op. Inputs are made contiguous; weights are cast to x's dtype for the kernel and
their gradients cast back. ``tessel.torch_ops`` gets the module-level helpers
``rms_norm``, ``rms_norm_add``, ``layer_norm``, ``group_norm`` returning just the outputs a
model uses.
"""

from typing import Optional, Tuple

import torch

from . import _tessel
from ._torch import _empty, _launch

registered = False


def _stats(x, shape):
    return x.new_empty(shape, dtype=torch.float32)


def _register():
    custom_op = torch.library.custom_op

    # ---- RMSNorm ------------------------------------------------------------------------
    @custom_op("tessel::rms_norm_backward", mutates_args=())
    def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
                          dh: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        dy, wc = dy.contiguous(), w.to(x.dtype).contiguous()
        dh = dh.contiguous() if dh is not None else None
        dx, dw = _empty(x), torch.empty_like(wc)
        _launch(_tessel.rms_norm_backward, x, dy, x, wc, rstd.contiguous(), dx, dw, dh)
        return dx, dw.to(w.dtype)

    @rms_norm_backward.register_fake
    def _(dy, x, w, rstd, dh):
        return _empty(x), torch.empty_like(w)

    @custom_op("tessel::rms_norm", mutates_args=())
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        y, rstd = _empty(x), _stats(x, x.shape[:-1])
        _launch(_tessel.rms_norm, x, x, w.to(x.dtype).contiguous(), y, rstd, eps)
        return y, rstd

    @rms_norm.register_fake
    def _(x, w, eps):
        return _empty(x), _stats(x, x.shape[:-1])

    def rms_setup(ctx, inputs, output):
        x, w, _ = inputs
        ctx.save_for_backward(x, w, output[1])

    def rms_grad(ctx, gy, grstd):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(gy, x, w, rstd, None)
        return dx, dw, None

    rms_norm.register_autograd(rms_grad, setup_context=rms_setup)

    @custom_op("tessel::rms_norm_add", mutates_args=())
    def rms_norm_add(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor,
                     eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, residual = x.contiguous(), residual.to(x.dtype).contiguous()
        y, h, rstd = _empty(x), _empty(x), _stats(x, x.shape[:-1])
        _launch(_tessel.rms_norm_add, x, x, residual, w.to(x.dtype).contiguous(), h, y, rstd, eps)
        return y, h, rstd

    @rms_norm_add.register_fake
    def _(x, residual, w, eps):
        return _empty(x), _empty(x), _stats(x, x.shape[:-1])

    def rms_add_setup(ctx, inputs, output):
        ctx.save_for_backward(output[1], inputs[2], output[2])
        ctx.residual_dtype = inputs[1].dtype

    def rms_add_grad(ctx, gy, gh, grstd):
        h, w, rstd = ctx.saved_tensors
        if gy is None:
            gy = torch.zeros_like(h)
        dx, dw = rms_norm_backward(gy, h, w, rstd, gh)
        return dx, dx.to(ctx.residual_dtype), dw, None

    rms_norm_add.register_autograd(rms_add_grad, setup_context=rms_add_setup)

    # ---- LayerNorm ----------------------------------------------------------------------
    @custom_op("tessel::layer_norm_backward", mutates_args=())
    def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                            mean: torch.Tensor, rstd: torch.Tensor,
                            has_bias: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        dy, wc = dy.contiguous(), w.to(x.dtype).contiguous()
        dx, dw, db = _empty(x), torch.empty_like(wc), torch.empty_like(wc)
        _launch(_tessel.layer_norm_backward, x, dy, x, wc, mean.contiguous(), rstd.contiguous(),
                dx, dw, db if has_bias else None)
        if not has_bias:
            db.zero_()
        return dx, dw.to(w.dtype), db.to(w.dtype)

    @layer_norm_backward.register_fake
    def _(dy, x, w, mean, rstd, has_bias):
        return _empty(x), torch.empty_like(w), torch.empty_like(w)

    @custom_op("tessel::layer_norm", mutates_args=())
    def layer_norm(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
                   eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        y, mean, rstd = _empty(x), _stats(x, x.shape[:-1]), _stats(x, x.shape[:-1])
        bc = b.to(x.dtype).contiguous() if b is not None else None
        _launch(_tessel.layer_norm, x, x, w.to(x.dtype).contiguous(), bc, y, mean, rstd, eps)
        return y, mean, rstd

    @layer_norm.register_fake
    def _(x, w, b, eps):
        return _empty(x), _stats(x, x.shape[:-1]), _stats(x, x.shape[:-1])

    def ln_setup(ctx, inputs, output):
        x, w, b, _ = inputs
        ctx.has_bias = b is not None
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.save_for_backward(x, w, output[1], output[2])

    def ln_grad(ctx, gy, gmean, grstd):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(gy, x, w, mean, rstd, ctx.has_bias)
        return dx, dw, (db.to(ctx.b_dtype) if ctx.has_bias else None), None

    layer_norm.register_autograd(ln_grad, setup_context=ln_setup)

    # ---- GroupNorm ----------------------------------------------------------------------
    @custom_op("tessel::group_norm_backward", mutates_args=())
    def group_norm_backward(dy: torch.Tensor, x: torch.Tensor, groups: int, w: torch.Tensor,
                            mean: torch.Tensor, rstd: torch.Tensor,
                            has_bias: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        dy, wc = dy.contiguous(), w.to(x.dtype).contiguous()
        dx, dw, db = _empty(x), torch.empty_like(wc), torch.empty_like(wc)
        _launch(_tessel.group_norm_backward, x, dy, x, groups, wc, mean.contiguous(),
                rstd.contiguous(), dx, dw, db if has_bias else None)
        if not has_bias:
            db.zero_()
        return dx, dw.to(w.dtype), db.to(w.dtype)

    @group_norm_backward.register_fake
    def _(dy, x, groups, w, mean, rstd, has_bias):
        return _empty(x), torch.empty_like(w), torch.empty_like(w)

    @custom_op("tessel::group_norm", mutates_args=())
    def group_norm(x: torch.Tensor, groups: int, w: torch.Tensor, b: Optional[torch.Tensor],
                   eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        y = _empty(x)
        mean, rstd = _stats(x, (x.shape[0], groups)), _stats(x, (x.shape[0], groups))
        bc = b.to(x.dtype).contiguous() if b is not None else None
        _launch(_tessel.group_norm, x, x, groups, w.to(x.dtype).contiguous(), bc, y, mean, rstd,
                eps)
        return y, mean, rstd

    @group_norm.register_fake
    def _(x, groups, w, b, eps):
        return _empty(x), _stats(x, (x.shape[0], groups)), _stats(x, (x.shape[0], groups))

    def gn_setup(ctx, inputs, output):
        x, groups, w, b, _ = inputs
        ctx.groups = groups
        ctx.has_bias = b is not None
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.save_for_backward(x, w, output[1], output[2])

    def gn_grad(ctx, gy, gmean, grstd):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = group_norm_backward(gy, x, ctx.groups, w, mean, rstd, ctx.has_bias)
        return dx, None, dw, (db.to(ctx.b_dtype) if ctx.has_bias else None), None

    group_norm.register_autograd(gn_grad, setup_context=gn_setup)

    return {
        "rms_norm_op": rms_norm,
        "rms_norm_add_op": rms_norm_add,
        "rms_norm_backward": rms_norm_backward,
        "layer_norm_op": layer_norm,
        "layer_norm_backward": layer_norm_backward,
        "group_norm_op": group_norm,
        "group_norm_backward": group_norm_backward,
    }


def _helpers(ops):
    def rms_norm(x, w, eps=1e-6):
        """y = RMSNorm(x) * w (autograd through tessel)."""
        return ops["rms_norm_op"](x, w, eps)[0]

    def rms_norm_add(x, residual, w, eps=1e-6):
        """(y, h): h = x + residual, y = RMSNorm(h) * w."""
        y, h, _ = ops["rms_norm_add_op"](x, residual, w, eps)
        return y, h

    def layer_norm(x, w, b=None, eps=1e-5):
        """y = LayerNorm(x) * w + b over the last axis."""
        return ops["layer_norm_op"](x, w, b, eps)[0]

    def group_norm(x, groups, w, b=None, eps=1e-5):
        """y = GroupNorm(x; groups) * w[c] + b[c], x (N, C, *spatial)."""
        return ops["group_norm_op"](x, groups, w, b, eps)[0]

    return {"rms_norm": rms_norm, "rms_norm_add": rms_norm_add, "layer_norm": layer_norm,
            "group_norm": group_norm}


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    try:
        _ops = _register()
        globals().update(_ops)
        _h = _helpers(_ops)
        globals().update(_h)
        from . import _torch as _core

        for _name, _fn in _h.items():  # tessel.torch_ops.rms_norm etc.
            setattr(_core, _name, _fn)
        registered = True
    except Exception as e:  # e.g. registered by another copy of tessel
        import warnings

        warnings.warn(f"tessel: torch.library registration of the norm ops failed: {e}",
                      RuntimeWarning, 2)
