// tessel._tessel: nanobind bindings of include/tessel/ops.hpp.
//
// Tensor arguments are any Python object that is a CUDA tensor through DLPack (`__dlpack__`,
// read with nb::ndarray<>: PyTorch, CuPy, JAX, ...) or through `__cuda_array_interface__`
// (Numba, CuPy, ...). Nothing here links PyTorch. Streams are raw cudaStream_t addresses (an
// int), or an object exposing `__cuda_stream__`, `cuda_stream` (torch) or `ptr` (cupy).
// tessel::Error becomes tessel.TesselArgumentError (a ValueError) for invalid arguments and
// tessel.TesselError (a RuntimeError) otherwise, with the C++ message unchanged and the
// tessel_status_t code in the exception's `code` attribute.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "tessel/ops.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

PyObject* g_error = nullptr;      // TesselError(RuntimeError)
PyObject* g_arg_error = nullptr;  // TesselArgumentError(TesselError, ValueError)

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

// A converted argument. `keep` holds the DLPack capsule (and so the producer's tensor)
// alive until the op has returned.
struct Arg {
  tessel::Tensor t;
  nb::ndarray<> keep;
};

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

tessel::UnaryOp unary_op(nb::handle name) {
  std::string s;
  if (nb::try_cast(name, s))
    for (int i = 0; i <= static_cast<int>(tessel::UnaryOp::square); ++i)
      if (s == tessel::unary_op_name(static_cast<tessel::UnaryOp>(i)))
        return static_cast<tessel::UnaryOp>(i);
  arg_fail("unary", "op", "one of identity/neg/abs/exp/relu/sigmoid/silu/square",
           nb::repr(name).c_str());
}

tessel::BinaryOp binary_op(nb::handle name) {
  std::string s;
  if (nb::try_cast(name, s))
    for (int i = 0; i <= static_cast<int>(tessel::BinaryOp::minimum); ++i)
      if (s == tessel::binary_op_name(static_cast<tessel::BinaryOp>(i)))
        return static_cast<tessel::BinaryOp>(i);
  arg_fail("binary", "op", "one of add/sub/mul/div/maximum/minimum", nb::repr(name).c_str());
}

void translate(const tessel::Error& e) {
  PyObject* type = e.code() == TESSEL_ERROR_INVALID_ARGUMENT ? g_arg_error : g_error;
  nb::object exc = nb::steal(PyObject_CallOneArg(type, nb::str(e.what()).ptr()));
  if (!exc.is_valid()) return;  // the Python error from the call is already set
  nb::setattr(exc, "code", nb::int_(static_cast<int>(e.code())));
  PyErr_SetObject(type, exc.ptr());
}

nb::dict describe(nb::handle x) {
  Arg a = in("describe", "x", x);
  nb::list shape, strides;
  for (int d = 0; d < a.t.ndim; ++d) {
    shape.append(a.t.shape[d]);
    strides.append(a.t.strides[d]);
  }
  nb::dict r;
  r["dtype"] = tessel::dtype_name(a.t.dtype);
  r["shape"] = nb::tuple(shape);
  r["strides"] = nb::tuple(strides);
  r["data"] = reinterpret_cast<uintptr_t>(a.t.data);
  r["device"] = a.t.device.index;
  return r;
}

}  // namespace

