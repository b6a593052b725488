// Bindings of decode attention: decode_attention, append_kv, mla_decode, append_latent.
// Argument order: inputs, outputs, optional tensors, parameters, stream.
#include <optional>

#include "common.hpp"
#include "tessel/decode_attention.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

std::optional<Arg> maybe_in(const char* op, const char* arg, nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return in(op, arg, h);
}
std::optional<Arg> maybe_out(const char* op, const char* arg, nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return out(op, arg, h);
}

}  // namespace

void bind_decode_attention(nb::module_& m);
const Binder kRegisterDecodeAttention(&bind_decode_attention);

void bind_decode_attention(nb::module_& m) {
  m.def(
      "decode_attention",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle seqlens, nb::handle o, nb::handle lse,
         nb::handle block_table, double scale, double softcap, int num_splits, int64_t max_seqlen,
         bool check_inputs, nb::handle stream) {
        const char* op = "decode_attention";
        Arg tq = in(op, "q", q), tk = in(op, "k_cache", k), tv = in(op, "v_cache", v),
            ts = in(op, "seqlens", seqlens), to = out(op, "out", o);
        std::optional<Arg> tl = maybe_out(op, "lse", lse),
                           tb = maybe_in(op, "block_table", block_table);
        cudaStream_t s = to_stream(op, stream);
        tessel::DecodeParams p;
        p.scale = scale;
        p.softcap = softcap;
        p.num_splits = num_splits;
        p.max_seqlen = max_seqlen;
        p.check_inputs = check_inputs;
        p.block_table = tb ? &tb->t : nullptr;
        nb::gil_scoped_release nogil;
        tessel::decode_attention(tq.t, tk.t, tv.t, ts.t, to.t, tl ? &tl->t : nullptr, p, s);
      },
      "q"_a.none(), "k_cache"_a.none(), "v_cache"_a.none(), "seqlens"_a.none(), "out"_a.none(),
      "lse"_a.none() = nb::none(), "block_table"_a.none() = nb::none(), "scale"_a = 0.0,
      "softcap"_a = 0.0, "num_splits"_a = 0, "max_seqlen"_a = 0, "check_inputs"_a = false,
      "stream"_a.none() = 0);
  m.def(
      "append_kv",
      [](nb::handle kn, nb::handle vn, nb::handle kc, nb::handle vc, nb::handle seqlens,
         nb::handle block_table, bool check_inputs, nb::handle stream) {
        const char* op = "append_kv";
        Arg tkn = in(op, "k_new", kn), tvn = in(op, "v_new", vn), tkc = out(op, "k_cache", kc),
            tvc = out(op, "v_cache", vc), ts = in(op, "seqlens", seqlens);
        std::optional<Arg> tb = maybe_in(op, "block_table", block_table);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::append_kv(tkn.t, tvn.t, tkc.t, tvc.t, tb ? &tb->t : nullptr, ts.t, check_inputs, s);
      },
      "k_new"_a.none(), "v_new"_a.none(), "k_cache"_a.none(), "v_cache"_a.none(),
      "seqlens"_a.none(), "block_table"_a.none() = nb::none(), "check_inputs"_a = false,
      "stream"_a.none() = 0);
  m.def(
      "mla_decode",
      [](nb::handle ql, nb::handle qr, nb::handle cache, nb::handle seqlens, nb::handle o,
         nb::handle lse, nb::handle block_table, double scale, int num_splits, int64_t max_seqlen,
         bool check_inputs, nb::handle stream) {
        const char* op = "mla_decode";
        Arg tql = in(op, "q_latent", ql), tqr = in(op, "q_rope", qr),
            tc = in(op, "latent_cache", cache), ts = in(op, "seqlens", seqlens),
            to = out(op, "out", o);
        std::optional<Arg> tl = maybe_out(op, "lse", lse),
                           tb = maybe_in(op, "block_table", block_table);
        cudaStream_t s = to_stream(op, stream);
        tessel::DecodeParams p;
        p.scale = scale;
        p.num_splits = num_splits;
        p.max_seqlen = max_seqlen;
        p.check_inputs = check_inputs;
        p.block_table = tb ? &tb->t : nullptr;
        nb::gil_scoped_release nogil;
        tessel::mla_decode(tql.t, tqr.t, tc.t, ts.t, to.t, tl ? &tl->t : nullptr, p, s);
      },
      "q_latent"_a.none(), "q_rope"_a.none(), "latent_cache"_a.none(), "seqlens"_a.none(),
      "out"_a.none(), "lse"_a.none() = nb::none(), "block_table"_a.none() = nb::none(),
      "scale"_a = 0.0, "num_splits"_a = 0, "max_seqlen"_a = 0, "check_inputs"_a = false,
      "stream"_a.none() = 0);
  m.def(
      "append_latent",
      [](nb::handle cn, nb::handle cache, nb::handle seqlens, nb::handle block_table,
         bool check_inputs, nb::handle stream) {
        const char* op = "append_latent";
        Arg tcn = in(op, "c_new", cn), tc = out(op, "latent_cache", cache),
            ts = in(op, "seqlens", seqlens);
        std::optional<Arg> tb = maybe_in(op, "block_table", block_table);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::append_latent(tcn.t, tc.t, tb ? &tb->t : nullptr, ts.t, check_inputs, s);
      },
      "c_new"_a.none(), "latent_cache"_a.none(), "seqlens"_a.none(),
      "block_table"_a.none() = nb::none(), "check_inputs"_a = false, "stream"_a.none() = 0);
}

}  // namespace tessel::py
