"""Error paths of the attention backward binding (tessel.attention_backward). Needs no GPU,
NumPy or PyTorch: fake tensors (fake_tensors.py) at made-up device addresses, so only checks
made before memory is touched run.
"""

import re

import pytest

import tessel
from fake_tensors import CudaArray


def raises_arg(*fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(tessel.TesselArgumentError, match=re.compile(pattern, re.S))


def B(shape, ptr=0x10000):
    """An f16 tensor (the kernels take bf16 or f16)."""
    return CudaArray(shape, "<f2", ptr=ptr)


def test_function_exported():
    assert callable(tessel.attention_backward)
    assert "attention_backward" in tessel.__all__


def test_lse_dtype_and_shapes():
    q, k = B((1, 8, 4, 64)), B((1, 8, 2, 64))
    with raises_arg("tessel::attention_backward", "'lse'", "f16"):
        tessel.attention_backward(q, k, k, q, q, B((1, 4, 8)), q, k, k)
    lse = CudaArray((1, 4, 8), "<f4")
    with raises_arg("tessel::attention_backward", "'dk'", "(1, 8, 2, 64)"):
        tessel.attention_backward(q, k, k, q, q, lse, q, B((1, 8, 4, 64)), k)
    with raises_arg("tessel::attention_backward", "'d_sinks'", "no sinks"):
        tessel.attention_backward(q, k, k, q, q, lse, q, k, k, d_sinks=CudaArray((4,), "<f4"))
