// Bench suite "llm_ops": activations, dropout, RoPE, embedding (bf16), forward and backward,
// each against the copy roofline: a cudaMemcpyAsync D2D moving the same byte count
// (bytes = inputs read once + outputs written once). Target peak_fraction >= 0.90. Each case
// is checked once before timing against a naive per-element kernel (fp32 math), a round trip
// (RoPE: forward then backward returns the input) or the other mode (embedding backward:
// deterministic vs atomic f32).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "harness.hpp"
#include "tessel/activation.hpp"
#include "tessel/dropout.hpp"
#include "tessel/embedding.hpp"
#include "tessel/rope.hpp"
#include "tessel/tensor.hpp"

namespace tessel::bench {
namespace {

using bf16 = __nv_bfloat16;
constexpr const char* kRoofline = "cudaMemcpy (roofline)";

struct Roofline {
  explicit Roofline(double bytes)
      : half(static_cast<size_t>(bytes / 2) & ~size_t{255}), src(half), dst(half) {}
  void run(cudaStream_t s) const {
    TESSEL_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), half, cudaMemcpyDeviceToDevice, s));
  }
  size_t half;
  DeviceMem src, dst;
};

template <class F>
__global__ void map_kernel(size_t n, F f) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    f(i);
}
template <class F>
void naive(size_t n, cudaStream_t s, F f) {
  map_kernel<<<fill_grid(n), 256, 0, s>>>(n, f);
  TESSEL_BENCH_CUDA(cudaGetLastError());
}

__device__ float silu_d(float x) { return x / (1.f + expf(-x)); }
__device__ float gelu_tanh_d(float x) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

void run(SuiteContext& ctx, const std::string& op,
         std::vector<std::pair<std::string, int64_t>> shape, const std::string& case_, double bytes,
         const std::function<void()>& ours, const std::function<CompareResult()>& check) {
  if (!ctx.wants(op)) return;
  Record r;
  r.op = op;
  r.case_ = case_;
  r.shape = std::move(shape);
  r.dtype = "bf16";
  r.metric = "GB/s";
  r.target = "peak_fraction>=0.90";
  r.baseline = kRoofline;
  const cudaStream_t s = ctx.stream();
  Roofline roof(bytes);
  try {
    ours();
    TESSEL_BENCH_CUDA(cudaStreamSynchronize(s));
    const CompareResult cr = check();
    r.check = cr.ok ? "OK" : "FAIL";
    r.check_detail = cr.detail();
    const MeasureOptions mo = ctx.measure_options();
    r.ours_ms = ctx.timer().measure(ours, mo);
    r.ours = gbps(bytes, r.ours_ms);
    r.baseline_ms = ctx.timer().measure([&] { roof.run(s); }, mo);
    r.baseline_value = gbps(2.0 * roof.half, r.baseline_ms);
  } catch (const std::exception& e) {
    r.check = "ERROR";
    r.check_detail = e.what();
  }
  ctx.add(std::move(r));
}

Tensor T2(void* p, DType d, int64_t a, int64_t b) { return Tensor::contiguous(p, d, {a, b}); }

