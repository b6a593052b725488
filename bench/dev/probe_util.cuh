// Shared by the standalone bench/dev probes: CK (return 1 from main on a CUDA error) and
// median_ms (median of 25 runs after 3 warm-ups, CUDA events on the default stream);
// median_ms_after (the same, each timed run after untimed work: an L2 flush, a kernel before it);
// ReadFlush (the bench harness's L2 flush: a read of twice the L2).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e = (x);                                                                  \
    if (e != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

template <class F>
float median_ms(F&& f, cudaEvent_t a, cudaEvent_t b) {
  std::vector<float> t;
  for (int i = 0; i < 3; ++i) f();
  for (int i = 0; i < 25; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median of `runs` timings of timed(i) (CUDA events on the default stream), each run after an
// untimed before(i); the first `warm` runs are not counted.
template <class B, class F>
float median_ms_after(B&& before, F&& timed, cudaEvent_t a, cudaEvent_t b, int runs = 20,
                      int warm = 3) {
  std::vector<float> t;
  for (int i = 0; i < warm + runs; ++i) {
    before(i);
    cudaEventRecord(a);
    timed(i);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= warm) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Reads n 16-byte words (the result only guards against the loads being dropped).
__global__ void read_kernel(const uint4* __restrict__ in, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    acc ^= in[i].x;
  if (acc == 0x12345678u) *sink = acc;
}

// The bench harness's L2 flush: a read of a buffer twice the L2's size, 8 CTAs per SM.
struct ReadFlush {
  uint4* buf = nullptr;
  unsigned* sink = nullptr;
  int64_t words = 0;  // 16-byte words in buf
  int grid = 0;
  cudaError_t init() {
    int l2 = 0, sms = 0;
    if (cudaError_t e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0)) return e;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0)) return e;
    words = 2 * int64_t{l2} / 16;
    grid = 8 * sms;
    if (cudaError_t e = cudaMalloc(&buf, words * 16)) return e;
    if (cudaError_t e = cudaMemset(buf, 5, words * 16)) return e;
    return cudaMalloc(&sink, sizeof(unsigned));
  }
  // Reads the first n words of the buffer (all of it: the flush), on `stream`.
  void run(int64_t n = 0, cudaStream_t stream = 0) const {
    read_kernel<<<grid, 256, 0, stream>>>(buf, n ? n : words, sink);
  }
};
