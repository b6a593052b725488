// Development probe (not part of the build): M = 1 decode GEMMs on the H200, session 13
// (argument m=16 etc. for other M, session 14: every ring config and the best register config,
// each checked against cuBLAS)
// (bench/results/h200/dev/session13/README.md). Per (N, K) bf16 weight, clean L2 (a read of 2x
// the L2 before each run), median of 15: cuBLAS, tessel::gemm (autotuned), a plain streaming
// read of the weight, and tessel's small-M configs 8, 29 (register kernel) and 32-34 (ring);
// with the argument `variants` also simple CUDA-core GEMV kernels (a warp per row, rows
// interleaved over all warps or in blocks, 4-16 loads in flight per thread).
//   nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
//     bench/dev/small_m_probe.cu -o small_m_probe -Lbuild -ltessel -lcublas
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ops/gemm/gemm_small_m.hpp"
#include "tessel/gemm.hpp"
#include "tessel/tensor.hpp"

#define CK(x)                                                              \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void fma8(float& acc, const uint4& w, const float* xs) {
  const float4 x0 = *reinterpret_cast<const float4*>(xs);
  const float4 x1 = *reinterpret_cast<const float4*>(xs + 4);
  acc = fmaf(__uint_as_float(w.x << 16), x0.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), x0.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), x0.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), x0.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), x1.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), x1.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), x1.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), x1.w, acc);
}

// MODE 0: rows interleaved over all warps; 1: contiguous rows per warp. PIPE: prefetch next chunk.
template <int U, int MODE, int PIPE>
__global__ void gemv_kernel(const uint4* __restrict__ w, const __nv_bfloat16* __restrict__ x,
                            __nv_bfloat16* __restrict__ y, int n, int k) {
  extern __shared__ float xs[];
  for (int i = threadIdx.x; i < k; i += blockDim.x) xs[i] = __bfloat162float(x[i]);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int kw = k >> 3;  // 16-byte words per row
  int r0, r1, rs;
  if (MODE == 0) {
    r0 = gw;
    r1 = n;
    rs = warps;
  } else {
    r0 = int((long long)n * gw / warps);
    r1 = int((long long)n * (gw + 1) / warps);
    rs = 1;
  }
  for (int row = r0; row < r1; row += rs) {
    const uint4* wr = w + (size_t)row * kw;
    float acc = 0.f;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int c = lane + 32 * u;
      v[u] = c < kw ? ldg_stream(wr + c) : make_uint4(0, 0, 0, 0);
    }
    for (int c0 = 0; c0 < kw; c0 += 32 * U) {
      uint4 nv[PIPE ? U : 1];
      if (PIPE) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + 32 * U + lane + 32 * u;
          nv[PIPE ? u : 0] = c < kw ? ldg_stream(wr + c) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int c = c0 + lane + 32 * u;
        if (c < kw) fma8(acc, v[u], xs + 8 * c);
      }
      if (PIPE) {
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = nv[PIPE ? u : 0];
      } else if (c0 + 32 * U < kw) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + 32 * U + lane + 32 * u;
          v[u] = c < kw ? ldg_stream(wr + c) : make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = __float2bfloat16_rn(acc);
  }
}

__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = ldg_stream(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}
__global__ void flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}
__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    // two bf16 in [-1,1): exponent 126 or below
    uint32_t lo = 0x3f00u | (h & 0x807fu), hi = 0x3f00u | ((h >> 16) & 0x807fu);
    p[i] = lo | (hi << 16);
  }
}