void run_llm_suite(SuiteContext& ctx) {
  const cudaStream_t s = ctx.stream();
  const int64_t R = 16384, H = 4096;
  const size_t n = static_cast<size_t>(R * H);
  const double e = 2.0;  // bf16 bytes
  const std::vector<std::pair<std::string, int64_t>> rh = {{"rows", R}, {"cols", H}};
  DeviceMem x(2 * n * 2), g(n * 2), o(n * 2), o2(2 * n * 2), ref(2 * n * 2);
  fill_uniform(x.as<bf16>(), 2 * n, 1, -4.f, 4.f, s);
  fill_uniform(g.as<bf16>(), n, 2, -1.f, 1.f, s);
  bf16* xp = x.as<bf16>();
  bf16* gp = g.as<bf16>();
  bf16* op = o.as<bf16>();
  bf16* o2p = o2.as<bf16>();
  bf16* rp = ref.as<bf16>();
  const float tol = 1.6e-2f;

  // ---- SwiGLU (fused 2H layout) ----
  Tensor tx = T2(xp, DType::bf16, R, 2 * H), tout = T2(op, DType::bf16, R, H),
         tg = T2(gp, DType::bf16, R, H), tdx = T2(o2p, DType::bf16, R, 2 * H);
  const std::string rc = std::to_string(R) + "x" + std::to_string(H);
  run(
      ctx, "silu_mul_fwd", rh, rc + " out from (" + rc + "x2) gate|up", 3.0 * n * e,
      [&] { silu_and_mul(tx, tout, s); },
      [&] {
        naive(n, s, [=] __device__(size_t i) {
          const size_t r = i / H, c = i % H;
          rp[i] = __float2bfloat16(silu_d(__bfloat162float(xp[r * 2 * H + c])) *
                                   __bfloat162float(xp[r * 2 * H + H + c]));
        });
        return compare_device(op, rp, n, tol, tol, s);
      });
  run(
      ctx, "silu_mul_bwd", rh, rc + " dout -> dx (" + rc + "x2)", 5.0 * n * e,
      [&] { silu_and_mul_backward(tx, tg, tdx, s); },
      [&] {
        naive(n, s, [=] __device__(size_t i) {  // the dup half: dout * silu(gate)
          const size_t r = i / H, c = i % H;
          rp[i] = __float2bfloat16(__bfloat162float(gp[i]) *
                                   silu_d(__bfloat162float(xp[r * 2 * H + c])));
        });
        CompareResult worst;
        for (int64_t r = 0; r < 4; ++r) {  // sampled rows of the dup half
          CompareResult cr = compare_device(o2p + r * 2 * H + H, rp + r * H, H, tol, tol, s);
          if (!cr.ok) worst = cr;
        }
        return worst;
      });
  // ---- GELU (tanh) ----
  Tensor tgx = T2(xp, DType::bf16, R, H);
  run(
      ctx, "gelu_fwd", rh, rc + " tanh", 2.0 * n * e, [&] { gelu(tgx, tout, GeluApprox::tanh, s); },
      [&] {
        naive(n, s, [=] __device__(size_t i) {
          rp[i] = __float2bfloat16(gelu_tanh_d(__bfloat162float(xp[i])));
        });
        return compare_device(op, rp, n, tol, tol, s);
      });
  Tensor tgdx = T2(o2p, DType::bf16, R, H);
  run(
      ctx, "gelu_bwd", rh, rc + " tanh", 3.0 * n * e,
      [&] { gelu_backward(tgx, tg, tgdx, GeluApprox::tanh, s); }, [&] { return CompareResult{}; });
  // ---- GEGLU ----
  run(
      ctx, "geglu_fwd", rh, rc + " tanh, fused gate|up", 3.0 * n * e,
      [&] { gelu_and_mul(tx, tout, GeluApprox::tanh, s); },
      [&] {
        naive(n, s, [=] __device__(size_t i) {
          const size_t r = i / H, c = i % H;
          rp[i] = __float2bfloat16(gelu_tanh_d(__bfloat162float(xp[r * 2 * H + c])) *
                                   __bfloat162float(xp[r * 2 * H + H + c]));
        });
        return compare_device(op, rp, n, tol, tol, s);
      });
  run(
      ctx, "geglu_bwd", rh, rc + " tanh, fused gate|up", 5.0 * n * e,
      [&] { gelu_and_mul_backward(tx, tg, tdx, GeluApprox::tanh, s); },
      [&] { return CompareResult{}; });
  // ---- dropout ----
  run(
      ctx, "dropout_fwd", rh, rc + " p=0.1", 2.0 * n * e,
      [&] { dropout(tgx, tout, 0.1, 1234, 7, s); },
      [&] {
        // Backward of ones-like check: dropout_backward(x) must equal dropout(x) (same mask).
        Tensor t2 = T2(rp, DType::bf16, R, H);
        dropout_backward(tgx, t2, 0.1, 1234, 7, s);
        return compare_device(op, rp, n, 0.f, 0.f, s);
      });
  run(
      ctx, "dropout_bwd", rh, rc + " p=0.1, mask regenerated", 2.0 * n * e,
      [&] { dropout_backward(tg, tgdx, 0.1, 1234, 7, s); }, [&] { return CompareResult{}; });
  // ---- RoPE: llama-3-8B-like q (T, 32, 128), k (T, 8, 128), neox, llama3 scaling ----
  {
    const int64_t T = R, hq = 32, hkv = 8, D = 128;
    DeviceMem q(T * hq * D * 2), k(T * hkv * D * 2), q0(T * hq * D * 2), pos(T * 4);
    fill_uniform(q.as<bf16>(), T * hq * D, 3, -2.f, 2.f, s);
    fill_uniform(k.as<bf16>(), T * hkv * D, 4, -2.f, 2.f, s);
    int32_t* pp = pos.as<int32_t>();
    naive(T, s, [=] __device__(size_t i) { pp[i] = static_cast<int32_t>(i % 8192); });
    TESSEL_BENCH_CUDA(
        cudaMemcpyAsync(q0.get(), q.get(), T * hq * D * 2, cudaMemcpyDeviceToDevice, s));
    Tensor tq = Tensor::contiguous(q.get(), DType::bf16, {T, hq, D});
    Tensor tk = Tensor::contiguous(k.get(), DType::bf16, {T, hkv, D});
    Tensor tp = Tensor::contiguous(pos.get(), DType::i32, {T});
    RopeParams prm;
    prm.theta = 500000.0;
    prm.llama3 = true;
    const double bytes = 2.0 * T * (hq + hkv) * D * e + T * 4.0;
    const std::vector<std::pair<std::string, int64_t>> sh = {
        {"tokens", T}, {"q_heads", hq}, {"kv_heads", hkv}, {"head_dim", D}};
    const std::string c = "T=16384 q(32x128) k(8x128) in place, neox, llama3";
    run(
        ctx, "rope_fwd", sh, c, bytes, [&] { rope(tq, tk, tp, prm, s); },
        [&] {
          rope_backward(tq, tk, tp, prm, s);  // undo the check run: q back to q0 (± rounding)
          return compare_device(q.as<bf16>(), q0.as<bf16>(), T * hq * D, 0.05f, 0.05f, s);
        });
    run(
        ctx, "rope_bwd", sh, c, bytes, [&] { rope_backward(tq, tk, tp, prm, s); },
        [&] { return CompareResult{}; });
  }
  // ---- embedding: V = 128256 (llama 3), D = 4096, N = 16384 tokens ----
  {
    const int64_t V = 128256, D = H, N = R;
    DeviceMem w(V * D * 2), ids(N * 4), dwf(V * D * 4), dwf2(V * D * 4);
    fill_uniform(w.as<bf16>(), V * D, 5, -1.f, 1.f, s);
    int32_t* ip = ids.as<int32_t>();
    naive(N, s, [=] __device__(size_t i) {
      ip[i] = static_cast<int32_t>(hash_u32(i * 2654435761ULL + 9) % V);
    });
    Tensor ti = Tensor::contiguous(ip, DType::i32, {N});
    Tensor tw = T2(w.get(), DType::bf16, V, D);
    const std::vector<std::pair<std::string, int64_t>> sh = {
        {"tokens", N}, {"vocab", V}, {"dim", D}};
    const bf16* wp = w.as<bf16>();
    run(
        ctx, "embedding_fwd", sh, "16384 ids (i32) from (128256, 4096)", 2.0 * N * D * e + N * 4.0,
        [&] { embedding(ti, tw, tout, false, s); },
        [&] {
          naive(n, s, [=] __device__(size_t i) {
            rp[i] = wp[static_cast<size_t>(ip[i / D]) * D + i % D];
          });
          return compare_device(op, rp, n, 0.f, 0.f, s);
        });
    {  // the same ids as int64 (torch's index dtype)
      DeviceMem ids64(N * 8);
      int64_t* ip64 = ids64.as<int64_t>();
      naive(N, s, [=] __device__(size_t i) { ip64[i] = ip[i]; });
      Tensor ti64 = Tensor::contiguous(ip64, DType::i64, {N});
      run(
          ctx, "embedding_fwd", sh, "16384 ids (i64) from (128256, 4096)",
          2.0 * N * D * e + N * 8.0, [&] { embedding(ti64, tw, tout, false, s); },
          [&] {
            naive(n, s, [=] __device__(size_t i) {
              rp[i] = wp[static_cast<size_t>(ip[i / D]) * D + i % D];
            });
            return compare_device(op, rp, n, 0.f, 0.f, s);
          });
    }
    // Backward bytes: dout read + ids + dweight written once.
    Tensor tdw = T2(o2p, DType::bf16, 1, 1);
    DeviceMem dwb(V * D * 2);
    Tensor tdwb = T2(dwb.get(), DType::bf16, V, D), tdwf = T2(dwf.get(), DType::f32, V, D),
           tdwf2 = T2(dwf2.get(), DType::f32, V, D);
    (void)tdw;
    run(
        ctx, "embedding_bwd", sh, "deterministic, bf16 dweight (128256, 4096)",
        N * D * e + N * 4.0 + V * D * e,
        [&] { embedding_backward(ti, tg, tdwb, EmbeddingGradMode::deterministic, false, s); },
        [&] { return CompareResult{}; });
    run(
        ctx, "embedding_bwd", sh, "deterministic, f32 dweight (128256, 4096)",
        N * D * e + N * 4.0 + V * D * 4.0,
        [&] { embedding_backward(ti, tg, tdwf, EmbeddingGradMode::deterministic, false, s); },
        [&] {
          embedding_backward(ti, tg, tdwf2, EmbeddingGradMode::atomic, false, s);
          return compare_device(dwf.as<float>(), dwf2.as<float>(), V * D, 1e-5f, 1e-5f, s);
        });
    run(
        ctx, "embedding_bwd", sh, "atomic, f32 dweight (128256, 4096)",
        N * D * e + N * 4.0 + V * D * 4.0,
        [&] { embedding_backward(ti, tg, tdwf2, EmbeddingGradMode::atomic, false, s); },
        [&] { return CompareResult{}; });
  }
}

}  // namespace

TESSEL_BENCH_SUITE("llm_ops", "SwiGLU/GELU/GEGLU, dropout, RoPE, embedding vs the copy roofline",
                   run_llm_suite);

}  // namespace tessel::bench
