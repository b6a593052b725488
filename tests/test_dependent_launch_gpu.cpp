// Programmatic dependent launch (include/tessel/launch.hpp): a decode-like chain of dependent
// ops (rms_norm, small-M GEMMs, swiglu, rms_norm_add, a bf16 GEMM whose output feeds the next
// one's A) run with the policy on must give the same bits as with it off, repeatedly (a
// missing wait would read a predecessor's output early: a race) and inside a CUDA graph.
#include <gtest/gtest.h>

#include <vector>

#include "tessel/activation.hpp"
#include "tessel/gemm.hpp"
#include "tessel/launch.hpp"
#include "tessel/norm.hpp"
#include "test_util.hpp"

namespace tessel::test {
namespace {

class DependentLaunchGpu : public GpuTest {};

TEST_F(DependentLaunchGpu, DecodeChainMatchesPlainLaunches) {
  for (int64_t m : {1, 5, 16}) {
    SCOPED_TRACE("M=" + std::to_string(m));
    const int64_t hidden = 1032, ffn = 2056;  // not multiples of the kernels' tiles
    auto rand_dev = [&](std::vector<int64_t> shape, double lo, double hi) {
      std::vector<double> v = rng().uniform(static_cast<size_t>(numel(shape)), lo, hi);
      return to_device(DType::bf16, shape, v);
    };
    DeviceTensor x = rand_dev({m, hidden}, -1, 1);
    DeviceTensor w_norm = rand_dev({hidden}, 0.5, 1.5);
    DeviceTensor w_up = rand_dev({2 * ffn, hidden}, -0.05, 0.05);
    DeviceTensor w_down = rand_dev({hidden, ffn}, -0.05, 0.05);
    DeviceTensor w_next = rand_dev({hidden, hidden}, -0.05, 0.05);
    DeviceTensor xn = alloc(DType::bf16, {m, hidden}), up = alloc(DType::bf16, {m, 2 * ffn});
    DeviceTensor act = alloc(DType::bf16, {m, ffn}), down = alloc(DType::bf16, {m, hidden});
    DeviceTensor h = alloc(DType::bf16, {m, hidden}), y = alloc(DType::bf16, {m, hidden});
    DeviceTensor out = alloc(DType::bf16, {m, hidden});
    GemmOptions nk;
    nk.b_layout = BLayout::nk;
    auto chain = [&] {
      rms_norm(x.t, w_norm.t, xn.t, nullptr, 1e-5f, stream());
      gemm(xn.t, w_up.t, up.t, stream(), nk);
      const Tensor gate = Tensor::contiguous(up.t.data, DType::bf16, {m, ffn});
      Tensor upv =
          Tensor::contiguous(static_cast<uint16_t*>(up.t.data) + ffn, DType::bf16, {m, ffn});
      upv.strides[0] = 2 * ffn;
      Tensor g = gate;
      g.strides[0] = 2 * ffn;
      swiglu(g, upv, act.t, stream());
      gemm(act.t, w_down.t, down.t, stream(), nk);
      rms_norm_add(x.t, down.t, w_norm.t, h.t, y.t, nullptr, 1e-5f, stream());
      gemm(y.t, w_next.t, out.t, stream(), nk);
    };
    std::vector<uint8_t> want;
    {
      const DependentLaunchScope off(false);
      poison(out);
      chain();
      sync();
      want = download_bytes(out);
    }
    // The result is a real computation (not a poison pattern or zeros).
    const std::vector<double> got_values = download_values(out);
    double mag = 0;
    for (double v : got_values) mag = std::max(mag, std::abs(v));
    ASSERT_GT(mag, 1e-3);
    ASSERT_LT(mag, 1e3);
    const DependentLaunchScope on(true);
    for (int rep = 0; rep < 20; ++rep) {
      poison(out);
      poison(act);
      chain();
      sync();
      ASSERT_TRUE(bit_exact(download_bytes(out), want, 2)) << "repetition " << rep;
    }
    // Captured into a graph (programmatic edges), replayed.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    chain();  // settles autotuning / scratch outside the capture
    sync();
    TESSEL_TEST_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
    chain();
    TESSEL_TEST_CUDA(cudaStreamEndCapture(stream(), &graph));
    TESSEL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 5; ++rep) {
      poison(out);
      TESSEL_TEST_CUDA(cudaGraphLaunch(exec, stream()));
      sync();
      EXPECT_TRUE(bit_exact(download_bytes(out), want, 2)) << "graph replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

}  // namespace
}  // namespace tessel::test
