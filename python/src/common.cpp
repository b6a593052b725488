// tessel._tessel: argument conversion (see common.hpp).
//
// Tensor arguments are any Python object that is a CUDA tensor through DLPack (`__dlpack__`,
// read with nb::ndarray<>: PyTorch, CuPy, JAX, ...) or through `__cuda_array_interface__`
// (Numba, CuPy, ...). Nothing here links PyTorch. Streams are raw cudaStream_t addresses (an
// int), or an object exposing `__cuda_stream__`, `cuda_stream` (torch) or `ptr` (cupy).
// tessel::Error becomes tessel.TesselArgumentError (a ValueError) for invalid arguments and
// tessel.TesselError (a RuntimeError) otherwise, with the C++ message unchanged and the
// tessel_status_t code in the exception's `code` attribute.
#include "common.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/ops.hpp"

namespace tessel::py {

[[noreturn]] void arg_fail(const char* op, const char* arg, const std::string& expected,
                           const std::string& got) {
  throw tessel::Error(TESSEL_ERROR_INVALID_ARGUMENT, std::string("tessel::") + op + ": argument '" +
                                                         arg + "': expected " + expected +
                                                         ", got " + got);
}

std::string obj_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

// ---- DLPack --------------------------------------------------------------------------
// DLDataTypeCode values (dlpack.h); the float8 codes exist since DLPack 1.1.
enum : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
};
// DLDeviceType values accepted as device memory.
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAManaged = 13;

