// Shared pieces of the tessel Python bindings: turning Python objects into tessel tensors
// and streams. Each op family binds itself in its own bind_<family>.cpp (see module.cpp).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>

#include "tessel/tensor.hpp"

namespace tessel::py {

namespace nb = nanobind;

[[noreturn]] void arg_fail(const char* op, const char* arg, const std::string& expected,
                           const std::string& got);
std::string obj_type_name(nb::handle obj);

// A converted argument. `keep` holds the DLPack capsule (and so the producer's tensor)
// alive until the op has returned.
struct Arg {
  tessel::Tensor t;
  nb::ndarray<> keep;
};

// A CUDA tensor argument (DLPack first, then __cuda_array_interface__); `out` also refuses
// read-only buffers.
Arg in(const char* op, const char* arg, nb::handle obj);
Arg out(const char* op, const char* arg, nb::handle obj);
// None or 0: the legacy default stream; an int address; or a stream object.
cudaStream_t to_stream(const char* op, nb::handle s);

// Each bind_<family>.cpp registers its binder with a namespace-scope
//   static tessel::py::Binder reg(&bind_<family>);
// and module.cpp calls every registered binder when the module loads.
using BindFn = void (*)(nb::module_&);
struct Binder {
  explicit Binder(BindFn fn);
};
void bind_all(nb::module_& m);

}  // namespace tessel::py
