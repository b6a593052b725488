// Per-op device time of the engine's GPU steps: TESSEL_PROFILE_OPS=1.
//
// Where a decode step's time goes is the question every engine optimization starts from, and
// nsys is not always at hand. With profiling on, the GPU backend runs steps eagerly (no CUDA
// graphs, no dependent launch, so each op's time is its own) and brackets every op with CUDA
// events. The step is queued behind a 20 ms hold kernel, so the GPU runs its kernels back to
// back whatever the host's launch rate; at the end of the step the profile waits once and adds
// each op's elapsed time, GPU launch gap included, to a table keyed by (prefill/decode, op,
// shape). Steps with more than ~20 ms of host launch work are timed partly at the host's pace. The
// table is printed to stderr when the backend is destroyed: per key the calls per step,
// microseconds per call, share of the step and, for ops that stream a weight, GB/s of those bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessel::llm {

class OpProfile {
 public:
  OpProfile();  // on when TESSEL_PROFILE_OPS=1
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  bool on() const { return on_; }
  // A step of `rows` token rows starts on `s`; decode steps are keyed apart from prompt runs.
  void begin_step(bool decode, int64_t rows, cudaStream_t s);
  // Marks the end of the op `name` (shape in `detail`, `bytes` streamed, 0 if not meaningful):
  // its time runs from the previous mark (or the step start) to now.
  void mark(const char* name, const std::string& detail, double bytes);
  // Waits for the step and adds its ops to the table.
  void end_step();
  std::string report() const;

 private:
  struct Pending {
    std::string key;
    double bytes;
  };
  struct Total {
    double ms = 0, bytes = 0;
    int64_t calls = 0;
  };
  cudaEvent_t event(size_t i);

  bool on_ = false;
  bool in_step_ = false;
  bool decode_ = false;
  int64_t rows_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<Pending> pending_;
  std::map<std::string, Total> totals_;
  std::map<std::string, std::pair<double, int64_t>> steps_;  // phase -> (ms, steps)
};

}  // namespace tessel::llm
