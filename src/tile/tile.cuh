// tessel tile layer, memory-bound part: the vocabulary kernels are written in.
//
//   Frag<T, N>         N consecutive elements moved as one access (16 bytes when N = 16/sizeof(T))
//   load_frag / store_frag            full-vector access; *_pred variants guard a ragged edge
//   to_f32 / from_f32                 fp32 math on f32/f16/bf16 storage
//   warp_reduce / group_reduce        shuffle + shared-memory reductions over a row group
//   RowSlice<T, VEC, ITEMS, THREADS>  one row held in registers by a group of THREADS threads
//   RowGroups<THREADS, BLOCK>         which row a thread's group works on, grid-stride
//
// Kernel bodies use these and read like the algorithm (see ops/softmax/softmax.cu).
// Hopper TMA / WGMMA pieces (CuTe SM90 atoms) live beside this in the GEMM family.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace tessel::tile {

// ---- numeric conversion ----------------------------------------------------------------
template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Elements per 16-byte vector.
template <class T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// ---- fragments -------------------------------------------------------------------------
template <class T, int N>
struct alignas(sizeof(T) * N) Frag {
  T v[N];
};

// The machine word a fragment moves as: without it nvcc splits a struct-of-array store into
// one store per element (seen: 8 × st.global.u16 for a bf16 fragment).
template <int BYTES>
struct FragWord;
template <>
struct FragWord<16> {
  using type = uint4;
};
template <>
struct FragWord<8> {
  using type = uint2;
};
template <>
struct FragWord<4> {
  using type = uint32_t;
};
template <>
struct FragWord<2> {
  using type = uint16_t;
};
template <>
struct FragWord<1> {
  using type = uint8_t;
};

template <int N, class T>
__device__ __forceinline__ Frag<T, N> load_frag(const T* p) {
  using W = typename FragWord<sizeof(T) * N>::type;
  const W w = *reinterpret_cast<const W*>(p);
  Frag<T, N> f;
  memcpy(&f, &w, sizeof(W));
  return f;
}

template <int N, class T>
__device__ __forceinline__ void store_frag(T* p, const Frag<T, N>& f) {
  using W = typename FragWord<sizeof(T) * N>::type;
  W w;
  memcpy(&w, &f, sizeof(W));
  *reinterpret_cast<W*>(p) = w;
}

// A 16-byte store to global memory that stays one instruction: when a predicated scalar tail
// stores the same elements, LLVM sinks the common element stores and splits a plain uint4
// store into four (seen in the transpose: 8 × st.global.u16 per bf16 fragment).
template <int N, class T>
__device__ __forceinline__ void store_frag_global(T* p, const Frag<T, N>& f) {
  using W = typename FragWord<sizeof(T) * N>::type;
  W w;
  memcpy(&w, &f, sizeof(W));
  if constexpr (sizeof(W) == 16) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z),
                 "r"(w.w));
  } else {
    *reinterpret_cast<W*>(p) = w;
  }
}

// Loads min(valid, N) elements; the rest are `fill`. valid may be <= 0.
template <int N, class T>
__device__ __forceinline__ Frag<T, N> load_frag_pred(const T* p, int64_t valid, T fill) {
  if (valid >= N) return load_frag<N>(p);
  Frag<T, N> f;
#pragma unroll
  for (int i = 0; i < N; ++i) f.v[i] = i < valid ? p[i] : fill;
  return f;
}

// Global memory only: stores min(valid, N) elements.
template <int N, class T>
__device__ __forceinline__ void store_frag_pred(T* p, const Frag<T, N>& f, int64_t valid) {
  if (valid >= N) {
    store_frag_global<N>(p, f);
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i < valid) p[i] = f.v[i];
}

// ---- reductions ------------------------------------------------------------------------
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ static float identity() { return 0.f; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ static float identity() { return -INFINITY; }
};

// Butterfly over `width` lanes (a power of two <= 32): every lane gets the result.
template <int WIDTH = 32, class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction over consecutive groups of THREADS threads (a power of two) inside a block of
// BLOCK threads. Every thread of the block must call it (it holds __syncthreads when a group
// spans warps). `scratch` holds BLOCK/32 floats. All threads of a group get the result.
template <int THREADS, int BLOCK, class Op>
__device__ __forceinline__ float group_reduce(float v, Op op, float* scratch) {
  if constexpr (THREADS <= 32) {
    return warp_reduce<THREADS>(v, op);
  } else {
    constexpr int kWarpsPerGroup = THREADS / 32;
    v = warp_reduce<32>(v, op);
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) scratch[warp] = v;
    __syncthreads();
    const int first = warp / kWarpsPerGroup * kWarpsPerGroup;
    float r = scratch[first];
#pragma unroll
    for (int w = 1; w < kWarpsPerGroup; ++w) r = op(r, scratch[first + w]);
    __syncthreads();  // scratch may be reused by the next reduction
    return r;
  }
}

// ---- rows ------------------------------------------------------------------------------
// A block of BLOCK threads split into groups of THREADS, one row per group. Iterate with
//   for (RowGroups<T, B> g; g.valid_block(rows); g.next())  { ... g.row ... g.active ... }
// The loop is uniform across the block (so group_reduce may be called inside);
// `active` says whether this group's row exists.
template <int THREADS, int BLOCK>
struct RowGroups {
  static constexpr int kGroups = BLOCK / THREADS;
  int64_t base = static_cast<int64_t>(blockIdx.x) * kGroups;
  int lane = threadIdx.x % THREADS;  // thread index inside the group
  int group = threadIdx.x / THREADS;
  int64_t row = base + group;
  bool active = false;

