// Shape ops (bit-exact, any dtype): concat along any axis, batched transpose.
//
// concat: out viewed as (outer, W) bytes with W = Σ_i size_i·inner·elem; input i is an
// (outer, w_i) byte matrix landing at column offset o_i. One launch: up to kCatOutMax inputs,
// blocks own tiles of the output (concat_out_kernel); up to kMaxInputs, a table in the kernel
// parameters, blocks own tiles of one input (binary search over first tiles). Access unit = the
// largest of 16/8/4/2/1 bytes dividing every width, offset and base address (16 for the usual LLM
// shapes): every byte read once and written once.
//
// transpose_batched: (B, R, C) -> (B, C, R). 16-byte aligned rows of 2-, 4- and 8-byte types take
// the vectorized swizzled tile kernel of the 2-D transpose (transpose_tile.cuh) over batches x
// tiles (a 64×64 tile of 2-byte loads per block measured 0.68 of copy bandwidth at (32, 4096, 1024)
// bf16); anything else goes through a 64×64 shared-memory tile per block, batch on grid.z. 16-bit
// and wider types move as such (bit-exact).
#include <cstdlib>
#include <string>

#include "ops/copy/transpose_tile.cuh"
#include "ops/rows.cuh"
#include "tessel/shape_ops.hpp"

