// cuDNN legacy softmax loaded at run time (dlopen), so tessel never links cuDNN.
// Library search: $TESSEL_CUDNN_LIB, then libcudnn.so.9, then libcudnn.so
// (TESSEL_CUDNN_LIB=none: do not load cuDNN, for testing the roofline fallback).
// Only cuDNN's header types are used here; every function comes from dlsym.
#pragma once

#include <cudnn_ops.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace tessel::bench {

class CudnnSoftmax {
 public:
  CudnnSoftmax() {
    const char* env = std::getenv("TESSEL_CUDNN_LIB");
    if (env && std::string(env) == "none") {
      error_ = "disabled by TESSEL_CUDNN_LIB=none";
      return;
    }
    const char* candidates[] = {env && *env ? env : nullptr, "libcudnn.so.9", "libcudnn.so"};
    for (const char* name : candidates) {
      if (!name) continue;
      lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib_) {
        lib_name_ = name;
        break;
      }
      const char* e = dlerror();
      error_ = std::string("dlopen ") + name + ": " + (e ? e : "failed");
    }
    if (!lib_) return;
    if (!(sym(create_, "cudnnCreate") && sym(destroy_, "cudnnDestroy") &&
          sym(set_stream_, "cudnnSetStream") && sym(create_desc_, "cudnnCreateTensorDescriptor") &&
          sym(destroy_desc_, "cudnnDestroyTensorDescriptor") &&
          sym(set_4d_, "cudnnSetTensor4dDescriptor") && sym(fwd_, "cudnnSoftmaxForward") &&
          sym(bwd_, "cudnnSoftmaxBackward") && sym(error_string_, "cudnnGetErrorString")))
      return;
    if (cudnnStatus_t st = create_(&handle_); st != CUDNN_STATUS_SUCCESS) {
      error_ = "cudnnCreate: " + status_string(st);
      handle_ = nullptr;
      return;
    }
    if (create_desc_(&desc_) != CUDNN_STATUS_SUCCESS) {
      error_ = "cudnnCreateTensorDescriptor failed";
      desc_ = nullptr;
    }
  }
  ~CudnnSoftmax() {
    if (desc_) destroy_desc_(desc_);
    if (handle_) destroy_(handle_);
    // The library stays loaded: unloading cuDNN at exit races with its own teardown.
  }
  CudnnSoftmax(const CudnnSoftmax&) = delete;
  CudnnSoftmax& operator=(const CudnnSoftmax&) = delete;

  bool ok() const { return handle_ && desc_; }
  const std::string& error() const { return error_; }
  const std::string& library() const { return lib_name_; }

  // Softmax over the last axis of a dense (rows, cols) tensor: NCHW with n = rows, c = cols,
  // h = w = 1, CUDNN_SOFTMAX_ACCURATE. With h = w = 1 both modes, CHANNEL (over c per pixel)
  // and INSTANCE (over c*h*w per image), compute the same thing through different kernels.
  // Returns "" or an error.
  std::string forward(cudnnSoftmaxMode_t mode, cudnnDataType_t dt, int rows, int cols,
                      const void* x, void* y, cudaStream_t stream) {
    if (std::string e = prepare(dt, rows, cols, stream); !e.empty()) return e;
    const float alpha = 1.f, beta = 0.f;
    return check(fwd_(handle_, CUDNN_SOFTMAX_ACCURATE, mode, &alpha, desc_, x, &beta, desc_, y),
                 "cudnnSoftmaxForward");
  }
  std::string backward(cudnnSoftmaxMode_t mode, cudnnDataType_t dt, int rows, int cols,
                       const void* y, const void* dy, void* dx, cudaStream_t stream) {
    if (std::string e = prepare(dt, rows, cols, stream); !e.empty()) return e;
    const float alpha = 1.f, beta = 0.f;
    return check(
        bwd_(handle_, CUDNN_SOFTMAX_ACCURATE, mode, &alpha, desc_, y, desc_, dy, &beta, desc_, dx),
        "cudnnSoftmaxBackward");
  }

 private:
  template <class F>
  bool sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib_, name));
    if (!f) error_ = std::string("dlsym ") + name + " not found in " + lib_name_;
    return f != nullptr;
  }
  std::string status_string(cudnnStatus_t st) const {
    const char* s = error_string_ ? error_string_(st) : nullptr;
    return s ? s : ("status " + std::to_string(static_cast<int>(st)));
  }
  std::string check(cudnnStatus_t st, const char* what) const {
    return st == CUDNN_STATUS_SUCCESS ? std::string()
                                      : std::string(what) + ": " + status_string(st);
  }
  std::string prepare(cudnnDataType_t dt, int rows, int cols, cudaStream_t stream) {
    if (!ok()) return error_.empty() ? "cuDNN not available" : error_;
    if (std::string e = check(set_stream_(handle_, stream), "cudnnSetStream"); !e.empty()) return e;
    return check(set_4d_(desc_, CUDNN_TENSOR_NCHW, dt, rows, cols, 1, 1),
                 "cudnnSetTensor4dDescriptor");
  }

  void* lib_ = nullptr;
  std::string lib_name_;
  std::string error_;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t desc_ = nullptr;
  decltype(&cudnnCreate) create_ = nullptr;
  decltype(&cudnnDestroy) destroy_ = nullptr;
  decltype(&cudnnSetStream) set_stream_ = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_desc_ = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_desc_ = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_4d_ = nullptr;
  decltype(&cudnnSoftmaxForward) fwd_ = nullptr;
  decltype(&cudnnSoftmaxBackward) bwd_ = nullptr;
  decltype(&cudnnGetErrorString) error_string_ = nullptr;
};

}  // namespace tessel::bench
