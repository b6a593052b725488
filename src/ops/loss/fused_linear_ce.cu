// Chunked fused linear + cross-entropy: loss(hidden @ weightᵀ, targets) with gradients,
// holding only a (chunk × V) slab of logits at a time.
//
// Per chunk of n rows (n_pad = n rounded up to 8, the GEMM's K granularity):
//   L        = gemm(hidden[r0:r0+n], weight)                  (n, V)   logits, hidden's dtype
//   L        = CE(L) in place                                 loss rows + dlogits (scaled)
//   dhidden[r0:r0+n] = gemm(L, weight, BLayout::kn)            (n, H)   written directly
//   dweight  = gemm(L[0:n_pad]ᵀ, hidden_pad[0:n_pad], a_layout km, kn)
//              + (chunk > 0 ? dweight : 0)                    f32 accumulate, pad rows zero
// The count of non-ignored targets (for mean) is taken once, before the first chunk, so every
// chunk's dlogits carry the final 1/count. Bytes per chunk beyond the GEMMs' operands:
// L written once by the GEMM, read once + written once by CE, read once by each gradient
// GEMM (the dweight GEMM reads L MN-major: no transposed copy, so one slab of logits per chunk
// and, for N = 4096 x V = 128256 bf16, one chunk: dweight is written once, never re-read).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "ops/loss/loss_internal.hpp"
#include "ops/rows.cuh"
#include "runtime/workspace.hpp"
#include "tessel/gemm.hpp"
#include "tessel/loss.hpp"
#include "tessel/ops.hpp"

