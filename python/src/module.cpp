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

#include "common.hpp"
#include "tessel/launch.hpp"
#include "tessel/ops.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

PyObject* g_error = nullptr;      // TesselError(RuntimeError)
PyObject* g_arg_error = nullptr;  // TesselArgumentError(TesselError, ValueError)

using tessel::py::Arg;
using tessel::py::in;

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
  m.def(
      "set_dependent_launch", [](bool enabled) { return tessel::set_dependent_launch(enabled); },
      "enabled"_a,
      "Programmatic dependent launch for this thread's tessel launches (decode-path kernels may "
      "start while their predecessor drains; the small-M GEMM reads its weight operand before "
      "waiting, so enable it only where that operand is not written by the kernel just before). "
      "Returns the previous setting.");
  m.def("cuda_device_count", &tessel::cuda_device_count,
        "Number of CUDA devices; 0 without a driver or GPU (never raises).");
  m.def("describe", &describe, "x"_a.none(),
        "The tessel view of a tensor argument: dict of dtype, shape, strides (elements), data "
        "(address) and device (index). For debugging and tests.");

  tessel::py::bind_all(m);
}
