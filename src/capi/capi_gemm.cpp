// C ABI of the GEMM family (include/tessel/tessel_gemm.h).
#include "capi/capi_util.hpp"
#include "tessel/gemm.hpp"
#include "tessel/tessel_gemm.h"

using namespace tessel::capi;

namespace {

tessel_status_t gemm_call(const char* op, bool batched, const tessel_tensor_t* a,
                          const tessel_tensor_t* b, const tessel_tensor_t* d,
                          const tessel_gemm_options_t* o, void* stream) {
  return guarded([&] {
    tessel::Tensor ta = to_tensor(a, op, "a"), tb = to_tensor(b, op, "b"),
                   td = to_tensor(d, op, "d");
    tessel::GemmOptions opt;
    tessel::Tensor tc, tbias;
    if (o != nullptr) {
      opt.alpha = o->alpha;
      opt.beta = o->beta;
      opt.b_layout = static_cast<tessel::BLayout>(o->b_layout);
      opt.a_layout = static_cast<tessel::ALayout>(o->a_layout);
      opt.activation = static_cast<tessel::GemmActivation>(o->activation);
      opt.split_k = o->split_k;
      if (o->c != nullptr) {
        tc = to_tensor(o->c, op, "c");
        opt.c = &tc;
      }
      if (o->bias != nullptr) {
        tbias = to_tensor(o->bias, op, "bias");
        opt.bias = &tbias;
      }
    }
    if (batched)
      tessel::bmm(ta, tb, td, as_stream(stream), opt);
    else
      tessel::gemm(ta, tb, td, as_stream(stream), opt);
  });
}

}  // namespace

extern "C" {

void tessel_gemm_options_init(tessel_gemm_options_t* options) {
  if (options == nullptr) return;
  *options = tessel_gemm_options_t{};
  options->alpha = 1.f;
  options->beta = 0.f;
  options->b_layout = TESSEL_GEMM_B_NK;
  options->activation = TESSEL_GEMM_ACT_NONE;
}

tessel_status_t tessel_gemm(const tessel_tensor_t* a, const tessel_tensor_t* b,
                            const tessel_tensor_t* d, const tessel_gemm_options_t* options,
                            void* stream) {
  return gemm_call("gemm", false, a, b, d, options, stream);
}

tessel_status_t tessel_bmm(const tessel_tensor_t* a, const tessel_tensor_t* b,
                           const tessel_tensor_t* d, const tessel_gemm_options_t* options,
                           void* stream) {
  return gemm_call("bmm", true, a, b, d, options, stream);
}

}  // extern "C"