std::string dl_dtype_string(nb::dlpack::dtype dt) {
  std::string s;
  switch (dt.code) {
    case kDLInt: s = "int" + std::to_string(dt.bits); break;
    case kDLUInt: s = "uint" + std::to_string(dt.bits); break;
    case kDLFloat: s = "float" + std::to_string(dt.bits); break;
    case kDLBfloat: s = "bfloat" + std::to_string(dt.bits); break;
    case kDLComplex: s = "complex" + std::to_string(dt.bits); break;
    case kDLBool: s = "bool"; break;
    case kDLFloat8_e4m3fn: s = "float8_e4m3fn"; break;
    case kDLFloat8_e5m2: s = "float8_e5m2"; break;
    default:
      s = "DLPack dtype code " + std::to_string(dt.code) + " bits " + std::to_string(dt.bits);
  }
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

bool dtype_from_dlpack(nb::dlpack::dtype dt, tessel::DType& out) {
  using tessel::DType;
  struct Entry {
    uint8_t code, bits;
    DType dtype;
  };
  static constexpr Entry table[] = {
      {kDLFloat, 32, DType::f32},
      {kDLFloat, 16, DType::f16},
      {kDLBfloat, 16, DType::bf16},
      {kDLFloat8_e4m3fn, 8, DType::f8_e4m3},
      {kDLFloat8_e5m2, 8, DType::f8_e5m2},
      {kDLInt, 32, DType::i32},
      {kDLInt, 64, DType::i64},
      {kDLUInt, 8, DType::u8},
  };
  if (dt.lanes != 1) return false;
  for (const Entry& e : table)
    if (e.code == dt.code && e.bits == dt.bits) {
      out = e.dtype;
      return true;
    }
  return false;
}

const char* dl_device_name(int type) {
  switch (type) {
    case 1: return "kDLCPU";
    case 2: return "kDLCUDA";
    case 3: return "kDLCUDAHost";
    case 4: return "kDLOpenCL";
    case 7: return "kDLVulkan";
    case 8: return "kDLMetal";
    case 10: return "kDLROCM";
    case 11: return "kDLROCMHost";
    case 13: return "kDLCUDAManaged";
    case 14: return "kDLOneAPI";
    default: return "an unknown DLPack device";
  }
}

constexpr const char* kSupported =
    "a dtype tessel supports (f32, f16, bf16, f8_e4m3, f8_e5m2, i32, "
    "i64, u8)";

void from_dlpack(const char* op, const char* arg, Arg& a) {
  const nb::ndarray<>& nd = a.keep;
  const int dev = nd.device_type();
  if (dev != kDLCUDA && dev != kDLCUDAManaged)
    arg_fail(op, arg, "a CUDA tensor",
             std::string(dev == 1 ? "a CPU tensor" : "a non-CUDA tensor") + " (DLPack device " +
                 dl_device_name(dev) + ")");
  if (!dtype_from_dlpack(nd.dtype(), a.t.dtype))
    arg_fail(op, arg, kSupported, dl_dtype_string(nd.dtype()));
  if (nd.ndim() > tessel::kMaxDims)
    arg_fail(op, arg, "at most " + std::to_string(tessel::kMaxDims) + " dimensions",
             std::to_string(nd.ndim()));
  a.t.ndim = static_cast<int>(nd.ndim());
  for (int d = 0; d < a.t.ndim; ++d) {
    a.t.shape[d] = static_cast<int64_t>(nd.shape(d));
    a.t.strides[d] = nd.stride(d);  // elements; nanobind fills them in for compact tensors
  }
  a.t.data = const_cast<void*>(nd.data());  // includes byte_offset
  a.t.device = {tessel::DeviceKind::cuda, nd.device_id()};
}

// ---- __cuda_array_interface__ ----------------------------------------------------------
bool dtype_from_typestr(const std::string& ts, tessel::DType& out) {
  using tessel::DType;
  // Single-byte types have no byte order ('|'); '>' (big endian) is never native here.
  if (ts.size() != 3 || (ts[0] != '<' && ts[0] != '|' && ts[0] != '=')) return false;
  struct Entry {
    const char* kind;
    DType dtype;
  };
  static constexpr Entry table[] = {{"f4", DType::f32},
                                    {"f2", DType::f16},
                                    {"i4", DType::i32},
                                    {"i8", DType::i64},
                                    {"u1", DType::u8}};
  for (const Entry& e : table)
    if (ts.compare(1, 2, e.kind) == 0) {
      out = e.dtype;
      return true;
    }
  return false;
}

void from_cai(const char* op, const char* arg, bool output, nb::handle cai, Arg& a) {
  const std::string what = "a valid __cuda_array_interface__";
  if (!nb::isinstance<nb::dict>(cai))
    arg_fail(op, arg, what + " (a dict)", "an object of type " + obj_type_name(cai));
  nb::dict d = nb::borrow<nb::dict>(cai);
  for (const char* key : {"shape", "typestr", "data"})
    if (!d.contains(key)) arg_fail(op, arg, what, std::string("a dict without '") + key + "'");

  std::string typestr;
  if (!nb::try_cast(d["typestr"], typestr)) arg_fail(op, arg, what, "a non-str 'typestr'");
  if (!dtype_from_typestr(typestr, a.t.dtype))
    arg_fail(op, arg, kSupported + std::string(" (bf16/fp8 need DLPack)"),
             "__cuda_array_interface__ typestr '" + typestr + "'");
  const int64_t itemsize = static_cast<int64_t>(tessel::dtype_size(a.t.dtype));

  nb::object shape = d["shape"];
  if (!nb::isinstance<nb::tuple>(shape) && !nb::isinstance<nb::list>(shape))
    arg_fail(op, arg, what, "a 'shape' of type " + obj_type_name(shape));
  const size_t ndim = nb::len(shape);
  if (ndim > static_cast<size_t>(tessel::kMaxDims))
    arg_fail(op, arg, "at most " + std::to_string(tessel::kMaxDims) + " dimensions",
             std::to_string(ndim));
  a.t.ndim = static_cast<int>(ndim);
  for (size_t i = 0; i < ndim; ++i)
    if (!nb::try_cast(shape[i], a.t.shape[i]))
      arg_fail(op, arg, what, "a non-integer 'shape' entry");

  nb::object strides = d.contains("strides") ? nb::object(d["strides"]) : nb::none();
  if (strides.is_none()) {
    int64_t s = 1;
    for (int i = a.t.ndim - 1; i >= 0; --i) {
      a.t.strides[i] = s;
      s *= a.t.shape[i] > 0 ? a.t.shape[i] : 1;
    }
  } else {
    if (nb::len(strides) != ndim)
      arg_fail(op, arg, what,
               "'strides' of length " + std::to_string(nb::len(strides)) + " for " +
                   std::to_string(ndim) + " dimensions");
    for (size_t i = 0; i < ndim; ++i) {
      int64_t bytes = 0;
      if (!nb::try_cast(strides[i], bytes))
        arg_fail(op, arg, what, "a non-integer 'strides' entry");
      if (bytes % itemsize != 0)
        arg_fail(op, arg,
                 "byte strides that are multiples of the element size (" +
                     std::to_string(itemsize) + ")",
                 "a stride of " + std::to_string(bytes) + " bytes");
      a.t.strides[i] = bytes / itemsize;
    }
  }

  if (d.contains("mask") && !nb::object(d["mask"]).is_none())
    arg_fail(op, arg, "a __cuda_array_interface__ without a mask", "a masked array");

  nb::object data = d["data"];
  if (!nb::isinstance<nb::tuple>(data) || nb::len(data) != 2)
    arg_fail(op, arg, what, "a 'data' entry that is not a (pointer, read_only) tuple");
  uintptr_t ptr = 0;
  bool read_only = false;
  if (!nb::try_cast(data[0], ptr) || !nb::try_cast(data[1], read_only))
    arg_fail(op, arg, what, "a 'data' entry that is not a (pointer, read_only) tuple");
  if (output && read_only) arg_fail(op, arg, "a writable tensor", "a read-only one");
  a.t.data = reinterpret_cast<void*>(ptr);
  // The interface carries no device index; the ops check the pointer's device themselves.
  a.t.device = {tessel::DeviceKind::cuda, 0};
}

// ---- argument conversion -------------------------------------------------------------
Arg to_tensor(const char* op, const char* arg, nb::handle obj, bool output) {
  Arg a;
  if (obj.is_none()) arg_fail(op, arg, "a CUDA tensor", "None");
  // DLPack first (also turns buffer-protocol objects into CPU tensors, rejected below).
  if (nb::try_cast(obj, a.keep, /*convert=*/false)) {
    from_dlpack(op, arg, a);
    return a;
  }
  // __cuda_array_interface__ (a property that raises, e.g. torch's for bf16, is reported).
  nb::object cai = nb::steal(PyObject_GetAttrString(obj.ptr(), "__cuda_array_interface__"));
  if (cai.is_valid()) {
    from_cai(op, arg, output, cai, a);
    return a;
  }
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
    nb::python_error e;
    arg_fail(op, arg, "a CUDA tensor",
             "an object of type " + obj_type_name(obj) + " whose __cuda_array_interface__ raised " +
                 obj_type_name(e.value()) + ": " + nb::str(e.value()).c_str());
  }
  PyErr_Clear();
  arg_fail(op, arg, "a CUDA tensor (an object with __dlpack__ or __cuda_array_interface__)",
           "an object of type " + obj_type_name(obj));
}

