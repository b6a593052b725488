// Bindings of tessel/loss.hpp, tessel/optim.hpp and tessel/shape_ops.hpp.
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "common.hpp"
#include "tessel/loss.hpp"
#include "tessel/optim.hpp"
#include "tessel/shape_ops.hpp"

namespace tessel::py {
namespace {

using namespace nb::literals;

tessel::Reduction reduction(const char* op, nb::handle r) {
  std::string s;
  if (nb::try_cast(r, s)) {
    if (s == "none") return tessel::Reduction::none;
    if (s == "mean") return tessel::Reduction::mean;
    if (s == "sum") return tessel::Reduction::sum;
  }
  arg_fail(op, "reduction", "one of 'none', 'mean', 'sum'", nb::repr(r).c_str());
}

std::vector<nb::handle> as_list(const char* op, const char* arg, nb::handle obj) {
  std::vector<nb::handle> out;
  if (!nb::isinstance<nb::list>(obj) && !nb::isinstance<nb::tuple>(obj))
    arg_fail(op, arg, "a list or tuple of tensors", obj_type_name(obj));
  for (nb::handle h : obj) out.push_back(h);
  return out;
}

// The converted tensors of one multi-tensor AdamW (the Args keep the Python buffers alive).
class AdamWGroup {
 public:
  AdamWGroup(nb::handle params, nb::handle grads, nb::handle exp_avgs, nb::handle exp_avg_sqs,
             nb::handle masters) {
    const char* op = "adamw";
    auto p = as_list(op, "params", params), g = as_list(op, "grads", grads),
         m1 = as_list(op, "exp_avgs", exp_avgs), m2 = as_list(op, "exp_avg_sqs", exp_avg_sqs);
    std::vector<nb::handle> ms;
    if (!masters.is_none()) ms = as_list(op, "masters", masters);
    const size_t n = p.size();
    if (g.size() != n || m1.size() != n || m2.size() != n || (!ms.empty() && ms.size() != n))
      arg_fail(op, "grads", "lists of equal length " + std::to_string(n),
               "lengths " + std::to_string(g.size()) + ", " + std::to_string(m1.size()) + ", " +
                   std::to_string(m2.size()) + ", " + std::to_string(ms.size()));
    keep_.reserve(5 * n);
    list_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      keep_.push_back(out(op, "params", p[i]));
      list_[i].param = keep_.back().t;
      keep_.push_back(in(op, "grads", g[i]));
      list_[i].grad = keep_.back().t;
      keep_.push_back(out(op, "exp_avgs", m1[i]));
      list_[i].exp_avg = keep_.back().t;
      keep_.push_back(out(op, "exp_avg_sqs", m2[i]));
      list_[i].exp_avg_sq = keep_.back().t;
      if (!ms.empty() && !ms[i].is_none()) {
        keep_.push_back(out(op, "masters", ms[i]));
        list_[i].master = keep_.back().t;
      }
    }
  }
  void step(const tessel::AdamWOptions& o, cudaStream_t s) const {
    nb::gil_scoped_release nogil;
    tessel::adamw(list_.data(), list_.size(), o, s);
  }
  size_t size() const { return list_.size(); }

 private:
  std::vector<Arg> keep_;
  std::vector<tessel::AdamWTensors> list_;
};

tessel::AdamWOptions adamw_options(float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int64_t step, bool bias_correction) {
  tessel::AdamWOptions o;
  o.lr = lr;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  o.step = step;
  o.bias_correction = bias_correction;
  return o;
}

}  // namespace

void bind_loss_optim(nb::module_& m);
const Binder kRegisterLossOptim(&bind_loss_optim);

