"""torch.library ops of the loss / optimizer / shape family (loaded by tessel with torch).

    torch.ops.tessel.cross_entropy(logits, targets, ignore_index, label_smoothing, reduction)
        -> loss; autograd: dlogits were computed in the forward pass (one pass over the
           logits) and are scaled by the incoming gradient in backward.
    torch.ops.tessel.fused_linear_cross_entropy(hidden, weight, targets, ignore_index,
        label_smoothing, reduction) -> loss (mean/sum); gradients computed in forward.
    torch.ops.tessel.concat(tensors, axis) -> tensor
    torch.ops.tessel.transpose_batched(x) -> x.transpose(-1, -2) of a 3-D x
"""

import torch

from . import _tessel
from ._torch import _launch

_RED = {0: "none", 1: "mean", 2: "sum"}


def _register():
    custom_op = torch.library.custom_op

    @custom_op("tessel::cross_entropy_fwd", mutates_args=())
    def cross_entropy_fwd(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                          label_smoothing: float, reduction: int,
                          need_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.contiguous()
        n = logits.shape[0]
        loss = logits.new_empty((n,) if reduction == 0 else (), dtype=torch.float32)
        dl = torch.empty_like(logits) if need_grad else logits.new_empty((0,))
        _launch(_tessel.cross_entropy, logits, logits, targets.contiguous(), loss,
                dl if need_grad else None, ignore_index, label_smoothing, _RED[reduction], 1.0)
        return loss, dl

    @cross_entropy_fwd.register_fake
    def _(logits, targets, ignore_index, label_smoothing, reduction, need_grad):
        n = logits.shape[0]
        loss = logits.new_empty((n,) if reduction == 0 else (), dtype=torch.float32)
        return loss, (torch.empty_like(logits) if need_grad else logits.new_empty((0,)))

    def ce_setup(ctx, inputs, output):
        ctx.save_for_backward(output[1])
        ctx.reduction = inputs[4]

    def ce_grad(ctx, grad_loss, grad_dl):
        (dl,) = ctx.saved_tensors
        if ctx.reduction == 0:
            g = dl * grad_loss.to(dl.dtype).unsqueeze(-1)
        else:
            g = dl * grad_loss.to(dl.dtype)
        return g, None, None, None, None, None

    cross_entropy_fwd.register_autograd(ce_grad, setup_context=ce_setup)

    def cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.0, reduction=1):
        need = torch.is_grad_enabled() and logits.requires_grad
        loss, _ = cross_entropy_fwd(logits, targets, ignore_index, label_smoothing, reduction,
                                    need)
        return loss

    @custom_op("tessel::fused_linear_cross_entropy_fwd", mutates_args=())
    def flce_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                 ignore_index: int, label_smoothing: float, reduction: int,
                 need_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden, weight = hidden.contiguous(), weight.contiguous()
        loss = hidden.new_empty((), dtype=torch.float32)
        dh = torch.empty_like(hidden) if need_grad else hidden.new_empty((0,))
        dw = (torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
              if need_grad else weight.new_empty((0,)))
        _launch(_tessel.fused_linear_cross_entropy, hidden, hidden, weight,
                targets.contiguous(), loss, dh if need_grad else None,
                dw if need_grad else None, ignore_index, label_smoothing, _RED[reduction], 0)
        return loss, dh, dw

    @flce_fwd.register_fake
    def _(hidden, weight, targets, ignore_index, label_smoothing, reduction, need_grad):
        loss = hidden.new_empty((), dtype=torch.float32)
        dh = torch.empty_like(hidden) if need_grad else hidden.new_empty((0,))
        dw = (weight.new_empty(weight.shape, dtype=torch.float32) if need_grad
              else weight.new_empty((0,)))
        return loss, dh, dw

    def flce_setup(ctx, inputs, output):
        ctx.save_for_backward(output[1], output[2])
        ctx.wdtype = inputs[1].dtype

    def flce_grad(ctx, grad_loss, g1, g2):
        dh, dw = ctx.saved_tensors
        return (dh * grad_loss.to(dh.dtype), (dw * grad_loss).to(ctx.wdtype), None, None, None,
                None, None)

    flce_fwd.register_autograd(flce_grad, setup_context=flce_setup)

    def fused_linear_cross_entropy(hidden, weight, targets, ignore_index=-100,
                                   label_smoothing=0.0, reduction=1):
        need = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        return flce_fwd(hidden, weight, targets, ignore_index, label_smoothing, reduction,
                        need)[0]

    @custom_op("tessel::concat", mutates_args=())
    def concat(tensors: list[torch.Tensor], axis: int) -> torch.Tensor:
        tensors = [t.contiguous() for t in tensors]
        shape = list(tensors[0].shape)
        ax = axis % len(shape)
        shape[ax] = sum(t.shape[ax] for t in tensors)
        out = tensors[0].new_empty(shape)
        _launch(_tessel.concat, tensors[0], tensors, out, axis)
        return out

    @concat.register_fake
    def _(tensors, axis):
        shape = list(tensors[0].shape)
        ax = axis % len(shape)
        shape[ax] = sum(t.shape[ax] for t in tensors)
        return tensors[0].new_empty(shape)

    @custom_op("tessel::transpose_batched", mutates_args=())
    def transpose_batched(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = x.new_empty((*x.shape[:-2], x.shape[-1], x.shape[-2]))
        _launch(_tessel.transpose_batched, x, x, out)
        return out

    @transpose_batched.register_fake
    def _(x):
        return x.new_empty((*x.shape[:-2], x.shape[-1], x.shape[-2]))

    transpose_batched.register_autograd(lambda ctx, g: transpose_batched(g),
                                        setup_context=lambda ctx, inputs, output: None)

    return {
        "cross_entropy": cross_entropy,
        "fused_linear_cross_entropy": fused_linear_cross_entropy,
        "concat": concat,
        "transpose_batched": transpose_batched,
    }


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    try:
        from . import torch_ops as _ops

        if _ops is not None:
            for _k, _v in _register().items():
                setattr(_ops, _k, _v)
    except Exception as _e:  # pragma: no cover
        import warnings

        warnings.warn(f"tessel: torch.library registration (loss/optim) failed: {_e}",
                      RuntimeWarning, 2)