Arg in(const char* op, const char* arg, nb::handle obj) { return to_tensor(op, arg, obj, false); }
Arg out(const char* op, const char* arg, nb::handle obj) { return to_tensor(op, arg, obj, true); }

cudaStream_t to_stream(const char* op, nb::handle s) {
  uintptr_t value = 0;
  if (s.is_none()) return nullptr;
  if (nb::try_cast(s, value, /*convert=*/false)) return reinterpret_cast<cudaStream_t>(value);
  nb::object h;
  if (nb::hasattr(s, "__cuda_stream__")) {  // CUDA stream protocol: (version, address)
    nb::object t = s.attr("__cuda_stream__")();
    if (nb::isinstance<nb::tuple>(t) && nb::len(t) == 2) h = t[1];
  } else if (nb::hasattr(s, "cuda_stream")) {  // torch.cuda.Stream
    h = s.attr("cuda_stream");
  } else if (nb::hasattr(s, "ptr")) {  // cupy.cuda.Stream
    h = s.attr("ptr");
  }
  if (h.is_valid() && nb::try_cast(h, value, false)) return reinterpret_cast<cudaStream_t>(value);
  arg_fail(op, "stream", "a cudaStream_t address (int) or a stream object",
           "an object of type " + obj_type_name(s));
}

std::vector<BindFn>& binders() {
  static std::vector<BindFn> fns;
  return fns;
}

Binder::Binder(BindFn fn) { binders().push_back(fn); }

void bind_all(nb::module_& m) {
  for (BindFn fn : binders()) fn(m);
}

}  // namespace tessel::py
