// Development probe (not part of the build): the attention backward (bf16, B4 H32 S4096 D128 by
// default) under several environment settings, alternated in one process so that the
// process-to-process spread (up to 8 %, docs/attention_backward.md session 36) drops out.
// Each argument is one variant, "NAME=VALUE[,NAME=VALUE...]" (or "-" for none); every round
// times each variant (median of 25 after 3 warm-ups, on a stream of its own, queued and L2-flushed
// as bench/vs_torch.py times) and the end prints, per variant, the median over the rounds.
// Session 37.
//   nvcc -O3 -DNDEBUG -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
//     bench/dev/attention_bwd_ab.cu -o attention_bwd_ab -Lbuild -ltessel
//   TESSEL_AB_CAUSAL=1 TESSEL_AB_D=128 TESSEL_AB_ROUNDS=7 ./attention_bwd_ab - \
//     TESSEL_ATTENTION_BWD_TICKETS=0
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../dev/probe_util.cuh"
#include "tessel/attention.hpp"
#include "tessel/attention_backward.hpp"

using namespace tessel;

__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 40503u;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = __float2bfloat16(lo + (hi - lo) * (x & 0xffffff) / float(0x1000000));
  }
}

static int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : fallback;
}

static void set_variant_env(const std::string& variant, bool set) {
  if (variant == "-") return;
  size_t at = 0;
  while (at < variant.size()) {
    size_t end = variant.find(',', at);
    if (end == std::string::npos) end = variant.size();
    const std::string kv = variant.substr(at, end - at);
    const size_t eq = kv.find('=');
    if (set)
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    else
      unsetenv(kv.substr(0, eq).c_str());
    at = end + 1;
  }
}

int main(int argc, char** argv) {
  const int64_t b = env_int("TESSEL_AB_B", 4), h = env_int("TESSEL_AB_H", 32),
                hkv = env_int("TESSEL_AB_HKV", 32), s = env_int("TESSEL_AB_S", 4096),
                d = env_int("TESSEL_AB_D", 128);
  const int64_t sq = env_int("TESSEL_AB_SQ", static_cast<int>(s));  // query rows (keys: s)
  const bool causal = env_int("TESSEL_AB_CAUSAL", 1) != 0;
  const int rounds = env_int("TESSEL_AB_ROUNDS", 7);
  std::vector<std::string> variants(argv + 1, argv + argc);
  if (variants.empty()) variants.push_back("-");
  const size_t nq = size_t(b * sq * h * d), nk = size_t(b * s * hkv * d);
  void *q, *k, *v, *o, *g, *lse, *dq, *dk, *dv;
  for (auto [p, n] :
       {std::pair{&q, nq}, {&k, nk}, {&v, nk}, {&o, nq}, {&g, nq}, {&dq, nq}, {&dk, nk}, {&dv, nk}})
    CK(cudaMalloc(p, n * 2));
  CK(cudaMalloc(&lse, size_t(b * h * sq) * 4));
  fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q), nq, 1, -2.f, 2.f);
  fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k), nk, 2, -1.f, 1.f);
  fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v), nk, 3, -1.f, 1.f);
  fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(g), nq, 4, -1.f, 1.f);
  // TESSEL_AB_HEADS_MAJOR=1: (B, S, H, D) views of (B, H, S, D) memory, as torch's SDPA tensors
  // reach tessel in bench/vs_torch_attention_bwd.py.
  const bool heads_major = env_int("TESSEL_AB_HEADS_MAJOR", 0) != 0;
  auto t4 = [&](void* p, int64_t rows, int64_t heads) {
    Tensor t = Tensor::contiguous(p, DType::bf16, {b, rows, heads, d});
    if (heads_major) t.strides[1] = d, t.strides[2] = rows * d;
    return t;
  };
  Tensor tq = t4(q, sq, h), tk = t4(k, s, hkv), tv = t4(v, s, hkv), to = t4(o, sq, h),
         tg = t4(g, sq, h);
  Tensor tdq = t4(dq, sq, h), tdk = t4(dk, s, hkv), tdv = t4(dv, s, hkv);
  Tensor tl = Tensor::contiguous(lse, DType::f32, {b, h, sq});
  AttentionBackwardParams p;
  p.causal = causal;
  // A stream of its own, as the bench harness uses (the legacy default stream read ~10 % slower).
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  attention_forward(tq, tk, tv, to, &tl, p, st);
  CK(cudaStreamSynchronize(st));
  // As bench/vs_torch.py and the C++ harness time: every iteration queued before any is waited
  // for (the host's per-call work overlaps the GPU's), an L2 flush (a read of 2x L2) before each.
  ReadFlush flush;
  CK(flush.init());
  constexpr int kIters = 25;
  std::vector<cudaEvent_t> ev(2 * kIters);
  for (auto& event : ev) CK(cudaEventCreate(&event));
  auto median_on_stream = [&](auto&& f) {
    for (int i = 0; i < 3; ++i) f();
    for (int i = 0; i < kIters; ++i) {
      flush.run(0, st);
      cudaEventRecord(ev[2 * i], st);
      f();
      cudaEventRecord(ev[2 * i + 1], st);
    }
    cudaStreamSynchronize(st);
    std::vector<float> t;
    for (int i = 0; i < kIters; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double flops = 2.5 * 4.0 * b * h * sq * s * d * (causal ? 0.5 : 1.0);
  std::vector<std::vector<float>> ms(variants.size());
  for (int r = 0; r < rounds; ++r) {
    std::printf("round %d:", r);
    for (size_t i = 0; i < variants.size(); ++i) {
      set_variant_env(variants[i], true);
      const float t = median_on_stream(
          [&] { attention_backward(tq, tk, tv, to, tg, tl, tdq, tdk, tdv, p, st); });
      set_variant_env(variants[i], false);
      CK(cudaGetLastError());
      ms[i].push_back(t);
      std::printf("  %.1f", flops / (t * 1e-3) / 1e12);
    }
    std::printf("  TFLOP/s\n");
  }
  std::printf("B%lld H%lld/%lld Sq%lld Skv%lld D%lld %s, median over %d rounds:\n", (long long)b,
              (long long)h, (long long)hkv, (long long)sq, (long long)s, (long long)d,
              causal ? "causal" : "non-causal", rounds);
  for (size_t i = 0; i < variants.size(); ++i) {
    std::vector<float> t = ms[i];
    std::sort(t.begin(), t.end());
    const float med = t[t.size() / 2];
    std::printf("  %-50s %.3f ms  %.1f TFLOP/s\n", variants[i].c_str(), med,
                flops / (med * 1e-3) / 1e12);
  }
  return 0;
}