  __device__ __forceinline__ bool valid_block(int64_t rows) {
    row = base + group;
    active = row < rows;
    return base < rows;
  }
  __device__ __forceinline__ void next() { base += static_cast<int64_t>(gridDim.x) * kGroups; }
};

// One row in registers: thread `lane` of the group holds vectors lane, lane+THREADS, …
// (ITEMS of them, VEC elements each) so a group's accesses are contiguous and coalesced.
template <class T, int VEC, int ITEMS, int THREADS>
struct RowSlice {
  static constexpr int kCols = VEC * ITEMS * THREADS;  // columns covered by one slice
  float x[ITEMS][VEC];

  // Column of element (i, 0) for this thread.
  __device__ __forceinline__ static int64_t col(int i, int lane) {
    return (static_cast<int64_t>(i) * THREADS + lane) * VEC;
  }

  __device__ __forceinline__ void load(const T* row, int64_t cols, int lane, float fill) {
    Frag<T, VEC> f[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {  // all loads first: ITEMS in flight per thread
      int64_t c = col(i, lane);
      f[i] = load_frag_pred<VEC>(row + c, cols - c, T{});
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[i][j] = col(i, lane) + j < cols ? to_f32(f[i].v[j]) : fill;
  }

  __device__ __forceinline__ void store(T* row, int64_t cols, int lane) const {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      int64_t c = col(i, lane);
      if (c >= cols) continue;
      Frag<T, VEC> f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) f.v[j] = from_f32<T>(x[i][j]);
      store_frag_pred<VEC>(row + c, f, cols - c);
    }
  }

  template <class F>
  __device__ __forceinline__ void map(F f) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[i][j] = f(x[i][j]);
  }

  // Thread-local fold; padding elements hold the `fill` given to load, which must be the
  // identity of Op.
  template <class Op>
  __device__ __forceinline__ float fold(Op op) const {
    float r = Op::identity();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) r = op(r, x[i][j]);
    return r;
  }
};

// One row held in registers in its storage dtype: thread `lane` holds vectors lane,
// lane+THREADS, … (ITEMS of them). Half the registers of a RowSlice for 16-bit types, so a
// thread can keep more bytes in flight; values are converted to fp32 where they are used.
// For ragged rows a vector is either entirely inside the row or entirely outside (callers
// use VEC = 1 when cols % VEC != 0), so validity is per vector.
template <class T, int VEC, int ITEMS, int THREADS>
struct RowFrags {
  static constexpr int kCols = VEC * ITEMS * THREADS;
  Frag<T, VEC> f[ITEMS];

  __device__ __forceinline__ static int64_t col(int i, int lane) {
    return (static_cast<int64_t>(i) * THREADS + lane) * VEC;
  }
  __device__ __forceinline__ static bool valid(int i, int lane, int64_t cols) {
    return col(i, lane) < cols;
  }
  __device__ __forceinline__ float at(int i, int j) const { return to_f32(f[i].v[j]); }

  __device__ __forceinline__ void load(const T* row, int64_t cols, int lane) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (valid(i, lane, cols)) f[i] = load_frag<VEC>(row + col(i, lane));
  }

  // Fold g(value) over this thread's valid elements with Op, starting at Op's identity.
  template <class Op, class G>
  __device__ __forceinline__ float fold(int64_t cols, int lane, Op op, G g) const {
    float r = Op::identity();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (valid(i, lane, cols))
#pragma unroll
        for (int j = 0; j < VEC; ++j) r = op(r, g(at(i, j)));
    return r;
  }
};

// Stores out(i, j) — a float per element — for every valid vector of a row.
template <class T, int VEC, int ITEMS, int THREADS, class F>
__device__ __forceinline__ void store_row(T* row, int64_t cols, int lane, F out) {
  using RF = RowFrags<T, VEC, ITEMS, THREADS>;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (!RF::valid(i, lane, cols)) continue;
    Frag<T, VEC> f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) f.v[j] = from_f32<T>(out(i, j));
    store_frag_global<VEC>(row + RF::col(i, lane), f);
  }
}

// ---- math ------------------------------------------------------------------------------
// 2^x as one MUFU.EX2 with results below 2^-126 flushed to zero (softmax exponentials).
// exp2f compiles to ex2.approx.f32, whose denormal handling adds a compare and two predicated
// multiplies per call.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- grid helpers ----------------------------------------------------------------------
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Programmatic dependent launch (runtime/launch.cuh): wait until the kernel before this one
// on the stream has completed and its writes are visible (returns at once when this kernel
// was launched without the attribute), and let the next kernel start launching.
__device__ __forceinline__ void wait_prior_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void allow_next_grid() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Spins until *counter >= n, with a gpu-scope acquire: the writes that other threads released
// before their increments (red.release, or __threadfence() then an atomic add) are visible
// after it. For a counter that kernels running at the same time advance (programmatic
// dependents that wait per piece instead of on the whole prior grid). sleep_ns: the pause
// between reads (short where a wait sits on a kernel's critical path; 0: none).
__device__ __forceinline__ void wait_counter_at_least(const int* counter, int n,
                                                      unsigned sleep_ns = 256) {
  for (;;) {
    int seen;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= n) return;
    if (sleep_ns > 0) __nanosleep(sleep_ns);
  }
}

}  // namespace tessel::tile
