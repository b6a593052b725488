// Multi-tensor AdamW: every (param, grad, exp_avg, exp_avg_sq[, master]) of a list in one
// launch. The tensor table travels in the kernel parameters (up to kMaxPerLaunch entries,
// 64 bytes each); each block owns a tile of kTile elements of one tensor, found by binary
// search over the tensors' first tiles. Aligned tensors move 4 elements per access
// (16-byte f32 state, 8-byte 16-bit params/grads); the rest, and tails, element by element.
// Bytes per element: read g, m, v, p (or master), write m, v, p (and the param copy).
#include <cmath>
#include <string>

#include "ops/rows.cuh"
#include "tessel/optim.hpp"

namespace tessel {
namespace {

using namespace tessel::tile;

constexpr int kMaxPerLaunch = 256;
constexpr int kThreads = 256;
constexpr int kVecN = 4;
constexpr int kTile = kThreads * kVecN * 4;  // elements per block

struct Entry {
  void* p;
  const void* g;
  float* m;
  float* v;
  float* master;
  int64_t n;
  int64_t first_tile;
  int32_t pdt;  // 0 f32, 1 f16, 2 bf16
  int32_t gdt;
};

struct Table {
  Entry e[kMaxPerLaunch];
  int count;
  float lr, beta1, beta2, eps, decay, step_size, inv_bc2_sqrt;
};

template <class T>
__device__ __forceinline__ float ld(const void* p, int64_t i) {
  return to_f32(static_cast<const T*>(p)[i]);
}

struct Hyper {
  float beta1, beta2, eps, decay, step_size, inv_bc2_sqrt;
  __device__ __forceinline__ void update(float& p, float g, float& m, float& v) const {
    p *= decay;
    m = fmaf(beta1, m, (1.f - beta1) * g);
    v = fmaf(beta2, v, (1.f - beta2) * g * g);
    const float denom = sqrtf(v) * inv_bc2_sqrt + eps;
    p -= step_size * (m / denom);
  }
};

template <class P, class G>
__device__ __forceinline__ void run_tile(const Entry& e, int64_t t0, const Hyper& hp) {
  const int64_t end = min(e.n, t0 + kTile);
  P* pp = static_cast<P*>(e.p);
  const G* gp = static_cast<const G*>(e.g);
  const bool vec = ((reinterpret_cast<uintptr_t>(e.p) % (sizeof(P) * kVecN)) |
                    (reinterpret_cast<uintptr_t>(e.g) % (sizeof(G) * kVecN)) |
                    (reinterpret_cast<uintptr_t>(e.m) % 16) |
                    (reinterpret_cast<uintptr_t>(e.v) % 16) |
                    (reinterpret_cast<uintptr_t>(e.master) % 16)) == 0;
  if (vec && end - t0 == kTile) {
#pragma unroll
    for (int k = 0; k < kTile / (kThreads * kVecN); ++k) {
      const int64_t i = t0 + (int64_t(k) * kThreads + threadIdx.x) * kVecN;
      Frag<float, 4> m = load_frag<4>(e.m + i), v = load_frag<4>(e.v + i);
      Frag<G, 4> g = load_frag<4>(gp + i);
      Frag<float, 4> p;
      if (e.master != nullptr) {
        p = load_frag<4>(e.master + i);
      } else {
        Frag<P, 4> pr = load_frag<4>(pp + i);
#pragma unroll
        for (int j = 0; j < 4; ++j) p.v[j] = to_f32(pr.v[j]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) hp.update(p.v[j], to_f32(g.v[j]), m.v[j], v.v[j]);
      // store_frag_global: with the scalar tail loop below storing the same arrays, LLVM split
      // the first unrolled iteration's plain 16-byte stores into 4-byte ones (SASS, session 32).
      store_frag_global<4>(e.m + i, m);
      store_frag_global<4>(e.v + i, v);
      if (e.master != nullptr) store_frag_global<4>(e.master + i, p);
      Frag<P, 4> po;
#pragma unroll
      for (int j = 0; j < 4; ++j) po.v[j] = from_f32<P>(p.v[j]);
      store_frag_global<4>(pp + i, po);
    }
    return;
  }
  for (int64_t i = t0 + threadIdx.x; i < end; i += kThreads) {
    float p = e.master != nullptr ? e.master[i] : to_f32(pp[i]);
    float m = e.m[i], v = e.v[i];
    hp.update(p, to_f32(gp[i]), m, v);
    e.m[i] = m;
    e.v[i] = v;
    if (e.master != nullptr) e.master[i] = p;
    pp[i] = from_f32<P>(p);
  }
}

template <class P>
__device__ __forceinline__ void run_tile_g(const Entry& e, int64_t t0, const Hyper& hp) {
  switch (e.gdt) {
    case 0: run_tile<P, float>(e, t0, hp); break;
    case 1: run_tile<P, __half>(e, t0, hp); break;
    default: run_tile<P, __nv_bfloat16>(e, t0, hp); break;
  }
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ Table tab) {
  const int64_t tile = blockIdx.x;
  int lo = 0, hi = tab.count - 1;
  while (lo < hi) {  // last entry with first_tile <= tile
    const int mid = (lo + hi + 1) / 2;
    if (tab.e[mid].first_tile <= tile) lo = mid;
    else hi = mid - 1;
  }
  const Entry& e = tab.e[lo];
  const int64_t t0 = (tile - e.first_tile) * kTile;
  const Hyper hp{tab.beta1, tab.beta2, tab.eps, tab.decay, tab.step_size, tab.inv_bc2_sqrt};
  switch (e.pdt) {
    case 0: run_tile_g<float>(e, t0, hp); break;
    case 1: run_tile_g<__half>(e, t0, hp); break;
    default: run_tile_g<__nv_bfloat16>(e, t0, hp); break;
  }
}

int32_t code(DType d) { return d == DType::f32 ? 0 : d == DType::f16 ? 1 : 2; }

}  // namespace

void adamw(const AdamWTensors* list, size_t count, const AdamWOptions& opt, cudaStream_t stream) {
  detail::OpCheck chk("adamw");
  if (count > 0 && list == nullptr) chk.fail("list", "an array of tensors", "NULL");
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(opt.lr) || opt.lr < 0.f) chk.fail("lr", "a finite value >= 0", std::to_string(opt.lr));
  if (!(opt.beta1 >= 0.f && opt.beta1 < 1.f))
    chk.fail("beta1", "a value in [0, 1)", std::to_string(opt.beta1));
  if (!(opt.beta2 >= 0.f && opt.beta2 < 1.f))
    chk.fail("beta2", "a value in [0, 1)", std::to_string(opt.beta2));
  if (!finite(opt.eps) || opt.eps < 0.f) chk.fail("eps", "a finite value >= 0", std::to_string(opt.eps));
  if (!finite(opt.weight_decay))
    chk.fail("weight_decay", "a finite value", std::to_string(opt.weight_decay));
  if (opt.step < 1) chk.fail("step", "a step count >= 1", std::to_string(opt.step));
  // dtype -> shape -> layout for every entry, then device pointers.
  auto name = [](size_t i, const char* what) {
    return "list[" + std::to_string(i) + "]." + what;
  };
  for (size_t i = 0; i < count; ++i) {
    const AdamWTensors& t = list[i];
    const bool has_master = t.master.data != nullptr || t.master.ndim > 0;
    chk.dtype_in(name(i, "param").c_str(), t.param, {DType::f32, DType::f16, DType::bf16});
    chk.dtype_in(name(i, "grad").c_str(), t.grad, {DType::f32, DType::f16, DType::bf16});
    chk.dtype_in(name(i, "exp_avg").c_str(), t.exp_avg, {DType::f32});
    chk.dtype_in(name(i, "exp_avg_sq").c_str(), t.exp_avg_sq, {DType::f32});
    if (has_master) chk.dtype_in(name(i, "master").c_str(), t.master, {DType::f32});
  }
  for (size_t i = 0; i < count; ++i) {
    const AdamWTensors& t = list[i];
    const bool has_master = t.master.data != nullptr || t.master.ndim > 0;
    chk.valid_layout(name(i, "param").c_str(), t.param);
    const Tensor* others[] = {&t.grad, &t.exp_avg, &t.exp_avg_sq, &t.master};
    const char* names[] = {"grad", "exp_avg", "exp_avg_sq", "master"};
    for (int k = 0; k < (has_master ? 4 : 3); ++k) {
      chk.valid_layout(name(i, names[k]).c_str(), *others[k]);
      chk.same_shape(name(i, names[k]).c_str(), *others[k], name(i, "param").c_str(), t.param);
    }
    chk.contiguous(name(i, "param").c_str(), t.param);
    for (int k = 0; k < (has_master ? 4 : 3); ++k)
      chk.contiguous(name(i, names[k]).c_str(), *others[k]);
  }
  for (size_t i = 0; i < count; ++i) {
    const AdamWTensors& t = list[i];
    if (t.param.numel() == 0) continue;
    chk.device_pointer(name(i, "param").c_str(), t.param);
    chk.device_pointer(name(i, "grad").c_str(), t.grad);
    chk.device_pointer(name(i, "exp_avg").c_str(), t.exp_avg);
    chk.device_pointer(name(i, "exp_avg_sq").c_str(), t.exp_avg_sq);
    if (t.master.data != nullptr) chk.device_pointer(name(i, "master").c_str(), t.master);
  }

