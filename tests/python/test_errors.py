"""Error paths of the Python bindings. Needs no GPU, NumPy or PyTorch (CI runs it as is):
tensors are fakes (fake_tensors.py) pointing at made-up device addresses, so only checks
that happen before memory is touched are exercised, plus zero-size no-ops.

    PYTHONPATH=build/python python3 -m pytest tests/python -q
"""

import array
import re

import pytest

import tessel
from fake_tensors import (DL_BF16, DL_BOOL, DL_C64, DL_F8_E4M3FN, DL_F8_E5M2, DL_F16, DL_F32,
                          DL_F64, DL_I32, DL_U8, KDL_CPU, KDL_CUDA_HOST, CudaArray,
                          DLPackTensor)


def raises_arg(*fragments):
    """pytest.raises(TesselArgumentError) whose message contains every fragment."""
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(tessel.TesselArgumentError, match=re.compile(pattern, re.S))


# ---- module basics --------------------------------------------------------------------
def test_dependent_launch_switch():
    before = tessel.set_dependent_launch(True)
    assert tessel.set_dependent_launch(False) is True
    assert tessel.set_dependent_launch(before) is False


def test_version_and_device_count():
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", tessel.version())
    assert tessel.__version__ == tessel.version()
    n = tessel.cuda_device_count()
    assert isinstance(n, int) and n >= 0


def test_exception_hierarchy():
    assert issubclass(tessel.TesselError, RuntimeError)
    assert issubclass(tessel.TesselArgumentError, tessel.TesselError)
    assert issubclass(tessel.TesselArgumentError, ValueError)


def test_torch_ops_absent_without_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        assert tessel.torch_ops is None
    else:
        pytest.skip("torch is installed")


# ---- errors from the C++ ops (message unchanged) ---------------------------------------
def test_wrong_dtype_names_op_and_argument():
    with raises_arg("tessel::softmax", "'x'", "i32") as info:
        tessel.softmax(CudaArray((4, 8), "<i4"), CudaArray((4, 8)))
    assert info.value.code == tessel.Status.INVALID_ARGUMENT
    assert isinstance(info.value, ValueError)


def test_output_dtype_mismatch():
    with raises_arg("tessel::softmax", "'y'", "f16"):
        tessel.softmax(CudaArray((4, 8)), CudaArray((4, 8), "<f2"))


def test_shape_mismatch():
    with raises_arg("tessel::softmax", "'y'", "(4, 8)", "(4, 9)"):
        tessel.softmax(CudaArray((4, 8)), CudaArray((4, 9)))
    with raises_arg("tessel::softmax_backward", "'dx'"):
        tessel.softmax_backward(CudaArray((2, 3)), CudaArray((2, 3)), CudaArray((3, 2)))
    with raises_arg("'out'"):
        tessel.add(CudaArray((4, 8)), CudaArray((4, 8)), CudaArray((8, 4)))


def test_binary_broadcast_rejected():
    with raises_arg("'b'"):
        tessel.mul(CudaArray((4, 8)), CudaArray((4, 3)), CudaArray((4, 8)))


def test_valid_arguments_with_fake_pointer_fail_cleanly():
    # Without a GPU: NO_DEVICE; with one: the pointer is not device memory. Never a crash.
    with pytest.raises(tessel.TesselError) as info:
        tessel.softmax(CudaArray((4, 8)), CudaArray((4, 8), ptr=0x20000))
    assert "tessel::softmax" in str(info.value)
    if tessel.cuda_device_count() == 0:
        assert info.value.code == tessel.Status.NO_DEVICE
        assert not isinstance(info.value, ValueError)


# ---- errors from the binding's tensor conversion ---------------------------------------
@pytest.mark.parametrize("typestr", ["<c8", "<f8", ">f4", "|b1", "<u2", "garbage"])
def test_unsupported_typestr(typestr):
    with raises_arg("tessel::softmax", "'x'", f"'{typestr}'"):
        tessel.softmax(CudaArray((4, 8), typestr), CudaArray((4, 8)))


@pytest.mark.parametrize("dtype,name", [(DL_C64, "complex64"), (DL_F64, "float64"),
                                        (DL_BOOL, "bool")])
def test_unsupported_dlpack_dtype(dtype, name):
    with raises_arg("tessel::softmax", "'y'", name):
        tessel.softmax(CudaArray((4, 8)), DLPackTensor((4, 8), dtype))


def test_vector_dlpack_dtype_rejected():
    with raises_arg("tessel::copy", "'src'", "float32x4"):
        tessel.copy(DLPackTensor((4,), DL_F32, lanes=4), CudaArray((4,)))


def test_cpu_buffer_rejected():
    with raises_arg("tessel::softmax", "'x'", "CUDA tensor", "CPU"):
        tessel.softmax(array.array("f", [1.0, 2.0]), CudaArray((2,)))


def test_cpu_dlpack_rejected():
    with raises_arg("tessel::add", "'b'", "CUDA tensor", "kDLCPU"):
        tessel.add(CudaArray((4,)), DLPackTensor((4,), device=KDL_CPU), CudaArray((4,)))
    with raises_arg("'out'", "kDLCUDAHost"):
        tessel.add(CudaArray((4,)), CudaArray((4,)), DLPackTensor((4,), device=KDL_CUDA_HOST))


def test_numpy_array_rejected():
    np = pytest.importorskip("numpy")
    with raises_arg("tessel::softmax", "'x'", "CUDA tensor", "CPU"):
        tessel.softmax(np.zeros((4, 8), np.float32), CudaArray((4, 8)))