namespace tessel {
namespace {

// ---- concat ------------------------------------------------------------------------------
constexpr int kMaxInputs = 256;
constexpr int kCatThreads = 256;
constexpr int kCatUnits = 4;  // units per thread per tile

struct CatEntry {
  const void* src;
  int64_t width;   // units per row of this input
  int64_t offset;  // units from the start of an out row
  int64_t first_tile;
};

struct CatTable {
  CatEntry e[kMaxInputs];
  int count;
  int64_t out_width;  // units per out row
  int64_t outer;
  void* out;
};

template <class U>
__global__ void __launch_bounds__(kCatThreads) concat_kernel(const __grid_constant__ CatTable tab) {
  constexpr int64_t kTile = int64_t{kCatThreads} * kCatUnits;
  const int64_t tile = blockIdx.x;
  int lo = 0, hi = tab.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tab.e[mid].first_tile <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  const CatEntry& e = tab.e[lo];
  const int64_t total = e.width * tab.outer;
  const int64_t k0 = (tile - e.first_tile) * kTile;
  const U* src = static_cast<const U*>(e.src);
  U* out = static_cast<U*>(tab.out);
  U v[kCatUnits];
#pragma unroll
  for (int j = 0; j < kCatUnits; ++j) {
    const int64_t k = k0 + int64_t{j} * kCatThreads + threadIdx.x;
    if (k < total) v[j] = src[k];
  }
#pragma unroll
  for (int j = 0; j < kCatUnits; ++j) {
    const int64_t k = k0 + int64_t{j} * kCatThreads + threadIdx.x;
    if (k < total) {
      const int64_t r = k / e.width, c = k - r * e.width;
      out[r * tab.out_width + e.offset + c] = v[j];
    }
  }
}

// Output order, the default for up to kCatOutMax inputs: blocks own tiles of the output, so the
// stores form one contiguous stream, and each unit's input is found from its column (a scan
// over the inputs' offsets). H200, (8192,4096)|(8192,1024)|(8192,1024) bf16, three alternating
// rounds: 0.954 / 0.941 / 0.951 of copy against 0.917 / 0.915 / 0.924 for the input-ordered
// tiles (concat_kernel; kept for more inputs, and as TESSEL_CONCAT_ORDER=in for A/B runs).
// On the H100 an output-ordered kernel had measured the same as the input-ordered one
// (docs/loss_optim.md, session 10).
constexpr int kCatOutMax = 8;
struct CatOutTable {
  const void* src[kCatOutMax];
  int64_t width[kCatOutMax];   // units per row of input i
  int64_t offset[kCatOutMax];  // its first unit in an out row
  int count;
  int64_t out_width;  // units per out row
  int64_t total;      // units of out
  void* out;
};

template <class U, class I, int UNITS>
__global__ void __launch_bounds__(kCatThreads)
    concat_out_kernel(const __grid_constant__ CatOutTable t) {
  const I k0 = static_cast<I>(blockIdx.x) * (kCatThreads * UNITS) + threadIdx.x;
  const I total = static_cast<I>(t.total), out_width = static_cast<I>(t.out_width);
  U v[UNITS];
#pragma unroll
  for (int j = 0; j < UNITS; ++j) {
    const I k = k0 + static_cast<I>(j * kCatThreads);
    if (k < total) {
      const I r = k / out_width, c = k - r * out_width;
      int i = 0;
#pragma unroll
      for (int e = 1; e < kCatOutMax; ++e)
        if (e < t.count && c >= static_cast<I>(t.offset[e])) i = e;
      const U* src = static_cast<const U*>(t.src[i]);
      v[j] = src[r * static_cast<I>(t.width[i]) + (c - static_cast<I>(t.offset[i]))];
    }
  }
  U* out = static_cast<U*>(t.out);
#pragma unroll
  for (int j = 0; j < UNITS; ++j) {
    const I k = k0 + static_cast<I>(j * kCatThreads);
    if (k < total) out[k] = v[j];
  }
}

// Units per thread of concat_out_kernel. H200, (8192,4096)|(8192,1024)|(8192,1024) bf16
// (session 33, an A/B knob since removed): 2 units 0.947-0.966 of copy in five rounds against
// 0.943-0.954 with 4 and 0.942-0.951 with 1; in vs_torch 0.977 / 0.978 of torch.compile
// against 0.966 / 0.970 with 4.
constexpr int kCatOutUnits = 2;

inline bool concat_out_order() {
  static const bool on = [] {
    const char* e = std::getenv("TESSEL_CONCAT_ORDER");
    return e == nullptr || std::string(e) != "in";
  }();
  return on;
}

// ---- batched transpose ---------------------------------------------------------------------
constexpr int kTDim = 64;
constexpr int kTRows = 4;  // threads in y; each covers kTDim / kTRows rows

template <class U>
__global__ void __launch_bounds__(kTDim* kTRows)
    transpose_batched_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t rows,
                             int64_t cols) {
  __shared__ U tile[kTDim][kTDim + 1];
  const int64_t b = blockIdx.z;
  const U* s = src + b * rows * cols;
  U* d = dst + b * rows * cols;
  const int64_t r0 = int64_t{blockIdx.y} * kTDim, c0 = int64_t{blockIdx.x} * kTDim;
  const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int k = 0; k < kTDim / kTRows; ++k) {
    const int r = ty + k * kTRows;
    if (r0 + r < rows && c0 + tx < cols) tile[r][tx] = s[(r0 + r) * cols + c0 + tx];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kTDim / kTRows; ++k) {
    const int c = ty + k * kTRows;  // dst row = src col
    if (c0 + c < cols && r0 + tx < rows) d[(c0 + c) * rows + r0 + tx] = tile[tx][c];
  }
}

}  // namespace

