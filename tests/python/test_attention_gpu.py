"""Attention forward through PyTorch on a GPU: tessel.attention_forward (raw binding on torch
tensors, incl. strided (B, H, S, D) memory read as (B, S, H, D) views, GQA, varlen, sinks) and
the torch.library op torch.ops.tessel.attention_forward, against torch's SDPA (math backend,
fp32) and an explicit fp32 softmax. Skipped without a GPU or torch (fails instead with
TESSEL_REQUIRE_GPU=1).
"""

import itertools
import math
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
    return None


_reason = _missing()
if _reason is not None:
    if os.environ.get("TESSEL_REQUIRE_GPU", "") not in ("", "0"):
        pytest.fail(f"TESSEL_REQUIRE_GPU is set but {_reason}", pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

import torch  # noqa: E402

TOL = {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def reference(q, k, v, causal=False, window_left=-1, softcap=0.0, sinks=None, scale=None):
    """fp32 attention of (B, S, H, D) tensors; returns out (B, Sq, Hq, D) and lse (B, Hq, Sq)."""
    b, sq, hq, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    scale = scale or 1.0 / math.sqrt(d)
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=q.device)[None, :]
    mask = torch.zeros(sq, skv, dtype=torch.bool, device=q.device)
    if causal:
        mask |= j > i
    if window_left >= 0:
        mask |= j < i - window_left
    s = s.masked_fill(mask, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[None, :, None, None].expand(b, hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    if sinks is not None:
        p = p[..., :-1]
    return (p @ vf).transpose(1, 2), lse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_fp32_reference(dtype, d, causal):
    torch.manual_seed(0)
    q = torch.randn(2, 300, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, 333, 2, d, device="cuda", dtype=dtype)
    v = torch.randn(2, 333, 2, d, device="cuda", dtype=dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 8, 300), float("nan"), device="cuda")
    tessel.attention_forward(q, k, v, out, lse, causal=causal)
    ro, rl = reference(q, k, v, causal=causal)
    torch.testing.assert_close(out.float(), ro, **TOL[dtype])
    torch.testing.assert_close(lse, rl, atol=1e-4, rtol=1e-5)


def test_strided_views_match_sdpa():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 257, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    tessel.attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             o.transpose(1, 2), causal=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               is_causal=True)
    torch.testing.assert_close(o.float(), ref, **TOL[torch.bfloat16])


def test_window_softcap_sinks():
    torch.manual_seed(2)
    q = torch.randn(1, 200, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 260, 4, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 260, 4, 64, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(4, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(1, 4, 200, device="cuda")
    tessel.attention_forward(q, k, v, out, lse, causal=True, window_left=50, softcap=5.0,
                             sinks=sinks)
    ro, rl = reference(q, k, v, causal=True, window_left=50, softcap=5.0, sinks=sinks)
    torch.testing.assert_close(out.float(), ro, **TOL[torch.bfloat16])
    torch.testing.assert_close(lse, rl, atol=1e-4, rtol=1e-5)


def test_varlen_matches_per_sequence():
    torch.manual_seed(3)
    lens_q, lens_k = [5, 130, 1], [7, 200, 64]
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], device="cuda", dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens_k), 1, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(lens_k), 1, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(4, sum(lens_q), device="cuda")
    tessel.attention_forward(q, k, v, out, lse, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for i in range(3):
        a, b = int(cu_q[i]), int(cu_q[i + 1])
        c, e = int(cu_k[i]), int(cu_k[i + 1])
        ro, rl = reference(q[None, a:b], k[None, c:e], v[None, c:e], causal=True)
        torch.testing.assert_close(out[a:b].float(), ro[0], **TOL[torch.bfloat16])
        torch.testing.assert_close(lse[:, a:b], rl[0], atol=1e-4, rtol=1e-5)


def test_torch_op():
    if not hasattr(torch.ops, "tessel") or not hasattr(torch.ops.tessel, "attention_forward"):
        pytest.skip("torch.library op not registered")
    torch.manual_seed(4)
    q = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.float16)
    out, lse = torch.ops.tessel.attention_forward(q, k, v, 0.0, True, -1, -1, 0.0, None)
    ro, rl = reference(q, k, v, causal=True)
    torch.testing.assert_close(out.float(), ro, **TOL[torch.float16])
    torch.testing.assert_close(lse, rl, atol=1e-4, rtol=1e-5)


def test_errors_are_tessel_errors():
    q = torch.randn(1, 8, 2, 96, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    with pytest.raises(tessel.TesselArgumentError, match="head dim"):
        tessel.attention_forward(q, q, q, out)