void bind_loss_optim(nb::module_& m) {
  m.def(
      "cross_entropy",
      [](nb::handle logits, nb::handle targets, nb::handle loss, nb::handle dlogits,
         int64_t ignore_index, float label_smoothing, nb::handle red, float grad_scale,
         nb::handle stream) {
        const char* op = "cross_entropy";
        tessel::CrossEntropyOptions o;
        o.reduction = reduction(op, red);
        o.ignore_index = ignore_index;
        o.label_smoothing = label_smoothing;
        o.grad_scale = grad_scale;
        Arg x = in(op, "logits", logits), t = in(op, "targets", targets), l = out(op, "loss", loss);
        Arg d;
        const bool has_d = !dlogits.is_none();
        if (has_d) d = out(op, "dlogits", dlogits);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::cross_entropy(x.t, t.t, l.t, has_d ? &d.t : nullptr, s, o);
      },
      "logits"_a.none(), "targets"_a.none(), "loss"_a.none(), "dlogits"_a.none() = nb::none(),
      "ignore_index"_a = -100, "label_smoothing"_a = 0.f, "reduction"_a = "mean",
      "grad_scale"_a = 1.f, "stream"_a.none() = 0,
      "Cross-entropy loss (and dlogits, in the same pass) of logits (N, V).");
  m.def(
      "fused_linear_cross_entropy",
      [](nb::handle hidden, nb::handle weight, nb::handle targets, nb::handle loss,
         nb::handle dhidden, nb::handle dweight, int64_t ignore_index, float label_smoothing,
         nb::handle red, int64_t chunk_rows, nb::handle stream) {
        const char* op = "fused_linear_cross_entropy";
        tessel::FusedLinearCrossEntropyOptions o;
        o.ce.reduction = reduction(op, red);
        o.ce.ignore_index = ignore_index;
        o.ce.label_smoothing = label_smoothing;
        o.chunk_rows = chunk_rows;
        Arg h = in(op, "hidden", hidden), w = in(op, "weight", weight),
            t = in(op, "targets", targets), l = out(op, "loss", loss);
        Arg dh, dw;
        const bool has_dh = !dhidden.is_none(), has_dw = !dweight.is_none();
        if (has_dh) dh = out(op, "dhidden", dhidden);
        if (has_dw) dw = out(op, "dweight", dweight);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::fused_linear_cross_entropy(h.t, w.t, t.t, l.t, has_dh ? &dh.t : nullptr,
                                           has_dw ? &dw.t : nullptr, s, o);
      },
      "hidden"_a.none(), "weight"_a.none(), "targets"_a.none(), "loss"_a.none(),
      "dhidden"_a.none() = nb::none(), "dweight"_a.none() = nb::none(), "ignore_index"_a = -100,
      "label_smoothing"_a = 0.f, "reduction"_a = "mean", "chunk_rows"_a = 0, "stream"_a.none() = 0,
      "Chunked fused linear + cross-entropy with gradients.");
  m.def(
      "adamw",
      [](nb::handle params, nb::handle grads, nb::handle exp_avgs, nb::handle exp_avg_sqs,
         nb::handle masters, float lr, float beta1, float beta2, float eps, float weight_decay,
         int64_t step, bool bias_correction, nb::handle stream) {
        const AdamWGroup g(params, grads, exp_avgs, exp_avg_sqs, masters);
        g.step(adamw_options(lr, beta1, beta2, eps, weight_decay, step, bias_correction),
               to_stream("adamw", stream));
      },
      "params"_a, "grads"_a, "exp_avgs"_a, "exp_avg_sqs"_a, "masters"_a.none() = nb::none(),
      "lr"_a = 1e-3f, "beta1"_a = 0.9f, "beta2"_a = 0.999f, "eps"_a = 1e-8f,
      "weight_decay"_a = 1e-2f, "step"_a = 1, "bias_correction"_a = true, "stream"_a.none() = 0,
      "One multi-tensor AdamW step (one launch).");
  // The tensor lists converted once: an optimizer calls step() every iteration without
  // re-reading hundreds of Python tensor objects (the conversion cost ~ the kernel's time).
  nb::class_<AdamWGroup>(m, "AdamWGroup",
                         "Tensor lists of a multi-tensor AdamW, converted once; step() launches.")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, nb::handle>(), "params"_a,
           "grads"_a, "exp_avgs"_a, "exp_avg_sqs"_a, "masters"_a.none() = nb::none())
      .def(
          "step",
          [](const AdamWGroup& g, float lr, float beta1, float beta2, float eps, float weight_decay,
             int64_t step, bool bias_correction, nb::handle stream) {
            g.step(adamw_options(lr, beta1, beta2, eps, weight_decay, step, bias_correction),
                   to_stream("adamw", stream));
          },
          "lr"_a = 1e-3f, "beta1"_a = 0.9f, "beta2"_a = 0.999f, "eps"_a = 1e-8f,
          "weight_decay"_a = 1e-2f, "step"_a = 1, "bias_correction"_a = true, "stream"_a.none() = 0)
      .def("__len__", [](const AdamWGroup& g) { return g.size(); });
  m.def(
      "concat",
      [](nb::handle inputs, nb::handle o, int axis, nb::handle stream) {
        const char* op = "concat";
        auto hs = as_list(op, "inputs", inputs);
        std::vector<Arg> keep;
        std::vector<tessel::Tensor> ts;
        keep.reserve(hs.size());
        for (nb::handle h : hs) {
          keep.push_back(in(op, "inputs", h));
          ts.push_back(keep.back().t);
        }
        Arg to = out(op, "out", o);
        cudaStream_t s = to_stream(op, stream);
        nb::gil_scoped_release nogil;
        tessel::concat(ts.data(), ts.size(), axis, to.t, s);
      },
      "inputs"_a, "out"_a.none(), "axis"_a = 0, "stream"_a.none() = 0, "out = cat(inputs, axis).");
  m.def(
      "transpose_batched",
      [](nb::handle src, nb::handle dst, nb::handle stream) {
        Arg ts = in("transpose_batched", "src", src), td = out("transpose_batched", "dst", dst);
        cudaStream_t s = to_stream("transpose_batched", stream);
        nb::gil_scoped_release nogil;
        tessel::transpose_batched(ts.t, td.t, s);
      },
      "src"_a.none(), "dst"_a.none(), "stream"_a.none() = 0, "dst (B, C, R) = src (B, R, C)^T.");
}

}  // namespace tessel::py
