"""Norm ops through PyTorch on a GPU: raw bindings vs torch (rms_norm, fused add, layer_norm,
group_norm, backwards), the torch.library ops with autograd (gradcheck-style comparison with
torch's own modules) and torch.compile. Skipped without a GPU or torch (fails instead with
TESSEL_REQUIRE_GPU=1).
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
    return None


_reason = _missing()
if _reason is not None:
    if os.environ.get("TESSEL_REQUIRE_GPU", "") not in ("", "0"):
        pytest.fail(f"TESSEL_REQUIRE_GPU is set but {_reason}", pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float16: dict(atol=4e-3, rtol=4e-3)}


def check(got, ref, scale=1.0):
    tol = TOL[got.dtype]
    torch.testing.assert_close(got.float(), ref.float(), atol=tol["atol"] * scale,
                               rtol=tol["rtol"])


def rms_ref(x, w, eps):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf * rstd * w.float(), rstd.squeeze(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 4096), (3, 5, 4097), (2, 70000),
                                   (2, 262144)])
def test_rms_norm_forward_backward(dtype, shape):
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    y, rstd = torch.empty_like(x), torch.empty(shape[:-1], device="cuda")
    tessel.rms_norm(x, w, y, rstd, eps=1e-6)
    yr, rr = rms_ref(x, w, 1e-6)
    check(y, yr)
    torch.testing.assert_close(rstd, rr, atol=1e-4, rtol=1e-4)
    # backward vs autograd of the float32 reference
    dy = torch.randn_like(x)
    xr = x.float().requires_grad_()
    wr = w.float().requires_grad_()
    (rms_ref(xr, wr, 1e-6)[0] * dy.float()).sum().backward()
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    tessel.rms_norm_backward(dy, x, w, rstd, dx, dw)
    check(dx, xr.grad)
    check(dw, wr.grad, scale=max(1.0, (x.numel() / shape[-1]) ** 0.5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_add(dtype):
    x = torch.randn(33, 1000, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.rand(1000, device="cuda", dtype=dtype) + 0.5
    h, y = torch.empty_like(x), torch.empty_like(x)
    tessel.rms_norm_add(x, r, w, h, y)
    check(h, x.float() + r.float())
    check(y, rms_ref(x.float() + r.float(), w, 1e-6)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 127, 4096, 40000])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_vs_torch(dtype, cols, bias):
    x = torch.randn(17, cols, device="cuda", dtype=dtype) + 1.0
    w = torch.rand(cols, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(cols, device="cuda", dtype=dtype) if bias else None
    y = torch.empty_like(x)
    mean, rstd = torch.empty(17, device="cuda"), torch.empty(17, device="cuda")
    tessel.layer_norm(x, w, b, y, mean, rstd, eps=1e-5)
    check(y, F.layer_norm(x.float(), (cols,), w.float(), None if b is None else b.float(), 1e-5))
    dy = torch.randn_like(x)
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    br = b.float().requires_grad_() if bias else None
    (F.layer_norm(xr, (cols,), wr, br, 1e-5) * dy.float()).sum().backward()
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    db = torch.empty_like(w) if bias else None
    tessel.layer_norm_backward(dy, x, w, mean, rstd, dx, dw, db)
    check(dx, xr.grad)
    check(dw, wr.grad, scale=5.0)
    if bias:
        check(db, br.grad, scale=5.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((2, 6, 7), 3), ((4, 64, 16, 16), 32),
                                          ((2, 320, 8, 8), 32), ((2, 8), 4)])
def test_group_norm_vs_torch(dtype, shape, groups):
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    c = shape[1]
    w = torch.rand(c, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(c, device="cuda", dtype=dtype)
    y = torch.empty_like(x)
    mean = torch.empty(shape[0], groups, device="cuda")
    rstd = torch.empty_like(mean)
    tessel.group_norm(x, groups, w, b, y, mean, rstd, eps=1e-5)
    check(y, F.group_norm(x.float(), groups, w.float(), b.float(), 1e-5))
    dy = torch.randn_like(x)
    xr, wr, br = (t.float().requires_grad_() for t in (x, w, b))
    (F.group_norm(xr, groups, wr, br, 1e-5) * dy.float()).sum().backward()
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    tessel.group_norm_backward(dy, x, groups, w, mean, rstd, dx, dw, db)
    check(dx, xr.grad)
    check(dw, wr.grad, scale=10.0)
    check(db, br.grad, scale=10.0)


# ---- torch.library ops: autograd and torch.compile -------------------------------------
needs_ops = pytest.mark.skipif(tessel.torch_ops is None or not hasattr(tessel.torch_ops, "rms_norm"),
                               reason="tessel torch ops not registered")


@needs_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_ops_autograd(dtype):
    ops = tessel.torch_ops
    x = torch.randn(8, 512, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(8, 512, device="cuda", dtype=dtype, requires_grad=True)
    w = (torch.rand(512, device="cuda", dtype=dtype) + 0.5).requires_grad_()
    b = torch.randn(512, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(8, 512, device="cuda", dtype=dtype)

    def grads(fn):
        for t in (x, r, w, b):
            t.grad = None
        (fn().float() * dy.float()).sum().backward()
        return [None if t.grad is None else t.grad.clone() for t in (x, r, w, b)]

    ours = grads(lambda: ops.layer_norm(x, w, b, 1e-5))
    ref = grads(lambda: F.layer_norm(x, (512,), w, b, 1e-5))
    for g, gr in zip(ours, ref):
        if gr is not None:
            check(g, gr, scale=5.0)
    ours = grads(lambda: ops.rms_norm(x, w, 1e-6))
    ref = grads(lambda: rms_ref(x, w, 1e-6)[0])
    for g, gr in zip(ours[:3:2], ref[:3:2]):
        check(g, gr, scale=5.0)

    def fused():
        y, h = ops.rms_norm_add(x, r, w, 1e-6)
        return y + 0.5 * h

    def fused_ref():
        h = x + r
        return rms_ref(h, w, 1e-6)[0] + 0.5 * h.float()

    ours, ref = grads(fused), grads(fused_ref)
    for g, gr in zip(ours[:3], ref[:3]):
        check(g, gr, scale=5.0)


@needs_ops
def test_torch_ops_group_norm_and_compile():
    ops = tessel.torch_ops
    x = torch.randn(2, 32, 8, 8, device="cuda", requires_grad=True)
    w = (torch.rand(32, device="cuda") + 0.5).requires_grad_()
    b = torch.randn(32, device="cuda", requires_grad=True)
    y = ops.group_norm(x, 8, w, b)
    check(y, F.group_norm(x, 8, w, b))
    y.sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None

    @torch.compile(fullgraph=True)
    def f(x, w):
        return ops.rms_norm(x, w, 1e-6) * 2.0

    xx = torch.randn(4, 256, device="cuda")
    ww = torch.rand(256, device="cuda") + 0.5
    check(f(xx, ww), rms_ref(xx, ww, 1e-6)[0] * 2.0)
