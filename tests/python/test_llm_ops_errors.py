"""Error paths of the LLM op bindings (no GPU, NumPy or torch needed: fake tensors)."""

import re

import pytest

import tessel
from fake_tensors import CudaArray


def raises_arg(*fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(tessel.TesselArgumentError, match=re.compile(pattern, re.S))


def test_exported():
    for name in ("silu_and_mul", "gelu", "dropout", "rope", "embedding", "embedding_backward"):
        assert name in tessel.__all__ and callable(getattr(tessel, name))


def test_silu_and_mul_shape():
    with raises_arg("tessel::silu_and_mul", "'out'", "(4, 8)"):
        tessel.silu_and_mul(CudaArray((4, 16), "<f2"), CudaArray((4, 16), "<f2"))
    with raises_arg("tessel::silu_and_mul", "'x'", "even"):
        tessel.silu_and_mul(CudaArray((4, 15)), CudaArray((4, 7)))


def test_gelu_approximate():
    with raises_arg("tessel::gelu", "'approximate'"):
        tessel.gelu(CudaArray((4, 8)), CudaArray((4, 8)), approximate="fast")
    with raises_arg("tessel::geglu", "'up'"):
        tessel.geglu(CudaArray((4, 8)), CudaArray((4, 9)), CudaArray((4, 8)))


def test_dropout_args():
    with raises_arg("tessel::dropout", "'p'"):
        tessel.dropout(CudaArray((4, 8)), CudaArray((4, 8)), p=2.0)
    with raises_arg("tessel::dropout_with_mask", "'mask'", "u8"):
        tessel.dropout(CudaArray((4, 8)), CudaArray((4, 8)), CudaArray((4, 8)), p=0.1)


def test_rope_args():
    q, k = CudaArray((4, 8, 64), "<f2"), CudaArray((4, 2, 64), "<f2")
    with raises_arg("tessel::rope", "'positions'"):
        tessel.rope(q, k, CudaArray((5,), "<i8"))
    with raises_arg("tessel::rope", "'style'"):
        tessel.rope(q, k, CudaArray((4,), "<i8"), style="llama")
    with raises_arg("tessel::rope", "'params.rotary_dim'"):
        tessel.rope(q, k, CudaArray((4,), "<i8"), rotary_dim=7)
    with raises_arg("tessel::rope_backward", "'llama3_scaling'"):
        tessel.rope_backward(q, k, CudaArray((4,), "<i8"), llama3_scaling={"bogus": 1})


def test_embedding_args():
    with raises_arg("tessel::embedding", "'ids'", "f32"):
        tessel.embedding(CudaArray((3,)), CudaArray((10, 4)), CudaArray((3, 4)))
    with raises_arg("tessel::embedding", "'out'", "(3, 4)"):
        tessel.embedding(CudaArray((3,), "<i4"), CudaArray((10, 4)), CudaArray((3, 5)))
    with raises_arg("tessel::embedding_backward", "'mode'"):
        tessel.embedding_backward(CudaArray((3,), "<i4"), CudaArray((3, 4)), CudaArray((10, 4)),
                                  mode="fast")


def test_zero_size_noops():
    tessel.silu_and_mul(CudaArray((0, 16)), CudaArray((0, 8)))
    tessel.embedding(CudaArray((0,), "<i8"), CudaArray((10, 4)), CudaArray((0, 4)), check_ids=True)
