"""Fake tensors for the binding tests: no GPU, NumPy or PyTorch needed.

CudaArray exposes ``__cuda_array_interface__`` (v3); DLPackTensor exposes ``__dlpack__`` with a
DLManagedTensor built with ctypes. Both point at made-up addresses: good for every check
tessel makes before it touches memory, and for zero-size tensors.
"""

import ctypes

FAKE_PTR = 0x10000


class CudaArray:
    def __init__(self, shape, typestr="<f4", ptr=FAKE_PTR, strides=None, readonly=False,
                 **extra):
        self.__cuda_array_interface__ = dict(shape=tuple(shape), typestr=typestr,
                                             data=(ptr, readonly), strides=strides, version=3,
                                             **extra)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = b"dltensor"

# DLPack codes: (type code, bits)
DL_F32, DL_F16, DL_BF16 = (2, 32), (2, 16), (4, 16)
DL_F8_E4M3FN, DL_F8_E5M2 = (10, 8), (12, 8)
DL_I32, DL_U8, DL_F64, DL_C64, DL_BOOL = (0, 32), (1, 8), (2, 64), (5, 64), (6, 8)
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3


class DLPackTensor:
    """A tensor exported through DLPack (unversioned capsule, no deleter)."""

    def __init__(self, shape, dtype=DL_F32, device=KDL_CUDA, device_id=0, ptr=FAKE_PTR,
                 strides=None, byte_offset=0, lanes=1):
        self.shape, self.dtype, self.device = tuple(shape), dtype, (device, device_id)
        self.ptr, self.strides, self.byte_offset, self.lanes = ptr, strides, byte_offset, lanes
        self._keep = []  # ctypes memory referenced by the capsules handed out

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, **kwargs):
        n = len(self.shape)
        shape = (ctypes.c_int64 * max(n, 1))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * max(n, 1))(*self.strides)
        mt = _DLManagedTensor()
        t = mt.dl_tensor
        t.data = self.ptr
        t.device = _DLDevice(*self.device)
        t.ndim = n
        t.dtype = _DLDataType(self.dtype[0], self.dtype[1], self.lanes)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = self.byte_offset
        self._keep.append((mt, shape, strides))
        return _capsule_new(ctypes.addressof(mt), _CAPSULE_NAME, None)
