"""Error paths of the norm bindings (tessel.rms_norm, layer_norm, group_norm and their
backwards). Needs no GPU, NumPy or PyTorch: fake tensors (fake_tensors.py) at made-up device
addresses, so only checks made before memory is touched run, plus zero-size no-ops.
"""

import re

import pytest

import tessel
from fake_tensors import DL_BF16, DL_F16, DL_I32, CudaArray, DLPackTensor


def raises_arg(*fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(tessel.TesselArgumentError, match=re.compile(pattern, re.S))


def F(shape, typestr="<f4", ptr=0x10000):
    return CudaArray(shape, typestr, ptr=ptr)


def test_functions_exported():
    for name in ["rms_norm", "rms_norm_add", "rms_norm_backward", "layer_norm",
                 "layer_norm_backward", "group_norm", "group_norm_backward"]:
        assert callable(getattr(tessel, name)), name
        assert name in tessel.__all__


def test_rms_norm_dtype_and_shape():
    with raises_arg("tessel::rms_norm", "'x'", "i32"):
        tessel.rms_norm(CudaArray((4, 8), "<i4"), F((8,)), F((4, 8)))
    with raises_arg("tessel::rms_norm", "'w'", "got (9,)"):
        tessel.rms_norm(F((4, 8)), F((9,)), F((4, 8)))
    with raises_arg("tessel::rms_norm", "'w'", "f16"):
        tessel.rms_norm(F((4, 8)), F((8,), "<f2"), F((4, 8)))
    with raises_arg("tessel::rms_norm", "'rstd'", "(4,)", "(5,)"):
        tessel.rms_norm(F((4, 8)), F((8,)), F((4, 8)), F((5,)))
    with raises_arg("tessel::rms_norm", "'y'", "(4, 9)"):
        tessel.rms_norm(F((4, 8)), F((8,)), F((4, 9)))


def test_eps_validated():
    with raises_arg("tessel::rms_norm", "'eps'"):
        tessel.rms_norm(F((4, 8)), F((8,)), F((4, 8)), eps=-1.0)
    with raises_arg("tessel::layer_norm", "'eps'"):
        tessel.layer_norm(F((4, 8)), F((8,)), None, F((4, 8)), eps=float("nan"))


def test_too_long_row_unsupported():
    with pytest.raises(tessel.TesselError, match="262144") as info:
        tessel.rms_norm(F((1, 262145)), F((262145,)), F((1, 262145)))
    assert info.value.code == tessel.Status.UNSUPPORTED


def test_rms_norm_add_and_backward():
    with raises_arg("tessel::rms_norm_add", "'residual'", "(4, 7)"):
        tessel.rms_norm_add(F((4, 8)), F((4, 7)), F((8,)), F((4, 8)), F((4, 8)))
    with raises_arg("tessel::rms_norm_backward", "'rstd'"):
        tessel.rms_norm_backward(F((4, 8)), F((4, 8)), F((8,)), F((4,), "<f2"), F((4, 8)),
                                 F((8,)))
    with raises_arg("tessel::rms_norm_backward", "'dh'"):
        tessel.rms_norm_backward(F((4, 8)), F((4, 8)), F((8,)), F((4,)), F((4, 8)), F((8,)),
                                 dh=F((4, 9)))


def test_layer_norm_errors():
    with raises_arg("tessel::layer_norm", "'b'", "bf16"):
        tessel.layer_norm(F((4, 8)), F((8,)), DLPackTensor((8,), DL_BF16), F((4, 8)))
    with raises_arg("tessel::layer_norm", "'mean'"):
        tessel.layer_norm(F((4, 8)), F((8,)), None, F((4, 8)), mean=F((2, 2)))
    with raises_arg("tessel::layer_norm_backward", "'db'", "got (7,)"):
        tessel.layer_norm_backward(F((4, 8)), F((4, 8)), F((8,)), F((4,)), F((4,)), F((4, 8)),
                                   F((8,)), F((7,)))


def test_group_norm_errors():
    with raises_arg("tessel::group_norm", "'groups'", "C = 6"):
        tessel.group_norm(F((2, 6, 5)), 4, F((6,)), None, F((2, 6, 5)))
    with raises_arg("tessel::group_norm", "'x'"):
        tessel.group_norm(F((6,)), 3, F((6,)), None, F((6,)))
    with raises_arg("tessel::group_norm", "'mean'", "(2, 3)"):
        tessel.group_norm(F((2, 6, 5)), 3, F((6,)), None, F((2, 6, 5)), mean=F((2, 6)))
    with raises_arg("tessel::group_norm_backward", "'dw'"):
        tessel.group_norm_backward(DLPackTensor((2, 6, 5), DL_F16), DLPackTensor((2, 6, 5), DL_F16),
                                   3, DLPackTensor((6,), DL_F16), F((2, 3)), F((2, 3)),
                                   DLPackTensor((2, 6, 5), DL_F16), DLPackTensor((5,), DL_F16))


def test_not_a_tensor_and_wrong_dlpack_dtype():
    with raises_arg("tessel::layer_norm", "'w'", "None"):
        tessel.layer_norm(F((4, 8)), None, None, F((4, 8)))
    with raises_arg("tessel::group_norm", "'x'", "i32"):
        tessel.group_norm(DLPackTensor((2, 4, 3), DL_I32), 2, F((4,)), None, F((2, 4, 3)))


def test_zero_size_is_noop():
    tessel.rms_norm(F((0, 8)), F((8,)), F((0, 8)), F((0,)))
    tessel.layer_norm(F((0, 8)), F((8,)), F((8,)), F((0, 8)), F((0,)), F((0,)))
    tessel.group_norm(F((0, 6, 5)), 3, F((6,)), None, F((0, 6, 5)))
    tessel.rms_norm_backward(F((4, 0)), F((4, 0)), F((0,)), F((4,)), F((4, 0)), F((0,)))


def test_valid_arguments_with_fake_pointer_fail_cleanly():
    with pytest.raises(tessel.TesselError) as info:
        tessel.rms_norm(F((4, 8)), F((8,), ptr=0x20000), F((4, 8), ptr=0x30000))
    assert "tessel::rms_norm" in str(info.value)
    if tessel.cuda_device_count() == 0:
        assert info.value.code == tessel.Status.NO_DEVICE