void concat(const Tensor* inputs, size_t count, int axis, Tensor& out, cudaStream_t stream) {
  detail::OpCheck chk("concat");
  if (count == 0) chk.fail("inputs", "at least one tensor", "0 tensors");
  if (inputs == nullptr) chk.fail("inputs", "an array of tensors", "NULL");
  auto name = [](size_t i) { return "inputs[" + std::to_string(i) + "]"; };
  for (size_t i = 0; i < count; ++i) chk.same_dtype(name(i).c_str(), inputs[i], "out", out);
  chk.valid_layout("out", out);
  if (out.ndim < 1) chk.fail("out", "a tensor of rank >= 1", "rank 0");
  if (axis < -out.ndim || axis >= out.ndim)
    chk.fail("axis",
             "an axis in [" + std::to_string(-out.ndim) + ", " + std::to_string(out.ndim) + ")",
             std::to_string(axis));
  const int ax = axis < 0 ? axis + out.ndim : axis;
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    const Tensor& t = inputs[i];
    chk.valid_layout(name(i).c_str(), t);
    bool ok = t.ndim == out.ndim;
    for (int d = 0; ok && d < out.ndim; ++d)
      if (d != ax && t.shape[d] != out.shape[d]) ok = false;
    if (!ok) {
      Tensor want = out;
      want.shape[ax] = t.ndim == out.ndim ? t.shape[ax] : 0;
      chk.fail(
          name(i).c_str(),
          "shape " + want.shape_string() + " (out's shape except axis " + std::to_string(ax) + ")",
          t.shape_string());
    }
    total += t.shape[ax];
  }
  if (total != out.shape[ax])
    chk.fail("out",
             "size " + std::to_string(total) + " along axis " + std::to_string(ax) +
                 " (the inputs' sum)",
             out.shape_string());
  for (size_t i = 0; i < count; ++i) chk.contiguous(name(i).c_str(), inputs[i]);
  chk.contiguous("out", out);
  if (out.numel() == 0) return;
  for (size_t i = 0; i < count; ++i)
    if (inputs[i].numel() > 0) chk.device_pointer(name(i).c_str(), inputs[i]);
  chk.device_pointer("out", out);

  const size_t es = dtype_size(out.dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < ax; ++d) outer *= out.shape[d];
  for (int d = ax + 1; d < out.ndim; ++d) inner *= out.shape[d];
  const int64_t wbytes = out.shape[ax] * inner * static_cast<int64_t>(es);
  // Largest access unit dividing every width, offset and base address.
  uint64_t acc = static_cast<uint64_t>(wbytes) | reinterpret_cast<uintptr_t>(out.data);
  int64_t off = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t w = inputs[i].shape[ax] * inner * static_cast<int64_t>(es);
    if (w == 0) continue;
    acc |= static_cast<uint64_t>(w) | static_cast<uint64_t>(off) |
           reinterpret_cast<uintptr_t>(inputs[i].data);
    off += w;
  }
  const int g = (acc % 16 == 0)  ? 16
                : (acc % 8 == 0) ? 8
                : (acc % 4 == 0) ? 4
                : (acc % 2 == 0) ? 2
                                 : 1;
  int nonempty = 0;
  for (size_t i = 0; i < count; ++i) nonempty += inputs[i].numel() > 0 ? 1 : 0;
  auto launch = [&](auto unit_tag) {
    using U = decltype(unit_tag);
    constexpr int64_t kTile = int64_t{kCatThreads} * kCatUnits;
    if (concat_out_order() && nonempty <= kCatOutMax) {
      CatOutTable t{};
      t.out = out.data;
      t.out_width = wbytes / g;
      t.total = outer * t.out_width;
      int64_t offset = 0;
      for (size_t i = 0; i < count; ++i) {
        const int64_t w = inputs[i].shape[ax] * inner * static_cast<int64_t>(es) / g;
        if (w == 0) continue;
        t.src[t.count] = inputs[i].data;
        t.width[t.count] = w;
        t.offset[t.count] = offset;
        ++t.count;
        offset += w;
      }
      constexpr int64_t kOutTile = int64_t{kCatThreads} * kCatOutUnits;
      const dim3 grid(static_cast<unsigned>((t.total + kOutTile - 1) / kOutTile));
      if (t.total < (int64_t{1} << 31))
        concat_out_kernel<U, uint32_t, kCatOutUnits><<<grid, kCatThreads, 0, stream>>>(t);
      else
        concat_out_kernel<U, int64_t, kCatOutUnits><<<grid, kCatThreads, 0, stream>>>(t);
      detail::check_launch("concat");
      return;
    }
    CatTable tab;
    tab.count = 0;
    tab.out = out.data;
    tab.outer = outer;
    tab.out_width = wbytes / g;
    int64_t tiles = 0, offset = 0;
    auto flush = [&] {
      if (tab.count > 0)
        concat_kernel<U><<<static_cast<unsigned>(tiles), kCatThreads, 0, stream>>>(tab);
      detail::check_launch("concat");
      tab.count = 0;
      tiles = 0;
    };
    for (size_t i = 0; i < count; ++i) {
      const int64_t w = inputs[i].shape[ax] * inner * static_cast<int64_t>(es) / g;
      if (w == 0) continue;
      CatEntry& e = tab.e[tab.count++];
      e.src = inputs[i].data;
      e.width = w;
      e.offset = offset;
      e.first_tile = tiles;
      tiles += (w * outer + kTile - 1) / kTile;
      offset += w;
      if (tab.count == kMaxInputs || tiles > (int64_t{1} << 30)) flush();
    }
    flush();
  };
  switch (g) {
    case 16: launch(uint4{}); break;
    case 8: launch(uint2{}); break;
    case 4: launch(uint32_t{}); break;
    case 2: launch(uint16_t{}); break;
    default: launch(uint8_t{}); break;
  }
}

