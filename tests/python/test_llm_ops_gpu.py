"""LLM ops through PyTorch on a GPU, against torch (float64 where it matters). Skipped without a
CUDA GPU or torch; TESSEL_REQUIRE_GPU=1 turns the skip into a failure."""

import math
import os

import pytest

import tessel


def _missing():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if tessel.cuda_device_count() == 0 or not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


_reason = _missing()
if _reason is not None:
    if os.environ.get("TESSEL_REQUIRE_GPU", "") not in ("", "0"):
        pytest.fail(f"TESSEL_REQUIRE_GPU is set but {_reason}", pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


def check(got, ref):
    torch.testing.assert_close(got.float(), ref.float(), **TOL[got.dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (7, 254), (33, 8192)])
def test_silu_and_mul_and_grad(dtype, shape):
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    out = torch.empty(shape[0], shape[1] // 2, device="cuda", dtype=dtype)
    tessel.silu_and_mul(x, out)
    h = shape[1] // 2
    xd = x.double().requires_grad_()
    ref = F.silu(xd[:, :h]) * xd[:, h:]
    check(out, ref)
    g = torch.randn_like(out)
    ref.backward(g.double())
    dx = torch.empty_like(x)
    tessel.silu_and_mul_backward(x, g, dx)
    torch.testing.assert_close(dx.float(), xd.grad.float(), atol=TOL[dtype]["atol"] * 4,
                               rtol=TOL[dtype]["rtol"] * 4)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_vs_torch(approximate):
    x = torch.randn(64, 1000, device="cuda")
    y = torch.empty_like(x)
    tessel.gelu(x, y, approximate)
    check(y, F.gelu(x.double(), approximate=approximate))


def test_dropout_deterministic_and_backward():
    x = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
    y1, y2 = torch.empty_like(x), torch.empty_like(x)
    m = torch.empty(x.shape, device="cuda", dtype=torch.uint8)
    tessel.dropout(x, y1, m, p=0.25, seed=5, offset=3)
    tessel.dropout(x, y2, p=0.25, seed=5, offset=3)
    assert torch.equal(y1, y2)
    assert abs(m.float().mean().item() - 0.75) < 0.01
    dx = torch.empty_like(x)
    tessel.dropout_backward(x, dx, p=0.25, seed=5, offset=3)
    assert torch.equal(dx, y1)


def _rope_ref(x, pos, rd, theta, neox):
    x = x.double().clone()
    inv = theta ** (-torch.arange(0, rd, 2, device=x.device, dtype=torch.float64) / rd)
    ang = pos.double()[:, None] * inv[None, :]
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    if neox:
        a, b = x[..., : rd // 2].clone(), x[..., rd // 2: rd].clone()
        x[..., : rd // 2], x[..., rd // 2: rd] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0:rd:2].clone(), x[..., 1:rd:2].clone()
        x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, b * c + a * s
    return x


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_vs_reference(style, dtype):
    T, hq, hkv, d, rd = 37, 8, 2, 128, 64
    q = torch.randn(T, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(T, hkv, d, device="cuda", dtype=dtype)
    pos = torch.randint(0, 4096, (T,), device="cuda")
    rq, rk = _rope_ref(q, pos, rd, 10000.0, style == "neox"), _rope_ref(k, pos, rd, 10000.0, style == "neox")
    tessel.rope(q, k, pos, style=style, rotary_dim=rd)
    check(q, rq)
    check(k, rk)


@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_embedding_vs_torch(mode):
    w = torch.randn(1000, 256, device="cuda")
    ids = torch.randint(0, 1000, (4, 300), device="cuda")
    out = torch.empty(4, 300, 256, device="cuda")
    tessel.embedding(ids, w, out, check_ids=True)
    assert torch.equal(out, F.embedding(ids, w))
    g = torch.randn_like(out)
    dw = torch.empty_like(w)
    tessel.embedding_backward(ids, g, dw, mode=mode)
    ref = torch.zeros(1000, 256, device="cuda", dtype=torch.float64).index_add_(0, ids.flatten(), g.reshape(-1, 256).double())
    check(dw, ref)
    bad = ids.clone()
    bad[1, 7] = 1000
    with pytest.raises(tessel.TesselArgumentError, match="flat position 307"):
        tessel.embedding(bad, w, out, check_ids=True)


def test_torch_ops_autograd():
    if tessel.torch_ops is None:
        pytest.skip("torch.library ops not registered")
    x = torch.randn(5, 64, device="cuda", requires_grad=True)
    y = torch.ops.tessel.silu_and_mul(x)
    y.sum().backward()
    xr = x.detach().clone().requires_grad_()
    (F.silu(xr[:, :32]) * xr[:, 32:]).sum().backward()
    check(x.grad, xr.grad)
    w = torch.randn(50, 16, device="cuda", requires_grad=True)
    ids = torch.randint(0, 50, (40,), device="cuda")
    torch.ops.tessel.embedding(ids, w).sum().backward()
    wr = w.detach().clone().requires_grad_()
    F.embedding(ids, wr).sum().backward()
    check(w.grad, wr.grad)
    x2 = torch.randn(100, 100, device="cuda", requires_grad=True)
    y2 = torch.ops.tessel.dropout(x2, 0.5, 1, 2)
    y2.backward(torch.ones_like(y2))
    assert torch.equal(x2.grad != 0, y2 != 0)
    assert math.isclose((y2 != 0).float().mean().item(), 0.5, abs_tol=0.03)
