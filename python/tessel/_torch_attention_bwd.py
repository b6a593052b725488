"""Attention backward as a torch.library custom op, and the autograd formula of
``torch.ops.tessel.attention_forward`` (registered in _torch_attention.py) built on it.

    torch.ops.tessel.attention_backward(q, k, v, out, dout, lse, scale, causal, window_left,
                                        window_right, softcap, sinks, deterministic)
        -> (dq, dk, dv)

q/out/dout (B, Sq, Hq, D), k/v (B, Skv, Hkv, D), lse (B, Hq, Sq) f32. Gradients flow to q, k
and v (not to the sinks). A fake implementation makes it traceable by torch.compile.
"""

from typing import Optional, Tuple

import torch

from . import _tessel
from ._torch import _empty, _launch

registered = False


def _register():
    @torch.library.custom_op("tessel::attention_backward", mutates_args=())
    def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           dout: torch.Tensor, lse: torch.Tensor, scale: float, causal: bool,
                           window_left: int, window_right: int, softcap: float,
                           sinks: Optional[torch.Tensor], deterministic: bool
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = _empty(q), _empty(k), _empty(v)
        s = sinks.to(torch.float32).contiguous() if sinks is not None else None
        _launch(_tessel.attention_backward, q, q, k, v, out, dout.contiguous(), lse, dq, dk, dv,
                scale, causal, window_left, window_right, softcap, s, None, None, None,
                deterministic)
        return dq, dk, dv

    @attention_backward.register_fake
    def _(q, k, v, out, dout, lse, scale, causal, window_left, window_right, softcap, sinks,
          deterministic):
        return _empty(q), _empty(k), _empty(v)

    def setup(ctx, inputs, output):
        q, k, v, scale, causal, window_left, window_right, softcap, sinks = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.args = (scale, causal, window_left, window_right, softcap)

    def grad(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        scale, causal, window_left, window_right, softcap = ctx.args
        dq, dk, dv = attention_backward(q, k, v, out, dout, lse, scale, causal, window_left,
                                        window_right, softcap, sinks, False)
        return dq, dk, dv, None, None, None, None, None, None

    torch.library.register_autograd("tessel::attention_forward", grad, setup_context=setup)


if (hasattr(torch, "library") and hasattr(torch.library, "custom_op")
        and hasattr(torch.library, "register_autograd")
        and hasattr(getattr(torch.ops, "tessel", None), "attention_forward")):
    try:
        _register()
        registered = True
    except Exception as e:  # e.g. registered by another copy of tessel
        import warnings

        warnings.warn(f"tessel: torch.library registration of the attention backward failed: {e}",
                      RuntimeWarning, 2)
