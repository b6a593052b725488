"""Error paths of the loss / optimizer / shape bindings (no GPU, NumPy or PyTorch needed:
fake tensors at made-up device addresses)."""

import re

import pytest

import tessel
from fake_tensors import CudaArray


def raises_arg(*fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(tessel.TesselArgumentError, match=re.compile(pattern, re.S))


def test_exported():
    for name in ("cross_entropy", "fused_linear_cross_entropy", "adamw", "concat",
                 "transpose_batched"):
        assert name in tessel.__all__ and callable(getattr(tessel, name))


def test_cross_entropy_errors():
    x, t, loss = CudaArray((4, 100), "<f4"), CudaArray((4,), "<i8"), CudaArray((), "<f4")
    with raises_arg("tessel::cross_entropy", "'targets'", "(4,)"):
        tessel.cross_entropy(x, CudaArray((5,), "<i8"), loss)
    with raises_arg("tessel::cross_entropy", "'targets'"):
        tessel.cross_entropy(x, CudaArray((4,), "<f4"), loss)
    with raises_arg("tessel::cross_entropy", "'loss'", "(4,)"):
        tessel.cross_entropy(x, t, loss, reduction="none")
    with raises_arg("tessel::cross_entropy", "'reduction'"):
        tessel.cross_entropy(x, t, loss, reduction="avg")
    with raises_arg("tessel::cross_entropy", "'label_smoothing'"):
        tessel.cross_entropy(x, t, loss, label_smoothing=2.0)
    with raises_arg("tessel::cross_entropy", "'dlogits'", "f16"):
        tessel.cross_entropy(x, t, loss, CudaArray((4, 100), "<f2"))
    tessel.cross_entropy(CudaArray((0, 100)), CudaArray((0,), "<i4"), loss)  # no-op


def test_fused_linear_cross_entropy_errors():
    h, w = CudaArray((6, 64), "<f2"), CudaArray((128, 64), "<f2")
    t, loss = CudaArray((6,), "<i4"), CudaArray((1,), "<f4")
    with raises_arg("tessel::fused_linear_cross_entropy", "'hidden'"):
        tessel.fused_linear_cross_entropy(CudaArray((6, 64)), w, t, loss)
    with raises_arg("tessel::fused_linear_cross_entropy", "'dweight'"):
        tessel.fused_linear_cross_entropy(h, w, t, loss, None, CudaArray((128, 64), "<f2"))
    with raises_arg("tessel::fused_linear_cross_entropy", "'chunk_rows'"):
        tessel.fused_linear_cross_entropy(h, w, t, loss, chunk_rows=3)
    with raises_arg("tessel::fused_linear_cross_entropy", "'weight'", "multiple of 8"):
        tessel.fused_linear_cross_entropy(h, CudaArray((100, 64), "<f2"), t, loss)


def test_adamw_errors():
    p, g = CudaArray((10,)), CudaArray((10,))
    m, v = CudaArray((10,)), CudaArray((10,))
    with raises_arg("tessel::adamw", "'list[0].exp_avg'", "f16"):
        tessel.adamw([p], [g], [CudaArray((10,), "<f2")], [v])
    with raises_arg("tessel::adamw", "'list[0].grad'", "(11"):
        tessel.adamw([p], [CudaArray((11,))], [m], [v])
    with raises_arg("tessel::adamw", "'step'"):
        tessel.adamw([p], [g], [m], [v], step=0)
    with raises_arg("tessel::adamw", "'grads'", "equal length"):
        tessel.adamw([p], [g, g], [m], [v])
    with raises_arg("tessel::adamw", "'params'", "list"):
        tessel._tessel.adamw(p, [g], [m], [v])
    tessel.adamw([], [], [], [])  # nothing to do


def test_concat_and_transpose_batched_errors():
    a, b = CudaArray((4, 8)), CudaArray((4, 3))
    with raises_arg("tessel::concat", "'out'", "11"):
        tessel.concat([a, b], CudaArray((4, 12)), axis=1)
    with raises_arg("tessel::concat", "'inputs[1]'", "(5, 3)"):
        tessel.concat([a, CudaArray((5, 3))], CudaArray((4, 11)), axis=1)
    with raises_arg("tessel::concat", "'axis'"):
        tessel.concat([a, b], CudaArray((4, 11)), axis=2)
    with raises_arg("tessel::concat", "'inputs'"):
        tessel.concat([], CudaArray((4, 11)), axis=1)
    with raises_arg("tessel::transpose_batched", "'dst'", "(3, 5, 4)"):
        tessel.transpose_batched(CudaArray((3, 4, 5)), CudaArray((3, 4, 5)))
