// Backend by name for the CLI: the float32 CPU backend, the GPU backend on tessel's kernels
// (gpu_backend.cpp; throws tessel::Error when no CUDA GPU is present), or "auto": the GPU
// backend when device 0 is a Hopper GPU (tessel's kernels are built for sm_90a), else the CPU.
#include <cuda_runtime_api.h>

#include <string>

#include "llm/backend.hpp"
#include "tessel/tensor.hpp"

namespace tessel::llm {

std::unique_ptr<Backend> make_gpu_backend();

bool hopper_gpu_present() {
  int n = 0, major = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1 ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for "auto"
    return false;
  }
  return major == 9;
}

std::unique_ptr<Backend> make_backend(const std::string& kind, int threads) {
  if (kind == "cpu") return make_cpu_backend(threads);
  if (kind == "gpu") return make_gpu_backend();
  if (kind == "auto") return hopper_gpu_present() ? make_gpu_backend() : make_cpu_backend(threads);
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              "tessel::run: 'backend' expected auto, cpu or gpu, got '" + kind + "'");
}

}  // namespace tessel::llm
