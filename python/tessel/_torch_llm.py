"""LLM ops as torch.library custom ops (loaded by tessel only when torch imports), with fake
(meta) implementations for torch.compile and autograd formulas through the tessel backward
kernels:

    torch.ops.tessel.silu_and_mul(x)                        SwiGLU on (..., 2H)
    torch.ops.tessel.gelu_and_mul(x, approximate)           GEGLU on (..., 2H)
    torch.ops.tessel.gelu(x, approximate)
    torch.ops.tessel.dropout(x, p, seed, offset)            mask regenerated in backward
    torch.ops.tessel.rope(q, k, positions, style, rotary_dim, theta)   functional (copies)
    torch.ops.tessel.embedding(ids, weight)                 deterministic backward
"""

import torch

from . import _tessel
from ._torch import _empty, _launch

__all__ = ["dropout", "embedding", "gelu", "gelu_and_mul", "rope", "silu_and_mul"]


def _half_last(x):
    return x.new_empty(x.shape[:-1] + (x.shape[-1] // 2,))


def _register():
    op = torch.library.custom_op

    # ---- SwiGLU / GEGLU (fused layout) ----------------------------------------------------
    @op("tessel::silu_and_mul_backward", mutates_args=())
    def silu_and_mul_backward(x: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
        x, dout = x.contiguous(), dout.contiguous()
        dx = _empty(x)
        _launch(_tessel.silu_and_mul_backward, x, x, dout, dx)
        return dx

    silu_and_mul_backward.register_fake(lambda x, dout: _empty(x))

    @op("tessel::silu_and_mul", mutates_args=())
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = _half_last(x)
        _launch(_tessel.silu_and_mul, x, x, out)
        return out

    silu_and_mul.register_fake(lambda x: _half_last(x))

    def save_x(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.extra = inputs[1:]

    silu_and_mul.register_autograd(
        lambda ctx, g: silu_and_mul_backward(ctx.saved_tensors[0], g), setup_context=save_x)

    @op("tessel::gelu_and_mul_backward", mutates_args=())
    def gelu_and_mul_backward(x: torch.Tensor, dout: torch.Tensor, approximate: str) -> torch.Tensor:
        x, dout = x.contiguous(), dout.contiguous()
        dx = _empty(x)
        _launch(lambda a, b, c, s: _tessel.gelu_and_mul_backward(a, b, c, approximate, s), x, x, dout, dx)
        return dx

    gelu_and_mul_backward.register_fake(lambda x, dout, approximate: _empty(x))

    @op("tessel::gelu_and_mul", mutates_args=())
    def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        x = x.contiguous()
        out = _half_last(x)
        _launch(lambda a, b, s: _tessel.gelu_and_mul(a, b, approximate, s), x, x, out)
        return out

    gelu_and_mul.register_fake(lambda x, approximate="none": _half_last(x))
    gelu_and_mul.register_autograd(
        lambda ctx, g: (gelu_and_mul_backward(ctx.saved_tensors[0], g, ctx.extra[0]), None),
        setup_context=save_x)

    # ---- GELU -------------------------------------------------------------------------------
    @op("tessel::gelu_backward", mutates_args=())
    def gelu_backward(x: torch.Tensor, dy: torch.Tensor, approximate: str) -> torch.Tensor:
        x, dy = x.contiguous(), dy.contiguous()
        dx = _empty(x)
        _launch(lambda a, b, c, s: _tessel.gelu_backward(a, b, c, approximate, s), x, x, dy, dx)
        return dx

    gelu_backward.register_fake(lambda x, dy, approximate: _empty(x))

    @op("tessel::gelu", mutates_args=())
    def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        x = x.contiguous()
        y = _empty(x)
        _launch(lambda a, b, s: _tessel.gelu(a, b, approximate, s), x, x, y)
        return y

    gelu.register_fake(lambda x, approximate="none": _empty(x))
    gelu.register_autograd(lambda ctx, g: (gelu_backward(ctx.saved_tensors[0], g, ctx.extra[0]), None),
                           setup_context=save_x)

    # ---- dropout ----------------------------------------------------------------------------
    @op("tessel::dropout_backward", mutates_args=())
    def dropout_backward(dy: torch.Tensor, p: float, seed: int, offset: int) -> torch.Tensor:
        dy = dy.contiguous()
        dx = _empty(dy)
        _launch(lambda a, b, s: _tessel.dropout_backward(a, b, p, seed, offset, s), dy, dy, dx)
        return dx

    dropout_backward.register_fake(lambda dy, p, seed, offset: _empty(dy))

    @op("tessel::dropout", mutates_args=())
    def dropout(x: torch.Tensor, p: float, seed: int, offset: int) -> torch.Tensor:
        x = x.contiguous()
        y = _empty(x)
        _launch(lambda a, b, s: _tessel.dropout(a, b, None, p, seed, offset, s), x, x, y)
        return y

    dropout.register_fake(lambda x, p, seed, offset: _empty(x))

    def drop_setup(ctx, inputs, output):
        ctx.args = inputs[1:]

    dropout.register_autograd(lambda ctx, g: (dropout_backward(g, *ctx.args), None, None, None),
                              setup_context=drop_setup)

    # ---- RoPE (functional: returns rotated copies) ------------------------------------------
    @op("tessel::rope", mutates_args=())
    def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, style: str = "neox",
             rotary_dim: int = 0, theta: float = 10000.0, backward: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
        qo, ko = q.contiguous().clone(), k.contiguous().clone()
        pos = positions.contiguous()
        _launch(lambda a, b, c, s: _tessel.rope(a, b, c, style, rotary_dim, theta, None, backward, s),
                qo, qo, ko, pos)
        return qo, ko

    rope.register_fake(lambda q, k, positions, style="neox", rotary_dim=0, theta=10000.0, backward=False:
                       (_empty(q), _empty(k)))

    def rope_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[2])
        ctx.args = inputs[3:]

    def rope_grad(ctx, gq, gk):
        (pos,) = ctx.saved_tensors
        style, rd, theta, backward = ctx.args
        dq, dk = rope(gq, gk, pos, style, rd, theta, not backward)
        return dq, dk, None, None, None, None, None

    rope.register_autograd(rope_grad, setup_context=rope_setup)

    # ---- embedding ---------------------------------------------------------------------------
    @op("tessel::embedding_backward", mutates_args=())
    def embedding_backward(ids: torch.Tensor, dout: torch.Tensor, vocab: int) -> torch.Tensor:
        ids, dout = ids.contiguous(), dout.contiguous()
        dw = dout.new_empty((vocab, dout.shape[-1]))
        _launch(lambda a, b, c, s: _tessel.embedding_backward(a, b, c, "deterministic", False, s),
                dout, ids, dout, dw)
        return dw

    embedding_backward.register_fake(lambda ids, dout, vocab: dout.new_empty((vocab, dout.shape[-1])))

    @op("tessel::embedding", mutates_args=())
    def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ids = ids.contiguous()
        out = weight.new_empty(ids.shape + (weight.shape[-1],))
        _launch(lambda a, b, c, s: _tessel.embedding(a, b, c, False, s), weight, ids, weight, out)
        return out

    embedding.register_fake(lambda ids, weight: weight.new_empty(ids.shape + (weight.shape[-1],)))

    def emb_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.vocab = inputs[1].shape[0]

    embedding.register_autograd(
        lambda ctx, g: (None, embedding_backward(ctx.saved_tensors[0], g, ctx.vocab)),
        setup_context=emb_setup)

    return dict(silu_and_mul=silu_and_mul, gelu_and_mul=gelu_and_mul, gelu=gelu, dropout=dropout,
                rope=rope, embedding=embedding)


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    try:
        globals().update(_register())
    except Exception as e:  # noqa: BLE001
        import warnings

        warnings.warn(f"tessel: torch.library registration of LLM ops failed: {e}", RuntimeWarning, 2)
