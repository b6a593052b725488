// Shared by the standalone bench/dev probes: CK (return 1 from main on a CUDA error) and
// median_ms (median of 25 runs after 3 warm-ups, CUDA events on the default stream).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
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
