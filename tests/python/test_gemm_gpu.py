"""GEMM ops through PyTorch on a GPU, against torch in float64. Skipped without a CUDA GPU or
torch; TESSEL_REQUIRE_GPU=1 turns the skip into a failure."""

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

ACTS = {"none": lambda x: x, "relu": F.relu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "gelu": F.gelu, "silu": F.silu}


def close(got, ref, tol=2e-2):
    err = (got.double() - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err < tol, f"relative error {err:.3g}"


@pytest.mark.parametrize("act", list(ACTS))
def test_gemm_epilogues(act):
    torch.manual_seed(0)
    x = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(264, 520, device="cuda", dtype=torch.bfloat16) / 20
    bias = torch.randn(264, device="cuda", dtype=torch.float32)
    r = torch.randn(300, 264, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(300, 264, device="cuda", dtype=torch.bfloat16)
    tessel.gemm(x, w, d, bias=bias, c=r, beta=1.0, activation=act)
    ref = ACTS[act](x.double() @ w.double().T + bias.double()) + r.double()
    close(d, ref)


def test_gemm_kn_split_k_deterministic():
    a = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 256, device="cuda", dtype=torch.float16)
    d1 = torch.empty(64, 256, device="cuda", dtype=torch.float32)
    d2 = torch.empty_like(d1)
    tessel.gemm(a, b, d1, b_layout="kn", split_k=5)
    tessel.gemm(a, b, d2, b_layout="kn", split_k=5)
    torch.cuda.synchronize()
    assert torch.equal(d1, d2)
    close(d1, a.double() @ b.double(), 1e-5)


def test_gemm_transposed_a():
    # d = x.T @ dy: the weight-gradient form, a stored (K, M), b (K, N) ("kn")
    x = torch.randn(520, 264, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(520, 136, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(264, 136, device="cuda", dtype=torch.float32)
    tessel.gemm(x, dy, d, b_layout="kn", a_layout="km")
    close(d, x.double().T @ dy.double(), 1e-5)


def test_bmm_shared_weight():
    a = torch.randn(4, 130, 136, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(72, 136, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(4, 130, 72, device="cuda", dtype=torch.bfloat16)
    tessel.bmm(a, w, d)
    close(d, a.double() @ w.double().T)


@pytest.mark.skipif(tessel.torch_ops is None or not hasattr(tessel.torch_ops, "linear"),
                    reason="torch ops not registered")
def test_torch_linear_autograd():
    x = torch.randn(2, 33, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = tessel.torch_ops.linear(x, w, b, "gelu_tanh")
    y.float().square().sum().backward()
    x2, w2, b2 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y2 = F.gelu(x2 @ w2.T + b2, approximate="tanh")
    y2.square().sum().backward()
    close(y, y2.detach())
    close(x.grad, x2.grad, 5e-2)
    close(w.grad, w2.grad, 5e-2)
    close(b.grad, b2.grad, 5e-2)
    a = torch.randn(3, 40, 64, device="cuda", dtype=torch.float16)
    c = torch.randn(3, 64, 48, device="cuda", dtype=torch.float16)
    close(tessel.torch_ops.bmm(a, c), a.double() @ c.double(), 5e-3)


@pytest.mark.skipif(tessel.torch_ops is None or not hasattr(tessel.torch_ops, "linear"),
                    reason="torch ops not registered")
def test_torch_weight_grads_read_transposed():
    # 64 tokens and multiples of 8 everywhere: dW = g.T @ x and bmm's db = a.T @ g take
    # tessel's transposed-A GEMM (a_layout "km") instead of a transposed copy
    x = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    tessel.torch_ops.linear(x, w, None, "none").float().square().sum().backward()
    x2, w2 = (t.detach().double().requires_grad_() for t in (x, w))
    (x2 @ w2.T).square().sum().backward()
    close(w.grad, w2.grad, 2e-2)
    close(x.grad, x2.grad, 2e-2)
    a = torch.randn(3, 40, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    c = torch.randn(3, 64, 48, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    tessel.torch_ops.bmm(a, c).float().square().sum().backward()
    a2, c2 = (t.detach().double().requires_grad_() for t in (a, c))
    (a2 @ c2).square().sum().backward()
    close(c.grad, c2.grad, 2e-2)
    close(a.grad, a2.grad, 2e-2)
