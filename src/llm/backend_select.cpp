// Backend by name for the CLI: the float32 CPU backend or the GPU backend on tessel's kernels
// (gpu_backend.cpp; throws tessel::Error when no CUDA GPU is present).
#include <string>

#include "llm/backend.hpp"
#include "tessel/tensor.hpp"

namespace tessel::llm {

std::unique_ptr<Backend> make_gpu_backend();

std::unique_ptr<Backend> make_backend(const std::string& kind, int threads) {
  if (kind == "cpu") return make_cpu_backend(threads);
  if (kind == "gpu") return make_gpu_backend();
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              "tessel::run: 'backend' expected cpu or gpu, got '" + kind + "'");
}

}  // namespace tessel::llm
