// KV-cache append: new K/V (or MLA latent) rows written at positions seqlens[b] - Sq + s of a
// contiguous or paged cache. One thread per 16-byte chunk of a new row; the page is resolved
// through the block table per row. Bytes: the new rows read once and written once.
#include <string>

#include "ops/attention_decode/decode_launch.cuh"
#include "runtime/launch.cuh"

namespace tessel {
namespace {

struct AppendArgs {
  const uint4* src[2];
  uint4* dst[2];
  int64_t s_sb[2], s_ss[2], s_sh[2];  // source strides in 16-byte chunks
  int64_t d_sb[2], d_st[2], d_sh[2];  // cache strides in chunks (paged: page, token-in-page)
  int count;                          // 1 (latent) or 2 (K and V)
  const int32_t* seqlens;
  const int32_t* block_table;
  int64_t bt_stride;
  int page_size, num_pages;
  int64_t capacity;
  int sq, heads, chunks;  // chunks per row
  int64_t total;          // B·Sq·heads·chunks
};

__global__ void append_kernel(const __grid_constant__ AppendArgs a) {
  ::tessel::tile::wait_prior_grid();  // dependent launch: inputs may come from the kernel before
  ::tessel::tile::allow_next_grid();
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < a.total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(idx % a.chunks);
    int64_t r = idx / a.chunks;
    const int h = static_cast<int>(r % a.heads);
    r /= a.heads;
    const int s = static_cast<int>(r % a.sq);
    const int b = static_cast<int>(r / a.sq);
    const int64_t pos = static_cast<int64_t>(a.seqlens[b]) - a.sq + s;
    if (pos < 0 || pos >= a.capacity) continue;
    int64_t blk = b, tok = pos;
    if (a.block_table != nullptr) {
      const int64_t j = pos / a.page_size;
      const int pg = a.block_table[b * a.bt_stride + j];
      if (pg < 0 || pg >= a.num_pages) continue;
      blk = pg;
      tok = pos - j * a.page_size;
    }
    for (int t = 0; t < a.count; ++t)
      a.dst[t][blk * a.d_sb[t] + tok * a.d_st[t] + h * a.d_sh[t] + c] =
          a.src[t][b * a.s_sb[t] + s * a.s_ss[t] + h * a.s_sh[t] + c];
  }
}

// news / caches: (B, Sq, H, D) / cache rank 4, or (B, Sq, D) / cache rank 3 (H = 1).
void run_append(const char* op, const char* const* new_names, const char* const* cache_names,
                const Tensor* const* news, Tensor* const* caches, int count, const Tensor* bt,
                const Tensor& seqlens, bool check_inputs, cudaStream_t stream) {
  detail::OpCheck chk(op);
  const Tensor& n0 = *news[0];
  const Tensor& c0 = *caches[0];
  const int rank = c0.ndim == 3 || n0.ndim == 3 ? 3 : 4;
  for (int t = 0; t < count; ++t) {
    chk.dtype_in(new_names[t], *news[t], {DType::f16, DType::bf16});
    chk.dtype_in(cache_names[t], *caches[t], {DType::f16, DType::bf16});
    chk.same_dtype(new_names[t], *news[t], new_names[0], n0);
    chk.same_dtype(cache_names[t], *caches[t], new_names[0], n0);
  }
  for (int t = 0; t < count; ++t) {
    chk.rank_in(new_names[t], *news[t], rank, rank);
    chk.rank_in(cache_names[t], *caches[t], rank, rank);
  }
  const int64_t B = n0.shape[0], Sq = n0.shape[1], H = rank == 4 ? n0.shape[2] : 1,
                D = n0.shape[rank - 1];
  const bool paged = bt != nullptr;
  for (int t = 1; t < count; ++t) {
    chk.same_shape(new_names[t], *news[t], new_names[0], n0);
    chk.same_shape(cache_names[t], *caches[t], cache_names[0], c0);
  }
  if (c0.shape[rank - 1] != D || (rank == 4 && c0.shape[2] != H) || (!paged && c0.shape[0] != B))
    chk.fail(cache_names[0],
             std::string(paged ? "shape (num_pages, page_size"
                               : "shape (B = " + std::to_string(B) + ", Smax") +
                 (rank == 4 ? ", Hkv = " + std::to_string(H) : std::string()) + ", " +
                 std::to_string(D) + ") (matching the new rows)",
             "shape " + decode::dims(c0));
  if (D % 8 != 0) chk.fail(new_names[0], "a row length that is a multiple of 8", std::to_string(D));
  decode::check_seqlens_table(chk, B, seqlens, bt);
  for (int t = 0; t < count; ++t) {
    decode::check_vector_layout(chk, new_names[t], *news[t]);
    decode::check_vector_layout(chk, cache_names[t], *caches[t]);
  }
  decode::CacheGeometry g;
  g.paged = paged;
  if (paged) {
    g.num_pages = c0.shape[0];
    g.page_size = c0.shape[1];
    g.max_pages = bt->shape[1];
    g.capacity = g.max_pages * g.page_size;
    if (g.page_size < 1) chk.fail(cache_names[0], "page_size >= 1", "shape " + decode::dims(c0));
  } else {
    g.capacity = c0.shape[1];
  }
  if (g.num_pages > (int64_t{1} << 31) - 1 || g.capacity > (int64_t{1} << 30))
    chk.fail(cache_names[0], "fewer than 2^30 tokens per sequence and 2^31 pages",
             "shape " + decode::dims(c0));
  if (B == 0 || Sq == 0 || H == 0 || D == 0) return;
  for (int t = 0; t < count; ++t) {
    chk.device_pointer(new_names[t], *news[t]);
    chk.device_pointer(cache_names[t], *caches[t]);
  }
  chk.device_pointer("seqlens", seqlens);
  if (paged) chk.device_pointer("block_table", *bt);
  if (check_inputs) decode::check_inputs_now(chk, seqlens, bt, g, B, Sq, stream);

  AppendArgs a{};
  a.count = count;
  for (int t = 0; t < count; ++t) {
    const Tensor& n = *news[t];
    const Tensor& c = *caches[t];
    a.src[t] = static_cast<const uint4*>(n.data);
    a.dst[t] = static_cast<uint4*>(c.data);
    a.s_sb[t] = n.strides[0] / 8;
    a.s_ss[t] = n.strides[1] / 8;
    a.s_sh[t] = rank == 4 ? n.strides[2] / 8 : 0;
    a.d_sb[t] = c.strides[0] / 8;
    a.d_st[t] = c.strides[1] / 8;
    a.d_sh[t] = rank == 4 ? c.strides[2] / 8 : 0;
  }
  a.seqlens = static_cast<const int32_t*>(seqlens.data);
  if (paged) {
    a.block_table = static_cast<const int32_t*>(bt->data);
    a.bt_stride = bt->strides[0];
    a.page_size = static_cast<int>(g.page_size);
    a.num_pages = static_cast<int>(g.num_pages);
  }
  a.capacity = g.capacity;
  a.sq = static_cast<int>(Sq);
  a.heads = static_cast<int>(H);
  a.chunks = static_cast<int>(D / 8);
  a.total = B * Sq * H * (D / 8);
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>((a.total + 255) / 256, 1, 65536));
  TESSEL_CUDA_CHECK(detail::launch_dependent(append_kernel, dim3(grid), dim3(256), 0, stream, a));
  detail::check_launch(op);
}

}  // namespace