void transpose_batched(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  detail::OpCheck chk("transpose_batched");
  chk.same_dtype("dst", dst, "src", src);
  chk.rank_in("src", src, 2, 3);
  chk.rank_in("dst", dst, src.ndim, src.ndim);
  chk.valid_layout("src", src);
  chk.valid_layout("dst", dst);
  const int64_t b = src.ndim == 3 ? src.shape[0] : 1;
  const int64_t r = src.shape[src.ndim - 2], c = src.shape[src.ndim - 1];
  const bool ok = dst.shape[dst.ndim - 2] == c && dst.shape[dst.ndim - 1] == r &&
                  (src.ndim == 2 || dst.shape[0] == b);
  if (!ok) {
    Tensor want = src;
    want.shape[src.ndim - 2] = c;
    want.shape[src.ndim - 1] = r;
    chk.fail("dst", "shape " + want.shape_string(), dst.shape_string());
  }
  chk.contiguous("src", src);
  chk.contiguous("dst", dst);
  if (src.numel() == 0) return;
  chk.device_pointer("src", src);
  chk.device_pointer("dst", dst);
  const size_t es = dtype_size(src.dtype);
  auto launch_tiles = [&](auto unit) {
    using U = decltype(unit);
    constexpr int64_t V = 16 / sizeof(U);
    if (r % V != 0 || c % V != 0 || !detail::aligned(src.data, 16) ||
        !detail::aligned(dst.data, 16))
      return false;
    detail::launch_transpose_tiles<U>(static_cast<const U*>(src.data), static_cast<U*>(dst.data), r,
                                      c, c, r, r * c, r * c, b, stream);
    return true;
  };
  const bool tiled = es == 2   ? launch_tiles(uint16_t{})
                     : es == 4 ? launch_tiles(uint32_t{})
                     : es == 8 ? launch_tiles(uint64_t{})
                               : false;
  if (tiled) {
    detail::check_launch("transpose_batched");
    return;
  }
  if (b > 65535) chk.fail("src", "a batch of at most 65535", src.shape_string());
  if ((r + kTDim - 1) / kTDim > 65535) chk.fail("src", "at most 65535·64 rows", src.shape_string());
  const dim3 grid(static_cast<unsigned>((c + kTDim - 1) / kTDim),
                  static_cast<unsigned>((r + kTDim - 1) / kTDim), static_cast<unsigned>(b));
  const dim3 block(kTDim, kTRows);
  auto launch = [&](auto unit) {
    using U = decltype(unit);
    transpose_batched_kernel<U><<<grid, block, 0, stream>>>(static_cast<const U*>(src.data),
                                                            static_cast<U*>(dst.data), r, c);
  };
  switch (dtype_size(src.dtype)) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    default: launch(uint2{}); break;
  }
  detail::check_launch("transpose_batched");
}

}  // namespace tessel
