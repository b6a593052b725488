// Backend by name for the CLI. The GPU backend (tessel kernels) registers here when built:
// compile with TESSEL_LLM_GPU_BACKEND and define make_gpu_backend().
#include <string>

#include "llm/backend.hpp"
#include "tessel/tensor.hpp"

namespace tessel::llm {

#ifdef TESSEL_LLM_GPU_BACKEND
std::unique_ptr<Backend> make_gpu_backend();
#endif

std::unique_ptr<Backend> make_backend(const std::string& kind, int threads) {
  if (kind == "cpu") return make_cpu_backend(threads);
  if (kind == "gpu") {
#ifdef TESSEL_LLM_GPU_BACKEND
    return make_gpu_backend();
#else
    throw Error(TESSEL_ERROR_UNSUPPORTED,
                "tessel::run: 'backend' expected cpu (GPU backend not built yet), got gpu");
#endif
  }
  throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
              "tessel::run: 'backend' expected cpu or gpu, got '" + kind + "'");
}

}  // namespace tessel::llm
