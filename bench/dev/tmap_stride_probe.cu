// Does the driver accept a tiled tensor map whose strides are not monotonic?
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
typedef CUresult (*EncodeFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                             const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                             CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                             CUtensorMapFloatOOBfill);
int main() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
  EncodeFn fn = (EncodeFn)p;
  void* buf;
  cudaMalloc(&buf, 64 << 20);
  // paged cache [pages 512][16 tokens][8 heads][128 dims] bf16
  const int64_t e = 2, D = 128, H = 8, PS = 16, P = 512;
  CUtensorMap m;
  {  // dims (64, tokens, halves, heads, pages)
    cuuint64_t dims[5] = {64, (cuuint64_t)PS, 2, (cuuint64_t)H, (cuuint64_t)P};
    cuuint64_t str[4] = {(cuuint64_t)(H * D * e), 64 * e, (cuuint64_t)(D * e), (cuuint64_t)(PS * H * D * e)};
    cuuint32_t box[5] = {64, 16, 2, 1, 1}, es[5] = {1, 1, 1, 1, 1};
    CUresult r = fn(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, buf, dims, str, box, es,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    printf("non-monotonic 5-d map: %d\n", (int)r);
  }
  return 0;
}
