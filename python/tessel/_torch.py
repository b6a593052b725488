"""tessel ops as torch.library custom ops (imported by tessel only when torch imports).

Functional, output-allocating ops under the ``tessel`` namespace, with fake (meta)
implementations so that they trace under ``torch.compile``, and autograd formulas:

    torch.ops.tessel.softmax(x)              y, autograd through tessel::softmax_backward
    torch.ops.tessel.softmax_backward(y, dy) dx
    torch.ops.tessel.add(a, b)               a + b (b: a's shape, a row vector, or one element)
    torch.ops.tessel.mul(a, b)               a * b (same broadcasting)
    torch.ops.tessel.transpose(x)            x.T of a 2-D x
    torch.ops.tessel.reduce_sum_rows(x)      x.sum(-1), in x's dtype

The same callables are attributes of this module (``tessel.torch_ops.softmax`` ...). Inputs
are made contiguous; kernels run on the current CUDA stream of the input's device.
"""

import warnings

import torch

from . import _tessel

__all__ = ["add", "mul", "reduce_sum_rows", "registered", "softmax", "softmax_backward",
           "transpose"]

registered = False


def _launch(fn, ref, *args):
    """fn(*args, stream) on ref's device and its current stream; tensors are detached (the
    custom op's autograd formula, not DLPack, tracks gradients)."""
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    if ref.device.type != "cuda":
        fn(*args, 0)  # tessel raises its "expected a CUDA tensor" error
        return
    index = ref.device.index
    if index is None or index == torch.cuda.current_device():
        fn(*args, torch.cuda.current_stream().cuda_stream)
    else:
        with torch.cuda.device(index):
            fn(*args, torch.cuda.current_stream(index).cuda_stream)


def _empty(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _register():
    custom_op = torch.library.custom_op

    # ---- softmax ------------------------------------------------------------------
    @custom_op("tessel::softmax_backward", mutates_args=())
    def softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        y, dy = y.contiguous(), dy.contiguous()
        dx = _empty(y)
        _launch(_tessel.softmax_backward, y, y, dy, dx)
        return dx

    @softmax_backward.register_fake
    def _(y, dy):
        return _empty(y)

    @custom_op("tessel::softmax", mutates_args=())
    def softmax(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = _empty(x)
        _launch(_tessel.softmax, x, x, y)
        return y

    @softmax.register_fake
    def _(x):
        return _empty(x)

    def softmax_setup(ctx, inputs, output):
        ctx.save_for_backward(output)

    def softmax_grad(ctx, grad):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, grad)

    softmax.register_autograd(softmax_grad, setup_context=softmax_setup)

    # ---- add / mul ----------------------------------------------------------------
    @custom_op("tessel::add", mutates_args=())
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        out = _empty(a)
        _launch(_tessel.add, a, a, b, out)
        return out

    @add.register_fake
    def _(a, b):
        return _empty(a)

    def add_setup(ctx, inputs, output):
        ctx.b_shape = inputs[1].shape

    def add_grad(ctx, grad):
        return grad, grad.sum_to_size(ctx.b_shape)

    add.register_autograd(add_grad, setup_context=add_setup)

    @custom_op("tessel::mul", mutates_args=())
    def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        out = _empty(a)
        _launch(_tessel.mul, a, a, b, out)
        return out

    @mul.register_fake
    def _(a, b):
        return _empty(a)

    def mul_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def mul_grad(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad * b if ctx.needs_input_grad[0] else None
        grad_b = (grad * a).sum_to_size(b.shape) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b

    mul.register_autograd(mul_grad, setup_context=mul_setup)

    # ---- transpose ----------------------------------------------------------------
    @custom_op("tessel::transpose", mutates_args=())
    def transpose(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"tessel::transpose: expected a 2-D tensor, got {tuple(x.shape)}")
        x = x.contiguous()
        out = x.new_empty((x.shape[1], x.shape[0]))
        _launch(_tessel.transpose, x, x, out)
        return out

    @transpose.register_fake
    def _(x):
        torch._check(x.dim() == 2, lambda: "tessel::transpose: expected a 2-D tensor")
        return x.new_empty((x.shape[1], x.shape[0]))

    def transpose_grad(ctx, grad):
        return transpose(grad)

    transpose.register_autograd(transpose_grad, setup_context=lambda ctx, inputs, output: None)

    # ---- reduce_sum_rows ----------------------------------------------------------
    @custom_op("tessel::reduce_sum_rows", mutates_args=())
    def reduce_sum_rows(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = x.new_empty(x.shape[:-1])
        _launch(_tessel.reduce_sum_rows, x, x, out)
        return out

    @reduce_sum_rows.register_fake
    def _(x):
        return x.new_empty(x.shape[:-1])

    def rows_setup(ctx, inputs, output):
        ctx.x_shape = inputs[0].shape

    def rows_grad(ctx, grad):
        return grad.unsqueeze(-1).expand(ctx.x_shape)

    reduce_sum_rows.register_autograd(rows_grad, setup_context=rows_setup)

    return {
        "softmax": softmax,
        "softmax_backward": softmax_backward,
        "add": add,
        "mul": mul,
        "transpose": transpose,
        "reduce_sum_rows": reduce_sum_rows,
    }


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):  # torch >= 2.4
    try:
        globals().update(_register())
        registered = True
    except Exception as e:  # e.g. the ops were registered by another copy of tessel
        warnings.warn(f"tessel: torch.library registration failed: {e}", RuntimeWarning, 2)