@pytest.mark.parametrize("obj,what", [(3, "int"), (None, "None"), ("x", "str"),
                                      ([1.0, 2.0], "list")])
def test_not_a_tensor(obj, what):
    with raises_arg("tessel::transpose", "'dst'", what):
        tessel.transpose(CudaArray((2, 3)), obj)


def test_too_many_dimensions():
    with raises_arg("'x'", "at most 8 dimensions", "9"):
        tessel.softmax(CudaArray((1,) * 9), CudaArray((1,)))
    with raises_arg("'x'", "at most 8 dimensions"):
        tessel.softmax(DLPackTensor((1,) * 9), CudaArray((1,)))


def test_readonly_output_rejected():
    with raises_arg("tessel::softmax", "'y'", "writable"):
        tessel.softmax(CudaArray((4, 8), readonly=True), CudaArray((4, 8), readonly=True))


def test_masked_array_rejected():
    with raises_arg("'x'", "mask"):
        tessel.softmax(CudaArray((4, 8), mask=CudaArray((4, 8), "|u1")), CudaArray((4, 8)))


@pytest.mark.parametrize("cai", [
    {"shape": (4,), "typestr": "<f4"},                                    # no data
    {"shape": 4, "typestr": "<f4", "data": (0x10000, False)},            # shape not a tuple
    {"shape": (4,), "typestr": "<f4", "data": 0x10000},                   # data not a tuple
    {"shape": (4,), "typestr": "<f4", "data": (0x10000, False), "strides": (4, 4)},
])
def test_malformed_cuda_array_interface(cai):
    obj = type("Bad", (), {"__cuda_array_interface__": cai})()
    with raises_arg("tessel::softmax", "'x'", "__cuda_array_interface__"):
        tessel.softmax(obj, CudaArray((4,)))


def test_raising_cuda_array_interface():
    class Raises:
        @property
        def __cuda_array_interface__(self):
            raise TypeError("no bf16 here")

    with raises_arg("'x'", "no bf16 here"):
        tessel.softmax(Raises(), CudaArray((4,)))


def test_misaligned_byte_strides():
    with raises_arg("'x'", "multiples of the element size"):
        tessel.softmax(CudaArray((4, 8), strides=(34, 4)), CudaArray((4, 8)))


def test_unknown_op_names():
    with raises_arg("tessel::unary", "'op'", "'tanh'"):
        tessel.unary("tanh", CudaArray((4,)), CudaArray((4,)))
    with raises_arg("tessel::binary", "'op'", "'pow'"):
        tessel.binary("pow", CudaArray((4,)), CudaArray((4,)), CudaArray((4,)))


def test_bad_stream():
    with raises_arg("tessel::softmax", "'stream'"):
        tessel.softmax(CudaArray((0, 8)), CudaArray((0, 8)), stream="default")


# ---- conversion results (tessel.describe) ----------------------------------------------
def test_describe_cuda_array_interface():
    d = tessel.describe(CudaArray((4, 8), "<f2", strides=(64, 2), ptr=0x30000))
    assert d == {"dtype": "f16", "shape": (4, 8), "strides": (32, 1), "data": 0x30000,
                 "device": 0}
    assert tessel.describe(CudaArray((2, 3, 4), "|u1"))["strides"] == (12, 4, 1)
    assert tessel.describe(CudaArray((), "<i8"))["shape"] == ()


@pytest.mark.parametrize("dl,name", [(DL_F32, "f32"), (DL_F16, "f16"), (DL_BF16, "bf16"),
                                     (DL_F8_E4M3FN, "f8_e4m3"), (DL_F8_E5M2, "f8_e5m2"),
                                     (DL_I32, "i32"), (DL_U8, "u8")])
def test_describe_dlpack_dtypes(dl, name):
    assert tessel.describe(DLPackTensor((2, 3), dl))["dtype"] == name


def test_describe_dlpack_layout():
    t = DLPackTensor((4, 8), DL_BF16, strides=(16, 1), byte_offset=64, device_id=1)
    d = tessel.describe(t)
    assert d["shape"] == (4, 8) and d["strides"] == (16, 1)
    assert d["data"] == 0x10000 + 64 and d["device"] == 1
    assert tessel.describe(DLPackTensor((4, 8)))["strides"] == (8, 1)


def test_dlpack_bf16_reaches_the_op():
    with raises_arg("tessel::softmax", "'y'", "bf16", "f32"):
        tessel.softmax(DLPackTensor((4, 8), DL_BF16), CudaArray((4, 8)))


# ---- zero-size tensors are a no-op (no GPU needed) --------------------------------------
def test_zero_size_is_noop():
    e = CudaArray((0, 8), ptr=0)
    assert tessel.softmax(e, e) is None
    assert tessel.softmax_backward(e, e, e) is None
    assert tessel.add(e, e, e) is None
    assert tessel.mul(e, e, e) is None
    assert tessel.unary("relu", e, e) is None
    assert tessel.binary("maximum", e, e, e) is None
    assert tessel.copy(e, e) is None
    empty_bf16 = DLPackTensor((3, 0), DL_BF16, ptr=0)
    assert tessel.softmax(empty_bf16, empty_bf16) is None
    assert tessel.reduce_sum_rows(CudaArray((0, 4)), CudaArray((0,))) is None
    assert tessel.transpose(CudaArray((0, 4)), CudaArray((4, 0))) is None