  const double step = static_cast<double>(opt.step);
  const double bc1 = opt.bias_correction ? 1.0 - std::pow(double(opt.beta1), step) : 1.0;
  const double bc2 = opt.bias_correction ? 1.0 - std::pow(double(opt.beta2), step) : 1.0;
  Table local;
  local.lr = opt.lr;
  local.beta1 = opt.beta1;
  local.beta2 = opt.beta2;
  local.eps = opt.eps;
  local.decay = static_cast<float>(1.0 - double(opt.lr) * opt.weight_decay);
  local.step_size = static_cast<float>(opt.lr / bc1);
  local.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  local.count = 0;
  int64_t tiles = 0;
  auto flush = [&] {
    if (local.count == 0) return;
    adamw_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(local);
    detail::check_launch("adamw");
    local.count = 0;
    tiles = 0;
  };
  for (size_t i = 0; i < count; ++i) {
    const AdamWTensors& t = list[i];
    const int64_t n = t.param.numel();
    if (n == 0) continue;
    Entry& e = local.e[local.count++];
    e.p = t.param.data;
    e.g = t.grad.data;
    e.m = static_cast<float*>(t.exp_avg.data);
    e.v = static_cast<float*>(t.exp_avg_sq.data);
    e.master = static_cast<float*>(t.master.data);
    e.n = n;
    e.first_tile = tiles;
    e.pdt = code(t.param.dtype);
    e.gdt = code(t.grad.dtype);
    tiles += (n + kTile - 1) / kTile;
    if (local.count == kMaxPerLaunch || tiles > (int64_t{1} << 30)) flush();
  }
  flush();
}

}  // namespace tessel