NB_MODULE(_tessel, m) {
  m.doc() = "tessel GPU kernels (nanobind bindings; see include/tessel/ops.hpp)";

  g_error = PyErr_NewExceptionWithDoc("tessel.TesselError",
                                      "A tessel call failed; `code` is the tessel_status_t.",
                                      PyExc_RuntimeError, nullptr);
  nb::object bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_arg_error = PyErr_NewExceptionWithDoc(
      "tessel.TesselArgumentError",
      "Invalid argument (dtype, shape, stride, alignment, pointer) to a tessel call.", bases.ptr(),
      nullptr);
  if (!g_error || !g_arg_error) throw nb::python_error();
  m.attr("TesselError") = nb::handle(g_error);
  m.attr("TesselArgumentError") = nb::handle(g_arg_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tessel::Error& e) {
      translate(e);
    }
  });

  m.def(
      "version", [] { return std::string(tessel::version()); }, "Library version string.");
  m.def("cuda_device_count", &tessel::cuda_device_count,
        "Number of CUDA devices; 0 without a driver or GPU (never raises).");
  m.def("describe", &describe, "x"_a.none(),
        "The tessel view of a tensor argument: dict of dtype, shape, strides (elements), data "
        "(address) and device (index). For debugging and tests.");

  m.def(
      "unary",
      [](nb::handle op, nb::handle x, nb::handle y, nb::handle stream) {
        const tessel::UnaryOp o = unary_op(op);
        Arg tx = in("unary", "x", x), ty = out("unary", "y", y);
        cudaStream_t s = to_stream("unary", stream);
        nb::gil_scoped_release nogil;
        tessel::unary(o, tx.t, ty.t, s);
      },
      "op"_a.none(), "x"_a.none(), "y"_a.none(), "stream"_a.none() = 0,
      "y = op(x), op one of identity/neg/abs/exp/relu/sigmoid/silu/square.");
  m.def(
      "binary",
      [](nb::handle op, nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        const tessel::BinaryOp bo = binary_op(op);
        Arg ta = in("binary", "a", a), tb = in("binary", "b", b), to = out("binary", "out", o);
        cudaStream_t s = to_stream("binary", stream);
        nb::gil_scoped_release nogil;
        tessel::binary(bo, ta.t, tb.t, to.t, s);
      },
      "op"_a.none(), "a"_a.none(), "b"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out = a op b, op one of add/sub/mul/div/maximum/minimum; b has a's shape, is a row "
      "vector over a's last axis, or has one element.");
  m.def(
      "add",
      [](nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        Arg ta = in("add", "a", a), tb = in("add", "b", b), to = out("add", "out", o);
        cudaStream_t s = to_stream("add", stream);
        nb::gil_scoped_release nogil;
        tessel::add(ta.t, tb.t, to.t, s);
      },
      "a"_a.none(), "b"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out = a + b (b broadcast as in binary).");
  m.def(
      "mul",
      [](nb::handle a, nb::handle b, nb::handle o, nb::handle stream) {
        Arg ta = in("mul", "a", a), tb = in("mul", "b", b), to = out("mul", "out", o);
        cudaStream_t s = to_stream("mul", stream);
        nb::gil_scoped_release nogil;
        tessel::mul(ta.t, tb.t, to.t, s);
      },
      "a"_a.none(), "b"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out = a * b (b broadcast as in binary).");
  m.def(
      "copy",
      [](nb::handle src, nb::handle dst, nb::handle stream) {
        Arg ts = in("copy", "src", src), td = out("copy", "dst", dst);
        cudaStream_t s = to_stream("copy", stream);
        nb::gil_scoped_release nogil;
        tessel::copy(ts.t, td.t, s);
      },
      "src"_a.none(), "dst"_a.none(), "stream"_a.none() = 0,
      "dst = src (bit-exact, any tessel dtype).");
  m.def(
      "transpose",
      [](nb::handle src, nb::handle dst, nb::handle stream) {
        Arg ts = in("transpose", "src", src), td = out("transpose", "dst", dst);
        cudaStream_t s = to_stream("transpose", stream);
        nb::gil_scoped_release nogil;
        tessel::transpose(ts.t, td.t, s);
      },
      "src"_a.none(), "dst"_a.none(), "stream"_a.none() = 0, "dst(C, R) = src(R, C)^T.");
  m.def(
      "reduce_sum",
      [](nb::handle x, nb::handle o, nb::handle stream) {
        Arg tx = in("reduce_sum", "x", x), to = out("reduce_sum", "out", o);
        cudaStream_t s = to_stream("reduce_sum", stream);
        nb::gil_scoped_release nogil;
        tessel::reduce_sum(tx.t, to.t, s);
      },
      "x"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out (one element, f32 or x's dtype) = sum of all of x, fp32 accumulation.");
  m.def(
      "reduce_sum_rows",
      [](nb::handle x, nb::handle o, nb::handle stream) {
        Arg tx = in("reduce_sum_rows", "x", x), to = out("reduce_sum_rows", "out", o);
        cudaStream_t s = to_stream("reduce_sum_rows", stream);
        nb::gil_scoped_release nogil;
        tessel::reduce_sum_rows(tx.t, to.t, s);
      },
      "x"_a.none(), "out"_a.none(), "stream"_a.none() = 0,
      "out (...) = x (..., C) summed over the last axis.");
  m.def(
      "softmax",
      [](nb::handle x, nb::handle y, nb::handle stream) {
        Arg tx = in("softmax", "x", x), ty = out("softmax", "y", y);
        cudaStream_t s = to_stream("softmax", stream);
        nb::gil_scoped_release nogil;
        tessel::softmax(tx.t, ty.t, s);
      },
      "x"_a.none(), "y"_a.none(), "stream"_a.none() = 0, "y = softmax(x) along the last axis.");
  m.def(
      "softmax_backward",
      [](nb::handle y, nb::handle dy, nb::handle dx, nb::handle stream) {
        Arg ty = in("softmax_backward", "y", y), tdy = in("softmax_backward", "dy", dy),
            tdx = out("softmax_backward", "dx", dx);
        cudaStream_t s = to_stream("softmax_backward", stream);
        nb::gil_scoped_release nogil;
        tessel::softmax_backward(ty.t, tdy.t, tdx.t, s);
      },
      "y"_a.none(), "dy"_a.none(), "dx"_a.none(), "stream"_a.none() = 0,
      "dx = y * (dy - sum(dy * y)) along the last axis.");
}
