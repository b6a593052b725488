"""tessel through PyTorch on a GPU: results against torch, the torch.library ops, autograd
and torch.compile. Skipped without a CUDA GPU or without torch; with TESSEL_REQUIRE_GPU=1 a
missing GPU (or torch) fails instead.

    TESSEL_REQUIRE_GPU=1 PYTHONPATH=build/python python3 -m pytest tests/python -q
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

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def check(got, ref):
    torch.testing.assert_close(got.float(), ref.float(), **TOL[got.dtype])


# ---- raw bindings with torch tensors (DLPack) ------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 1024), (3, 5, 4096), (2, 10000)])
def test_softmax(dtype, shape):
    x = randn(*shape, dtype=dtype)
    y = torch.empty_like(x)
    tessel.softmax(x, y)
    check(y, torch.softmax(x.float(), -1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_backward(dtype):
    y = torch.softmax(randn(33, 500), -1).to(dtype)
    dy = randn(33, 500, dtype=dtype)
    dx = torch.empty_like(y)
    tessel.softmax_backward(y, dy, dx)
    yf, dyf = y.float(), dy.float()
    check(dx, yf * (dyf - (yf * dyf).sum(-1, keepdim=True)))


def test_softmax_padded_rows():
    # Row pitch 96 > 80 columns: tessel's rows layout, no copy.
    base = randn(16, 96)
    x = base[:, :80]
    y = torch.empty(16, 96, device="cuda")[:, :80]
    tessel.softmax(x, y)
    check(y, torch.softmax(x, -1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bshape", [(64, 129), (129,), (1, 129), (1,)])
def test_add_mul(dtype, bshape):
    a, b = randn(64, 129, dtype=dtype), randn(*bshape, dtype=dtype)
    out = torch.empty_like(a)
    tessel.add(a, b, out)
    check(out, a.float() + b.float())
    tessel.mul(a, b, out)
    check(out, a.float() * b.float())
    tessel.binary("maximum", a, b, out)
    check(out, torch.maximum(a.float(), b.float()))


@pytest.mark.parametrize("op,ref", [("relu", torch.relu), ("neg", torch.neg),
                                    ("exp", torch.exp), ("silu", torch.nn.functional.silu)])
def test_unary(op, ref):
    x = randn(1000, 3)
    y = torch.empty_like(x)
    tessel.unary(op, x, y)
    check(y, ref(x))


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32, torch.uint8])
@pytest.mark.parametrize("shape", [(1, 1), (31, 65), (512, 384)])
def test_transpose_and_copy(dtype, shape):
    x = torch.randint(0, 100, shape, device="cuda").to(dtype)
    t = torch.empty(shape[::-1], device="cuda", dtype=dtype)
    tessel.transpose(x, t)
    assert torch.equal(t, x.t())
    c = torch.empty_like(x)
    tessel.copy(x, c)
    assert torch.equal(c, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions(dtype):
    x = randn(37, 1000, dtype=dtype)
    rows = torch.empty(37, device="cuda", dtype=torch.float32)
    tessel.reduce_sum_rows(x, rows)
    torch.testing.assert_close(rows, x.float().sum(-1), atol=1e-3, rtol=1e-4)
    total = torch.empty((), device="cuda", dtype=torch.float32)
    tessel.reduce_sum(x, total)
    torch.testing.assert_close(total, x.float().sum(), atol=1e-2, rtol=1e-4)


def test_requires_grad_inputs_accepted():
    x = randn(4, 8).requires_grad_()
    y = torch.empty_like(x)
    tessel.softmax(x, y)
    check(y, torch.softmax(x.detach(), -1))


def test_runs_on_the_current_torch_stream():
    s = torch.cuda.Stream()
    x = randn(256, 4096)
    y = torch.empty_like(x)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        tessel.softmax(x, y)  # stream=None: torch's current stream, i.e. s
        z = y * 2
    torch.cuda.current_stream().wait_stream(s)
    check(z, torch.softmax(x, -1) * 2)
    tessel.softmax(x, y, stream=s)  # a torch.cuda.Stream object
    s.synchronize()
    check(y, torch.softmax(x, -1))


def test_errors_with_torch_tensors():
    x = randn(4, 8)
    with pytest.raises(tessel.TesselArgumentError, match="tessel::softmax.*'x'.*CUDA tensor"):
        tessel.softmax(x.cpu(), x)
    with pytest.raises(tessel.TesselArgumentError, match="'y'"):
        tessel.softmax(x, torch.empty(4, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(tessel.TesselArgumentError, match="'x'.*float64"):
        tessel.softmax(x.double(), x)


def test_cuda_array_interface_from_torch():
    # torch tensors also expose __cuda_array_interface__ (not bf16); exercise that path.
    class CAIOnly:
        def __init__(self, t):
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    x = randn(8, 300)
    y = torch.empty_like(x)
    tessel.softmax(CAIOnly(x), CAIOnly(y))
    torch.cuda.synchronize()
    check(y, torch.softmax(x, -1))
    assert tessel.describe(CAIOnly(x[:, 1:]))["strides"] == (300, 1)


# ---- torch.library custom ops ------------------------------------------------------------
def test_torch_ops_registered():
    assert tessel.torch_ops is not None
    for name in ["softmax", "softmax_backward", "add", "mul", "transpose", "reduce_sum_rows"]:
        assert hasattr(torch.ops.tessel, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_custom_ops(dtype):
    x = randn(64, 257, dtype=dtype)
    b = randn(257, dtype=dtype)
    check(torch.ops.tessel.softmax(x), torch.softmax(x.float(), -1))
    check(torch.ops.tessel.add(x, b), x.float() + b.float())
    check(torch.ops.tessel.mul(x, b), x.float() * b.float())
    assert torch.equal(torch.ops.tessel.transpose(x), x.t())
    check(torch.ops.tessel.reduce_sum_rows(x), x.float().sum(-1))
    # Non-contiguous input: made contiguous by the op.
    check(torch.ops.tessel.softmax(x.t()), torch.softmax(x.t().float(), -1))


def test_custom_ops_opcheck():
    x, b = randn(16, 64), randn(64)
    for op, args in [(torch.ops.tessel.softmax.default, (x,)),
                     (torch.ops.tessel.softmax_backward.default, (x.softmax(-1), x)),
                     (torch.ops.tessel.add.default, (x, b)),
                     (torch.ops.tessel.mul.default, (x, b)),
                     (torch.ops.tessel.transpose.default, (x,)),
                     (torch.ops.tessel.reduce_sum_rows.default, (x,))]:
        torch.library.opcheck(op, args)


def test_autograd():
    x = randn(32, 100).requires_grad_()
    b = randn(100).requires_grad_()
    g = randn(32, 100)

    y = tessel.torch_ops.softmax(tessel.torch_ops.mul(x, b))
    y.backward(g)
    gx, gb = x.grad.clone(), b.grad.clone()
    x.grad = b.grad = None
    torch.softmax(x * b, -1).backward(g)
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gb, b.grad, atol=1e-4, rtol=1e-4)

    x.grad = None
    tessel.torch_ops.reduce_sum_rows(tessel.torch_ops.transpose(x)).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


def test_torch_compile():
    torch._dynamo.reset()

    def f(x, b):
        h = torch.ops.tessel.add(x, b)
        return torch.ops.tessel.reduce_sum_rows(torch.ops.tessel.softmax(h)) + h.sum(-1)

    cf = torch.compile(f, fullgraph=True)
    x, b = randn(48, 320), randn(320)
    torch.testing.assert_close(cf(x, b), f(x, b), atol=1e-5, rtol=1e-5)
    x2 = randn(17, 320)  # a second shape: recompiles (dynamic) without error
    torch.testing.assert_close(cf(x2, b), f(x2, b), atol=1e-5, rtol=1e-5)


def test_torch_compile_backward():
    torch._dynamo.reset()
    x = randn(8, 64).requires_grad_()
    cf = torch.compile(lambda t: torch.ops.tessel.softmax(t * 2).square().sum(), fullgraph=True)
    cf(x).backward()
    gx = x.grad.clone()
    x.grad = None
    torch.softmax(x * 2, -1).square().sum().backward()
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-4)
