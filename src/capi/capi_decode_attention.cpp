// C ABI of decode attention (include/tessel/tessel_decode_attention.h).
#include <optional>

#include "capi/capi_util.hpp"
#include "tessel/decode_attention.hpp"
#include "tessel/tessel_decode_attention.h"

using tessel::capi::as_stream;
using tessel::capi::guarded;
using tessel::capi::to_tensor;

namespace {

tessel::DecodeParams params_of(const tessel_decode_params_t* p) {
  tessel::DecodeParams r;
  if (p != nullptr) {
    r.scale = p->scale;
    r.softcap = p->softcap;
    r.num_splits = p->num_splits;
    r.check_inputs = p->check_inputs != 0;
    r.max_seqlen = p->max_seqlen;
  }
  return r;
}

}  // namespace

extern "C" {

tessel_status_t tessel_decode_attention(const tessel_tensor_t* q, const tessel_tensor_t* k_cache,
                                        const tessel_tensor_t* v_cache,
                                        const tessel_tensor_t* block_table,
                                        const tessel_tensor_t* seqlens, const tessel_tensor_t* out,
                                        const tessel_tensor_t* lse,
                                        const tessel_decode_params_t* params, void* stream) {
  return guarded([&] {
    const char* op = "decode_attention";
    tessel::DecodeParams p = params_of(params);
    std::optional<tessel::Tensor> bt, l;
    if (block_table) bt = to_tensor(block_table, op, "block_table");
    if (lse) l = to_tensor(lse, op, "lse");
    p.block_table = bt ? &*bt : nullptr;
    tessel::Tensor o = to_tensor(out, op, "out");
    tessel::decode_attention(to_tensor(q, op, "q"), to_tensor(k_cache, op, "k_cache"),
                             to_tensor(v_cache, op, "v_cache"), to_tensor(seqlens, op, "seqlens"),
                             o, l ? &*l : nullptr, p, as_stream(stream));
  });
}

tessel_status_t tessel_append_kv(const tessel_tensor_t* k_new, const tessel_tensor_t* v_new,
                                 const tessel_tensor_t* k_cache, const tessel_tensor_t* v_cache,
                                 const tessel_tensor_t* block_table, const tessel_tensor_t* seqlens,
                                 int32_t check_inputs, void* stream) {
  return guarded([&] {
    const char* op = "append_kv";
    std::optional<tessel::Tensor> bt;
    if (block_table) bt = to_tensor(block_table, op, "block_table");
    tessel::Tensor kc = to_tensor(k_cache, op, "k_cache"), vc = to_tensor(v_cache, op, "v_cache");
    tessel::append_kv(to_tensor(k_new, op, "k_new"), to_tensor(v_new, op, "v_new"), kc, vc,
                      bt ? &*bt : nullptr, to_tensor(seqlens, op, "seqlens"), check_inputs != 0,
                      as_stream(stream));
  });
}

tessel_status_t tessel_mla_decode(const tessel_tensor_t* q_latent, const tessel_tensor_t* q_rope,
                                  const tessel_tensor_t* latent_cache,
                                  const tessel_tensor_t* block_table,
                                  const tessel_tensor_t* seqlens, const tessel_tensor_t* out,
                                  const tessel_tensor_t* lse, const tessel_decode_params_t* params,
                                  void* stream) {
  return guarded([&] {
    const char* op = "mla_decode";
    tessel::DecodeParams p = params_of(params);
    std::optional<tessel::Tensor> bt, l;
    if (block_table) bt = to_tensor(block_table, op, "block_table");
    if (lse) l = to_tensor(lse, op, "lse");
    p.block_table = bt ? &*bt : nullptr;
    tessel::Tensor o = to_tensor(out, op, "out");
    tessel::mla_decode(to_tensor(q_latent, op, "q_latent"), to_tensor(q_rope, op, "q_rope"),
                       to_tensor(latent_cache, op, "latent_cache"),
                       to_tensor(seqlens, op, "seqlens"), o, l ? &*l : nullptr, p,
                       as_stream(stream));
  });
}

tessel_status_t tessel_append_latent(const tessel_tensor_t* c_new,
                                     const tessel_tensor_t* latent_cache,
                                     const tessel_tensor_t* block_table,
                                     const tessel_tensor_t* seqlens, int32_t check_inputs,
                                     void* stream) {
  return guarded([&] {
    const char* op = "append_latent";
    std::optional<tessel::Tensor> bt;
    if (block_table) bt = to_tensor(block_table, op, "block_table");
    tessel::Tensor c = to_tensor(latent_cache, op, "latent_cache");
    tessel::append_latent(to_tensor(c_new, op, "c_new"), c, bt ? &*bt : nullptr,
                          to_tensor(seqlens, op, "seqlens"), check_inputs != 0, as_stream(stream));
  });
}

}  // extern "C"
