// Development probe (not part of the build): MLA decode with H <= 16 at several batch sizes and
// cache lengths, mla_swap_kernel against decode_kernel (detail::set_mla_swap) in one process,
// session 29. Paged cache (pages of 64, shuffled), bf16, median of 25 after 3 warm-ups; the
// cache of every case is larger than L2 only at the long lengths, so short cases also show the
// launch-bound regime of engine decode (few tiles per split).
//   nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
//     bench/dev/mla_batch_probe.cu -o mla_batch_probe -Lbuild -ltessel
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "../dev/probe_util.cuh"
#include "ops/attention_decode/mla_config.hpp"
#include "tessel/decode_attention.hpp"

using namespace tessel;

int main() {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::mt19937 gen(7);
  std::printf(
      "B H Skv | decode_kernel us | swap us | speedup | swap GB/s | host us per call (enqueue "
      "only, mean of 200; decode_kernel / swap)\n");
  for (int H : {16, 8})
    for (int B : {1, 4, 16, 64})
      for (int S : {1024, 8192, 32768}) {
        if (int64_t{B} * S > 64 * 8192) continue;
        const int ps = 64, pages_per = S / ps, np = B * pages_per;
        std::vector<int32_t> table(static_cast<size_t>(np));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), gen);
        std::vector<int32_t> lens(static_cast<size_t>(B), S);
        void *cache, *ql, *qr, *out, *bt, *sl;
        const size_t cache_bytes = size_t(np) * ps * 576 * 2;
        CK(cudaMalloc(&cache, cache_bytes));
        CK(cudaMemset(cache, 0x3c, cache_bytes));  // ~1.1 in bf16 pairs: finite
        CK(cudaMalloc(&ql, size_t(B) * H * 512 * 2));
        CK(cudaMemset(ql, 0x3c, size_t(B) * H * 512 * 2));
        CK(cudaMalloc(&qr, size_t(B) * H * 64 * 2));
        CK(cudaMemset(qr, 0x3c, size_t(B) * H * 64 * 2));
        CK(cudaMalloc(&out, size_t(B) * H * 512 * 2));
        CK(cudaMalloc(&bt, table.size() * 4));
        CK(cudaMemcpy(bt, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&sl, size_t(B) * 4));
        CK(cudaMemcpy(sl, lens.data(), size_t(B) * 4, cudaMemcpyHostToDevice));
        Tensor tql = Tensor::contiguous(ql, DType::bf16, {B, 1, H, 512});
        Tensor tqr = Tensor::contiguous(qr, DType::bf16, {B, 1, H, 64});
        Tensor tc = Tensor::contiguous(cache, DType::bf16, {np, ps, 576});
        Tensor to = Tensor::contiguous(out, DType::bf16, {B, 1, H, 512});
        Tensor tb = Tensor::contiguous(bt, DType::i32, {B, pages_per});
        Tensor ts = Tensor::contiguous(sl, DType::i32, {B});
        DecodeParams p;
        p.block_table = &tb;
        float ms[2];
        double host_us[2];
        for (int sw = 0; sw < 2; ++sw) {
          detail::set_mla_swap(sw == 1 ? 2 : 0);  // each kernel forced
          ms[sw] =
              median_ms([&] { mla_decode(tql, tqr, tc, ts, to, nullptr, p, nullptr); }, e0, e1);
          CK(cudaDeviceSynchronize());
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < 200; ++i) mla_decode(tql, tqr, tc, ts, to, nullptr, p, nullptr);
          const auto t1 = std::chrono::steady_clock::now();
          host_us[sw] = std::chrono::duration<double, std::micro>(t1 - t0).count() / 200;
          CK(cudaDeviceSynchronize());
        }
        CK(cudaGetLastError());
        std::printf("%d %d %d | %.2f | %.2f | %.3f | %.0f | %.1f / %.1f\n", B, H, S, ms[0] * 1e3,
                    ms[1] * 1e3, ms[0] / ms[1], cache_bytes / (ms[1] * 1e-3) / 1e9, host_us[0],
                    host_us[1]);
        for (void* q : {cache, ql, qr, out, bt, sl}) CK(cudaFree(q));
      }
  return 0;
}
