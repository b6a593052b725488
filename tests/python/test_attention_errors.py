"""Error paths of the attention binding (tessel.attention_forward). Needs no GPU, NumPy or
PyTorch: fake tensors (fake_tensors.py) at made-up device addresses, so only checks made before
memory is touched run, plus zero-size no-ops.
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
    assert callable(tessel.attention_forward)
    assert "attention_forward" in tessel.__all__


def test_head_dim_and_heads():
    with raises_arg("tessel::attention_forward", "'q'", "head dim 96"):
        tessel.attention_forward(B((1, 8, 2, 96)), B((1, 8, 2, 96)), B((1, 8, 2, 96)),
                                 B((1, 8, 2, 96)))
    with raises_arg("tessel::attention_forward", "'k'", "3 heads"):
        tessel.attention_forward(B((1, 8, 4, 64)), B((1, 8, 3, 64)), B((1, 8, 3, 64)),
                                 B((1, 8, 4, 64)))


def test_dtype_and_lse():
    with raises_arg("tessel::attention_forward", "'q'", "f32"):
        q = CudaArray((1, 8, 2, 64), "<f4")
        tessel.attention_forward(q, q, q, q)
    with raises_arg("tessel::attention_forward", "'lse'", "(1, 2, 8)"):
        tessel.attention_forward(B((1, 8, 2, 64)), B((1, 8, 2, 64)), B((1, 8, 2, 64)),
                                 B((1, 8, 2, 64)), CudaArray((1, 8, 2), "<f4"))


def test_parameters_validated():
    args = [B((1, 8, 2, 64)), B((1, 8, 2, 64)), B((1, 8, 2, 64)), B((1, 8, 2, 64))]
    with raises_arg("tessel::attention_forward", "'softcap'"):
        tessel.attention_forward(*args, softcap=-1.0)
    with raises_arg("tessel::attention_forward", "'window_left'"):
        tessel.attention_forward(*args, window_left=-3)
    with raises_arg("tessel::attention_forward", "'cu_seqlens_k'", "only one"):
        tessel.attention_forward(B((8, 2, 64)), B((8, 2, 64)), B((8, 2, 64)), B((8, 2, 64)),
                                 cu_seqlens_q=CudaArray((2,), "<i4"))


def test_empty_is_noop():
    z = B((1, 0, 2, 64))
    tessel.attention_forward(z, B((1, 5, 2, 64)), B((1, 5, 2, 64)), z)
