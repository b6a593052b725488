// Launch policy shared by tessel's ops.
#pragma once

namespace tessel {

// Programmatic dependent launch (Hopper): while enabled on the calling thread, the kernels
// that support it (the decode-path ops: small-M GEMM, norms, activations, embedding, RoPE,
// KV append, decode attention, argmax) are launched so that they may begin while the kernel
// before them on the stream finishes; each waits for that kernel before it reads anything the
// kernel may have written. The exception, and the reason this is opt-in: the small-M GEMM
// (M <= 32) starts streaming its weight operand B before that wait. Enable it only where B is
// never written by the kernel launched just before the GEMM (true for inference weights).
// Off by default. Returns the previous setting.
bool set_dependent_launch(bool enabled);
bool dependent_launch();

// Sets the policy for a scope and restores the previous one.
class DependentLaunchScope {
 public:
  explicit DependentLaunchScope(bool enabled) : prev_(set_dependent_launch(enabled)) {}
  ~DependentLaunchScope() { set_dependent_launch(prev_); }
  DependentLaunchScope(const DependentLaunchScope&) = delete;
  DependentLaunchScope& operator=(const DependentLaunchScope&) = delete;

 private:
  bool prev_;
};

}  // namespace tessel
