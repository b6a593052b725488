"""Attention forward as a torch.library custom op (loaded by tessel when torch imports).

    torch.ops.tessel.attention_forward(q, k, v, scale, causal, window_left, window_right,
                                       softcap, sinks) -> (out, lse)

q (B, Sq, Hq, D), k/v (B, Skv, Hkv, D); out like q, lse (B, Hq, Sq) f32. Forward only (no
autograd formula yet); a fake implementation makes it traceable by torch.compile.
"""

from typing import Optional, Tuple

import torch

from . import _tessel
from ._torch import _empty, _launch

registered = False


def _register():
    @torch.library.custom_op("tessel::attention_forward", mutates_args=())
    def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                          causal: bool, window_left: int, window_right: int, softcap: float,
                          sinks: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        out = _empty(q)
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        s = sinks.to(torch.float32).contiguous() if sinks is not None else None
        _launch(_tessel.attention_forward, q, q, k, v, out, lse, scale, causal, window_left,
                window_right, softcap, s, None, None)
        return out, lse

    @attention_forward.register_fake
    def _(q, k, v, scale, causal, window_left, window_right, softcap, sinks):
        return _empty(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    try:
        _register()
        registered = True
    except Exception as e:  # e.g. registered by another copy of tessel
        import warnings

        warnings.warn(f"tessel: torch.library registration of the attention op failed: {e}",
                      RuntimeWarning, 2)
