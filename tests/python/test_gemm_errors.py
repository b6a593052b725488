"""Error paths of the GEMM bindings (no GPU, NumPy or torch needed: fake tensors)."""

import re

import pytest

import tessel
from fake_tensors import CudaArray


def raises_arg(*fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(tessel.TesselArgumentError, match=re.compile(pattern, re.S))


def test_exported():
    for name in ("gemm", "bmm"):
        assert name in tessel.__all__ and callable(getattr(tessel, name))


def test_gemm_shapes():
    with raises_arg("tessel::gemm", "'d'", "(16, 24)"):
        tessel.gemm(CudaArray((16, 32), "<f2"), CudaArray((24, 32), "<f2"), CudaArray((16, 16), "<f2"))
    with raises_arg("tessel::gemm", "'b'", "multiple of 8"):
        tessel.gemm(CudaArray((16, 32), "<f2"), CudaArray((12, 32), "<f2"), CudaArray((16, 12), "<f2"))


def test_gemm_options():
    a, b, d = CudaArray((16, 32), "<f2"), CudaArray((24, 32), "<f2"), CudaArray((16, 24), "<f2")
    with raises_arg("tessel::gemm", "'b_layout'"):
        tessel.gemm(a, b, d, b_layout="nn")
    with raises_arg("tessel::gemm", "'a_layout'"):
        tessel.gemm(a, b, d, a_layout="mn")
    with raises_arg("tessel::gemm", "'b'", "K = 16 (a's rows"):  # a (K, M) = (16, 32)
        tessel.gemm(a, b, CudaArray((32, 24), "<f2"), a_layout="km")
    with raises_arg("tessel::gemm", "'activation'"):
        tessel.gemm(a, b, d, activation="tanh")
    with raises_arg("tessel::gemm", "'bias'", "(24,)"):
        tessel.gemm(a, b, d, bias=CudaArray((16,), "<f4"))
    with raises_arg("tessel::gemm", "'c'", "beta"):
        tessel.gemm(a, b, d, beta=1.0)


def test_bmm_shapes():
    with raises_arg("tessel::bmm", "'a'", "batch 2"):
        tessel.bmm(CudaArray((3, 16, 32), "<f2"), CudaArray((2, 24, 32), "<f2"),
                   CudaArray((2, 16, 24), "<f2"))
    with raises_arg("tessel::bmm", "'d'", "3-D"):
        tessel.bmm(CudaArray((16, 32), "<f2"), CudaArray((24, 32), "<f2"), CudaArray((16, 24), "<f2"))