static void* flushbuf;
static size_t flushn;
static unsigned* sinkp;
float time_clean(std::function<void()> fn, int iters = 15) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int i = 0; i < iters + 3; ++i) {
    flush_kernel<<<1024, 512>>>((const uint4*)flushbuf, flushn, sinkp);
    cudaEventRecord(e0);
    fn();
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const bool variants = argc > 1 && std::string(argv[1]) == "variants";
  int M = 1;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("m=", 0) == 0) M = std::atoi(argv[i] + 2);
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int l2;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  flushn = size_t(l2) * 2 / 16;
  CK(cudaMalloc(&flushbuf, flushn * 16));
  CK(cudaMalloc(&sinkp, 16));
  CK(cudaMemset(flushbuf, 1, flushn * 16));
  cublasHandle_t h;
  cublasCreate(&h);
  struct S {
    int n, k;
  };
  std::vector<S> shapes = {{28672, 4096}, {4096, 14336}, {6144, 4096}, {4096, 4096}, {128256, 4096},
                           {16384, 2048}, {2048, 8192},  {3072, 2048}, {2048, 2048}};
  size_t maxw = 0;
  for (auto s : shapes) maxw = std::max(maxw, size_t(s.n) * s.k);
  __nv_bfloat16 *w, *x, *y, *yr;
  CK(cudaMalloc(&w, maxw * 2));
  CK(cudaMalloc(&x, 32 * 16384 * 2));
  CK(cudaMalloc(&y, 32 * 128256 * 2));
  CK(cudaMalloc(&yr, 32 * 128256 * 2));
  fill_kernel<<<4096, 256>>>((uint32_t*)w, maxw / 2, 1);
  fill_kernel<<<64, 256>>>((uint32_t*)x, 32 * 16384 / 2, 2);
  CK(cudaDeviceSynchronize());
  printf("sms %d l2 %d M %d\n", sms, l2, M);
  for (auto s : shapes) {
    const double bytes = 2.0 * s.n * s.k;
    auto gbs = [&](float ms) { return bytes / ms / 1e6; };
    float alpha = 1, beta = 0;
    auto cub = [&] {
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, M, s.k, &alpha, w, CUDA_R_16BF, s.k, x,
                   CUDA_R_16BF, s.k, &beta, yr, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    };
    tessel::Tensor ta = tessel::Tensor::contiguous(x, tessel::DType::bf16, {M, s.k});
    tessel::Tensor tb = tessel::Tensor::contiguous(w, tessel::DType::bf16, {s.n, s.k});
    tessel::Tensor td = tessel::Tensor::contiguous(y, tessel::DType::bf16, {M, s.n});
    tessel::GemmOptions opt;
    opt.b_layout = tessel::BLayout::nk;
    auto tes = [&] { tessel::gemm(ta, tb, td, 0, opt); };
    tes();
    cub();
    CK(cudaDeviceSynchronize());
    float tc = time_clean(cub), tt = time_clean(tes);
    float tr =
        time_clean([&] { read_kernel<<<sms * 8, 512>>>((const uint4*)w, bytes / 16, sinkp); });
    printf(
        "%6dx%-6d %7.1f MB  cuBLAS %7.2f us %5.0f GB/s | tessel %7.2f us %5.0f | read %7.2f us "
        "%5.0f\n",
        s.n, s.k, bytes / 1e6, tc * 1e3, gbs(tc), tt * 1e3, gbs(tt), tr * 1e3, gbs(tr));
    if (variants) {
      std::vector<__nv_bfloat16> hy(s.n), hr(s.n);
      auto variant = [&](const char* name, auto kern, int threads, int bps) {
        int occ = 0;
        size_t smem = size_t(s.k) * 4;
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, threads, smem);
        int b = std::min(occ, bps);
        if (b < 1) return;
        auto run = [&] { kern<<<sms * b, threads, smem>>>((const uint4*)w, x, y, s.n, s.k); };
        cudaMemset(y, 0xff, s.n * 2);
        run();
        CK(cudaDeviceSynchronize());
        cudaMemcpy(hy.data(), y, s.n * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(hr.data(), yr, s.n * 2, cudaMemcpyDeviceToHost);
        double maxe = 0;
        for (int i = 0; i < s.n; ++i)
          maxe = std::max(maxe, (double)fabsf(__bfloat162float(hy[i]) - __bfloat162float(hr[i])));
        float t = time_clean(run);
        printf("  %-28s thr %4d x %d/SM: %7.2f us %5.0f GB/s  %.3f x cuBLAS  maxerr %.3g\n", name,
               threads, b, t * 1e3, gbs(t), tc / t, maxe);
      };
      variant("rr U8", gemv_kernel<8, 0, 0>, 256, 8);
      variant("rr U16", gemv_kernel<16, 0, 0>, 256, 8);
      variant("rr U4", gemv_kernel<4, 0, 0>, 256, 8);
      variant("rr U8 pipe", gemv_kernel<8, 0, 1>, 256, 8);
      variant("blk U8", gemv_kernel<8, 1, 0>, 256, 8);
      variant("blk U8 pipe", gemv_kernel<8, 1, 1>, 256, 8);
      continue;
    }
    // Max |ours - cuBLAS| over the M x N outputs (bf16; inputs in [-1, 1), sums of K terms).
    std::vector<__nv_bfloat16> hy(size_t(M) * s.n), hr(size_t(M) * s.n);
    auto max_err = [&] {
      CK(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hr.data(), yr, hr.size() * 2, cudaMemcpyDeviceToHost));
      double e = 0;
      for (size_t i = 0; i < hy.size(); ++i)
        e = std::max(e, (double)fabsf(__bfloat162float(hy[i]) - __bfloat162float(hr[i])));
      return e;
    };
    printf("    tessel::gemm maxerr %.3g\n", max_err());
    float best_reg = 1e30f;
    int best_cfg = -1;
    for (int cfg = 0; cfg < tessel::detail::gemm_small_m_num_configs(); ++cfg) {
      const bool ring = tessel::detail::gemm_small_m_is_ring_config(cfg);
      auto run = [&] { tessel::detail::gemm_small_m_with_config(ta, tb, td, opt, 0, cfg); };
      CK(cudaMemset(y, 0xff, size_t(M) * s.n * 2));
      run();
      CK(cudaDeviceSynchronize());
      const double e = max_err();
      float t = time_clean(run, ring ? 15 : 5);
      if (!ring) {
        if (t < best_reg) best_reg = t, best_cfg = cfg;
        if (e > 0.5) printf("    config %2d: maxerr %.3g\n", cfg, e);
        continue;
      }
      printf("    config %2d: %7.2f us %5.0f GB/s  %.3f x cuBLAS  maxerr %.3g  %s\n", cfg, t * 1e3,
             gbs(t), tc / t, e, tessel::detail::gemm_small_m_config_name(cfg).c_str());
    }
    printf("    best register config %d: %7.2f us (5 runs) %.3f x cuBLAS\n", best_cfg,
           best_reg * 1e3, tc / best_reg);
  }
  return 0;
}