void append_kv(const Tensor& k_new, const Tensor& v_new, Tensor& k_cache, Tensor& v_cache,
               const Tensor* block_table, const Tensor& seqlens, bool check_inputs,
               cudaStream_t stream) {
  const char* nn[2] = {"k_new", "v_new"};
  const char* cn[2] = {"k_cache", "v_cache"};
  const Tensor* news[2] = {&k_new, &v_new};
  Tensor* caches[2] = {&k_cache, &v_cache};
  detail::OpCheck chk("append_kv");
  for (int t = 0; t < 2; ++t) {
    chk.rank_in(nn[t], *news[t], 4, 4);
    chk.rank_in(cn[t], *caches[t], 4, 4);
  }
  run_append("append_kv", nn, cn, news, caches, 2, block_table, seqlens, check_inputs, stream);
}

void append_latent(const Tensor& c_new, Tensor& latent_cache, const Tensor* block_table,
                   const Tensor& seqlens, bool check_inputs, cudaStream_t stream) {
  const char* nn[1] = {"c_new"};
  const char* cn[1] = {"latent_cache"};
  const Tensor* news[1] = {&c_new};
  Tensor* caches[1] = {&latent_cache};
  detail::OpCheck chk("append_latent");
  chk.rank_in("c_new", c_new, 3, 3);
  chk.rank_in("latent_cache", latent_cache, 3, 3);
  run_append("append_latent", nn, cn, news, caches, 1, block_table, seqlens, check_inputs, stream);
}

}  // namespace tessel
