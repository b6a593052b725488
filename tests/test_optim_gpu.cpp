// GPU tests of tessel::adamw (multi-tensor) against the float64 reference: mixed param and
// grad dtypes in one list, fp32 master weights with 16-bit params, ragged sizes (1, 7, 127,
// 4097, 70001 — tails and unaligned views), several steps, no bias correction, >256 tensors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ref/loss_optim_ref.hpp"
#include "tessel/optim.hpp"
#include "test_util.hpp"

namespace tessel {
namespace {

using test::DeviceTensor;

struct Host {
  std::vector<double> p, g, m, v;
};

class AdamWGpu : public test::GpuTest {
 protected:
  void run(const std::vector<int64_t>& sizes, const std::vector<DType>& pdts,
           const std::vector<DType>& gdts, bool master, int steps, bool bias_correction,
           int64_t offset = 0) {
    const size_t k = sizes.size();
    std::vector<Host> h(k);
    std::vector<DeviceTensor> p(k), g(k), m(k), v(k), mw(k);
    AdamWOptions o;
    o.lr = 1e-2f;
    o.weight_decay = 0.1f;
    o.bias_correction = bias_correction;
    for (size_t i = 0; i < k; ++i) {
      const int64_t n = sizes[i];
      const DType pdt = pdts[i % pdts.size()];
      h[i].p = rng().uniform(n, -1.0, 1.0);
      h[i].m = rng().uniform(n, -0.1, 0.1);
      h[i].v = rng().uniform(n, 0.001, 0.01);
      if (master) {
        mw[i] = test::alloc(DType::f32, {n}, offset);
        test::upload_values(mw[i], h[i].p);
        p[i] = test::alloc(pdt, {n}, offset);
      } else {
        p[i] = test::alloc(pdt, {n}, offset);
        test::upload_values(p[i], h[i].p);
      }
      m[i] = test::to_device(DType::f32, {n}, h[i].m);
      v[i] = test::to_device(DType::f32, {n}, h[i].v);
      g[i] = test::alloc(gdts[i % gdts.size()], {n}, offset);
    }
    for (int s = 1; s <= steps; ++s) {
      o.step = s;
      std::vector<AdamWTensors> list(k);
      for (size_t i = 0; i < k; ++i) {
        h[i].g = rng().uniform(h[i].p.size(), -1.0, 1.0);
        test::upload_values(g[i], h[i].g);
        list[i] = {p[i].t, g[i].t, m[i].t, v[i].t, master ? mw[i].t : Tensor{}};
        ref::adamw(h[i].p, h[i].g, h[i].m, h[i].v, o.lr, o.beta1, o.beta2, o.eps,
                   o.weight_decay, s, bias_correction);
      }
      adamw(list.data(), k, o, stream());
      sync();
      for (size_t i = 0; i < k; ++i) {
        SCOPED_TRACE("step " + std::to_string(s) + " tensor " + std::to_string(i));
        if (master) {
          EXPECT_TRUE(test::all_close(test::download_values(mw[i]), h[i].p, DType::f32));
          // the 16-bit copy is the rounded master
          EXPECT_TRUE(test::all_close(test::download_values(p[i]),
                                      ref::quantize(test::storage(p[i].t.dtype), h[i].p),
                                      p[i].t.dtype));
        } else {
          EXPECT_TRUE(test::all_close(test::download_values(p[i]), h[i].p, p[i].t.dtype));
          h[i].p = test::download_values(p[i]);  // continue from the stored (rounded) params
        }
        EXPECT_TRUE(test::all_close(test::download_values(m[i]), h[i].m, DType::f32));
        EXPECT_TRUE(test::all_close(test::download_values(v[i]), h[i].v, DType::f32));
      }
    }
  }
};

TEST_F(AdamWGpu, F32ParamsRaggedSizes) {
  run({1, 7, 127, 4097, 70001}, {DType::f32}, {DType::f32}, false, 3, true);
}
TEST_F(AdamWGpu, MixedDtypesOneLaunch) {
  run({4097, 127, 70001, 7, 8192}, {DType::f32, DType::bf16, DType::f16},
      {DType::bf16, DType::f32, DType::f16}, false, 2, true);
}
TEST_F(AdamWGpu, MasterWeightsBf16Copy) {
  run({1, 4097, 65536, 127}, {DType::bf16, DType::f16}, {DType::bf16}, true, 3, true);
}
TEST_F(AdamWGpu, UnalignedViewsNoBiasCorrection) {
  run({4097, 70001}, {DType::bf16}, {DType::f32}, false, 2, false, /*offset=*/1);
}
TEST_F(AdamWGpu, MoreThanOneLaunchOfTensors) {
  run(std::vector<int64_t>(300, 33), {DType::f32}, {DType::bf16}, false, 1, true);
}

}  // namespace
}  // namespace tessel
