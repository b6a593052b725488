"""tessel loss / optimizer / shape ops through PyTorch on a GPU, against torch (skipped
without a GPU or torch; TESSEL_REQUIRE_GPU=1 makes that a failure)."""

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v", [7, 4097, 32000, 128256])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_torch(dtype, v, reduction):
    n = 37
    x = torch.randn(n, v, device="cuda", dtype=dtype) * 3
    t = torch.randint(0, v, (n,), device="cuda")
    t[::5] = -100
    xr = x.float().requires_grad_(True)
    ref = F.cross_entropy(xr, t, reduction=reduction, label_smoothing=0.1)
    ref.sum().backward() if reduction == "none" else ref.backward()
    loss = torch.empty((n,) if reduction == "none" else (), device="cuda")
    dl = torch.empty_like(x)
    tessel.cross_entropy(x, t, loss, dl, reduction=reduction, label_smoothing=0.1)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss, ref.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(dl.float(), xr.grad, rtol=tol, atol=tol / n)


def test_torch_op_autograd():
    x = torch.randn(16, 1000, device="cuda", requires_grad=True)
    t = torch.randint(0, 1000, (16,), device="cuda")
    loss = tessel.torch_ops.cross_entropy(x, t)
    (2 * loss).backward()
    xr = x.detach().clone().requires_grad_(True)
    (2 * F.cross_entropy(xr, t)).backward()
    torch.testing.assert_close(loss, F.cross_entropy(x.detach(), t), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-7)


def test_fused_linear_cross_entropy_matches_torch():
    n, h, v = 300, 256, 5000
    hid = torch.randn(n, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16) * 0.05
    t = torch.randint(0, v, (n,), device="cuda")
    hl, wl = hid.clone().requires_grad_(True), w.clone().float().requires_grad_(True)
    ref = F.cross_entropy((hl.float() @ wl.t()), t)
    ref.backward()
    loss = torch.empty((), device="cuda")
    dh = torch.empty_like(hid)
    dw = torch.empty(v, h, device="cuda")
    tessel.fused_linear_cross_entropy(hid, w, t, loss, dh, dw, chunk_rows=64)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dh.float(), hl.grad.float(), rtol=5e-2, atol=2e-4)
    torch.testing.assert_close(dw, wl.grad, rtol=5e-2, atol=2e-4)


def test_adamw_matches_torch():
    shapes = [(7,), (4097,), (64, 33)]
    ps = [torch.randn(s, device="cuda") for s in shapes]
    tp = [torch.nn.Parameter(p.clone()) for p in ps]
    opt = torch.optim.AdamW(tp, lr=1e-2, weight_decay=0.1)
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    for step in range(1, 4):
        gs = [torch.randn_like(p) for p in ps]
        for p, g in zip(tp, gs):
            p.grad = g.clone()
        opt.step()
        tessel.adamw(ps, gs, ms, vs, lr=1e-2, weight_decay=0.1, step=step)
    for a, b in zip(ps, tp):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


def test_adamw_group_matches_adamw():
    shapes = [(7,), (4097,), (64, 33)]
    ps = [torch.randn(s, device="cuda") for s in shapes]
    gs = [torch.randn_like(p) for p in ps]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    ps2, ms2, vs2 = [p.clone() for p in ps], [m.clone() for m in ms], [v.clone() for v in vs]
    group = tessel.AdamW(ps2, gs, ms2, vs2)
    assert len(group) == 3
    for step in range(1, 4):
        for g in gs:
            g.normal_()  # in place: the group holds these tensors
        tessel.adamw(ps, gs, ms, vs, lr=1e-2, weight_decay=0.1, step=step)
        group.step(lr=1e-2, weight_decay=0.1, step=step)
    for a, b in zip(ps + ms + vs, ps2 + ms2 + vs2):
        assert torch.equal(a, b)


def test_concat_and_transpose_batched():
    xs = [torch.randn(3, k, 5, device="cuda", dtype=torch.bfloat16) for k in (1, 7, 127)]
    out = torch.empty(3, 135, 5, device="cuda", dtype=torch.bfloat16)
    tessel.concat(xs, out, axis=1)
    assert torch.equal(out, torch.cat(xs, 1))
    assert torch.equal(tessel.torch_ops.concat(xs, 1), torch.cat(xs, 1))
    x = torch.randn(5, 127, 4097, device="cuda")
    y = torch.empty(5, 4097, 127, device="cuda")
    tessel.transpose_batched(x, y)
    assert torch.equal(y, x.transpose(1, 2))