namespace tessel {
namespace {

using detail::AsyncBuffer;  // stream-ordered scratch (runtime/workspace.hpp)

int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

}  // namespace

void fused_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                Tensor& loss, Tensor* dhidden, Tensor* dweight, cudaStream_t stream,
                                const FusedLinearCrossEntropyOptions& opt) {
  detail::OpCheck chk("fused_linear_cross_entropy");
  chk.dtype_in("hidden", hidden, {DType::bf16, DType::f16});
  chk.dtype_in("weight", weight, {DType::bf16, DType::f16});
  chk.same_dtype("weight", weight, "hidden", hidden);
  if (dhidden != nullptr && dhidden->dtype != DType::f32 && dhidden->dtype != hidden.dtype)
    chk.fail("dhidden", std::string("dtype f32 or ") + dtype_name(hidden.dtype),
             dtype_name(dhidden->dtype));
  if (dweight != nullptr) chk.dtype_in("dweight", *dweight, {DType::f32});
  detail::check_ce_options(chk, opt.ce);
  if (opt.chunk_rows < 0 || opt.chunk_rows % 8 != 0)
    chk.fail("chunk_rows", "0 (auto) or a positive multiple of 8", std::to_string(opt.chunk_rows));
  chk.valid_layout("hidden", hidden);
  chk.valid_layout("weight", weight);
  if (hidden.ndim != 2) chk.fail("hidden", "a 2-D tensor (N, H)", hidden.shape_string());
  if (weight.ndim != 2) chk.fail("weight", "a 2-D tensor (V, H)", weight.shape_string());
  const int64_t n = hidden.shape[0], h = hidden.shape[1], v = weight.shape[0];
  if (weight.shape[1] != h)
    chk.fail("weight", "(V, H) with H = " + std::to_string(h) + " (hidden's last axis)",
             weight.shape_string());
  if (h % 8 != 0) chk.fail("hidden", "H a multiple of 8", "H = " + std::to_string(h));
  if (v % 8 != 0 || v == 0)
    chk.fail("weight", "V a positive multiple of 8", "V = " + std::to_string(v));
  detail::check_ce_targets(chk, targets, n);
  detail::check_ce_loss(chk, loss, hidden.dtype, n, opt.ce.reduction);
  if (dhidden != nullptr) {
    chk.valid_layout("dhidden", *dhidden);
    if (dhidden->ndim != 2 || dhidden->shape[0] != n || dhidden->shape[1] != h)
      chk.fail("dhidden", "shape " + hidden.shape_string(), dhidden->shape_string());
  }
  if (dweight != nullptr) {
    chk.valid_layout("dweight", *dweight);
    if (dweight->ndim != 2 || dweight->shape[0] != v || dweight->shape[1] != h)
      chk.fail("dweight", "shape " + weight.shape_string(), dweight->shape_string());
  }
  chk.contiguous("hidden", hidden);
  chk.contiguous("weight", weight);
  if (dhidden != nullptr) chk.contiguous("dhidden", *dhidden);
  if (dweight != nullptr) chk.contiguous("dweight", *dweight);
  if (n == 0) return;
  chk.device_pointer("hidden", hidden);
  chk.device_pointer("weight", weight);
  chk.device_pointer("targets", targets);
  chk.device_pointer("loss", loss);
  if (dhidden != nullptr) chk.device_pointer("dhidden", *dhidden);
  if (dweight != nullptr) chk.device_pointer("dweight", *dweight);

  const DType dt = hidden.dtype;
  const size_t es = dtype_size(dt);
  // Default chunk: as many rows as keep the logits slab within 1 GiB, at least 1024, in
  // multiples of 128. Each chunk after the first re-reads and re-writes the whole f32 dweight
  // (V x H x 4 bytes, 2.1 GB for Llama-3's 128256 x 4096): fewer chunks, less of that traffic
  // (4096 x 4096 x 128256 bf16 on the H100: 1024-row chunks 521 TFLOP/s).
  const int64_t budget_rows = (int64_t{1} << 30) / std::max<int64_t>(1, v * int64_t(es));
  const int64_t auto_chunk = std::min(round8(n), std::max<int64_t>(1024, budget_rows / 128 * 128));
  const int64_t chunk = opt.chunk_rows > 0 ? opt.chunk_rows : auto_chunk;
  const bool need_grad = dhidden != nullptr || dweight != nullptr;
  const bool mean = opt.ce.reduction == Reduction::mean;

  // Count and per-row losses live across the chunk loop, so they cannot sit in
  // detail::stream_workspace: the GEMMs' split-K completion counters use that same buffer
  // (and may grow it, freeing the old one) between our launches.
  AsyncBuffer scratch((4 + size_t(n)) * sizeof(float), stream);
  float* count = static_cast<float*>(scratch.p);
  float* row_loss = count + 4;

  AsyncBuffer logits(size_t(chunk) * v * es, stream);
  // A zero-padded copy of a ragged chunk's hidden rows (the dweight GEMM's K is n_pad).
  const bool ragged = dweight != nullptr && n % 8 != 0;
  AsyncBuffer hidden_pad(ragged ? size_t(chunk) * h * es : 0, stream);

  if (mean)
    detail::ce_count(targets.data, targets.dtype == DType::i64, n, opt.ce.ignore_index, count,
                     stream);
  const size_t tes = dtype_size(targets.dtype);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const int64_t rows_pad = round8(rows);
    const Tensor hid =
        Tensor::contiguous(static_cast<char*>(hidden.data) + r0 * h * es, dt, {rows, h});
    Tensor lg = Tensor::contiguous(logits.p, dt, {rows, v});
    gemm(hid, weight, lg, stream);

    detail::CeLaunch p;
    p.dtype = dt;
    p.x = logits.p;
    p.dx = need_grad ? logits.p : nullptr;
    p.rows = rows;
    p.cols = v;
    p.x_pitch = v;
    p.dx_pitch = v;
    p.targets = static_cast<const char*>(targets.data) + r0 * tes;
    p.targets_i64 = targets.dtype == DType::i64;
    p.ignore_index = opt.ce.ignore_index;
    p.smoothing = opt.ce.label_smoothing;
    p.grad_scale = opt.ce.grad_scale;
    p.count = mean ? count : nullptr;
    p.row_loss = row_loss + r0;
    detail::ce_launch(p, stream);
    detail::check_launch("fused_linear_cross_entropy");

    if (dhidden != nullptr) {
      const size_t des = dtype_size(dhidden->dtype);
      Tensor dh = Tensor::contiguous(static_cast<char*>(dhidden->data) + r0 * h * des,
                                     dhidden->dtype, {rows, h});
      GemmOptions go;
      go.b_layout = BLayout::kn;
      gemm(lg, weight, dh, stream, go);
    }
    if (dweight != nullptr) {
      const Tensor* hb = &hid;
      Tensor hp;
      if (rows_pad != rows) {  // only the last chunk: zero pad rows of L and of hidden
        TESSEL_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(logits.p) + rows * v * es, 0,
                                          size_t(rows_pad - rows) * v * es, stream));
        TESSEL_CUDA_CHECK(cudaMemsetAsync(hidden_pad.p, 0, size_t(rows_pad) * h * es, stream));
        TESSEL_CUDA_CHECK(cudaMemcpyAsync(hidden_pad.p, hid.data, size_t(rows) * h * es,
                                          cudaMemcpyDeviceToDevice, stream));
        hp = Tensor::contiguous(hidden_pad.p, dt, {rows_pad, h});
        hb = &hp;
      }
      const Tensor lpad = Tensor::contiguous(logits.p, dt, {rows_pad, v});  // Lᵀ read MN-major
      GemmOptions go;
      go.a_layout = ALayout::km;
      go.b_layout = BLayout::kn;
      go.beta = r0 == 0 ? 0.f : 1.f;
      go.c = r0 == 0 ? nullptr : dweight;
      gemm(lpad, *hb, *dweight, stream, go);
    }
  }
  detail::ce_finalize(row_loss, row_loss, count, n, opt.ce.reduction, loss.data, loss.dtype,
                      stream);
  detail::check_launch("fused_linear_cross_entropy");
}

}  // namespace tessel
