"""Attention backward through PyTorch on a GPU: the autograd formula of
torch.ops.tessel.attention_forward (tessel's backward) against the float64 gradients of
torch's SDPA, and tessel.attention_backward's deterministic flag (bitwise equal runs).
Skipped without a GPU or torch (fails instead with TESSEL_REQUIRE_GPU=1).
"""

import os

import pytest

import tessel


def _missing():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if tessel.cuda_device_count() == 0:
        return "no CUDA GPU (tessel.cuda_device_count() == 0)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    if not hasattr(getattr(torch.ops, "tessel", None), "attention_backward"):
        return "torch.ops.tessel.attention_backward is not registered"
    return None


_reason = _missing()
if _reason is not None:
    if os.environ.get("TESSEL_REQUIRE_GPU", "") not in ("", "0"):
        pytest.fail(f"TESSEL_REQUIRE_GPU is set but {_reason}", pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = [(2, 300, 8, 2, 128), (1, 257, 4, 4, 64)]  # (B, S, Hq, Hkv, D)


def _inputs(b, s, hq, hkv, d):
    torch.manual_seed(0)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                               requires_grad=True)
    return mk(hq), mk(hkv), mk(hkv), torch.randn(b, s, hq, d, device="cuda",
                                                 dtype=torch.bfloat16)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_autograd_matches_sdpa_float64(shape, causal):
    b, s, hq, hkv, d = shape
    q, k, v, g = _inputs(*shape)
    out, lse = torch.ops.tessel.attention_forward(q, k, v, 0.0, causal, -1, -1, 0.0, None)
    grads = torch.autograd.grad(out, (q, k, v), g)
    qr, kr, vr = (t.detach().double().transpose(1, 2).requires_grad_() for t in (q, k, v))
    rep = hq // hkv
    o = F.scaled_dot_product_attention(qr, kr.repeat_interleave(rep, 1),
                                       vr.repeat_interleave(rep, 1), is_causal=causal)
    ref = torch.autograd.grad(o, (qr, kr, vr), g.double().transpose(1, 2))
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        want = want.transpose(1, 2)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel < 8e-3, f"{name}: relative L2 error {rel:.3g}"  # bf16 rel_l2 of testing.md


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_is_bitwise_reproducible(causal):
    q, k, v, g = _inputs(*SHAPES[0])
    out, lse = torch.ops.tessel.attention_forward(q, k, v, 0.0, causal, -1, -1, 0.0, None)
    runs = []
    for _ in range(2):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        tessel.attention_backward(q, k, v, out, g, lse, dq, dk, dv, causal=causal,
                                  deterministic=True)
        runs.append((dq, dk, dv))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
