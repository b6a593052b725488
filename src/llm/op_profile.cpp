#include "llm/op_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ops/llm_engine/hold_stream.hpp"
#include "runtime/check.hpp"

namespace tessel::llm {

OpProfile::OpProfile() {
  const char* e = std::getenv("TESSEL_PROFILE_OPS");
  on_ = e && std::strcmp(e, "1") == 0;
}

OpProfile::~OpProfile() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t OpProfile::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    TESSEL_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[i];
}

void OpProfile::begin_step(bool decode, int64_t rows, cudaStream_t s) {
  if (!on_) return;
  in_step_ = true;
  decode_ = decode;
  rows_ = rows;
  stream_ = s;
  pending_.clear();
  // The step's launches queue up behind this while the host issues them: the events then time
  // the kernels back to back (with their launch gaps on the GPU), not the host's launch rate.
  llm_engine::hold_stream(20000.0, s);
  TESSEL_CUDA_CHECK(cudaEventRecord(event(0), s));
}

void OpProfile::mark(const char* name, const std::string& detail, double bytes) {
  if (!on_ || !in_step_) return;
  pending_.push_back({std::string(decode_ ? "decode" : "prompt") + " " + std::to_string(rows_) +
                          " rows  " + name + " " + detail,
                      bytes});
  TESSEL_CUDA_CHECK(cudaEventRecord(event(pending_.size()), stream_));
}

void OpProfile::end_step() {
  if (!on_ || !in_step_) return;
  in_step_ = false;
  if (pending_.empty()) return;
  TESSEL_CUDA_CHECK(cudaEventSynchronize(events_[pending_.size()]));
  double step_ms = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    float ms = 0;
    TESSEL_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    Total& t = totals_[pending_[i].key];
    t.ms += ms;
    t.bytes += pending_[i].bytes;
    ++t.calls;
    step_ms += ms;
  }
  auto& st =
      steps_[std::string(decode_ ? "decode" : "prompt") + " " + std::to_string(rows_) + " rows"];
  st.first += step_ms;
  ++st.second;
}

std::string OpProfile::report() const {
  if (!on_ || totals_.empty()) return {};
  std::string out = "tessel op profile (TESSEL_PROFILE_OPS=1: eager steps, no dependent launch)\n";
  char line[512];
  for (const auto& [phase, st] : steps_) {
    const double step_ms = st.first / static_cast<double>(st.second);
    std::snprintf(line, sizeof line, "\n%s: %lld steps, %.1f us per step\n", phase.c_str(),
                  static_cast<long long>(st.second), step_ms * 1e3);
    out += line;
    std::snprintf(line, sizeof line, "  %-58s %10s %10s %7s %9s\n", "op", "calls/step", "us/call",
                  "% step", "GB/s");
    out += line;
    std::vector<std::pair<std::string, Total>> rows;
    for (const auto& kv : totals_)
      if (kv.first.compare(0, phase.size() + 1, phase + " ") == 0) rows.push_back(kv);
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    for (const auto& [key, t] : rows) {
      const double per_call_us = t.ms * 1e3 / static_cast<double>(t.calls);
      const double share = t.ms / st.first * 100.0;
      char gbs[32] = "-";
      if (t.bytes > 0) std::snprintf(gbs, sizeof gbs, "%.0f", t.bytes / (t.ms * 1e-3) / 1e9);
      std::snprintf(line, sizeof line, "  %-58s %10.1f %10.2f %7.1f %9s\n",
                    key.substr(phase.size() + 2).c_str(),
                    static_cast<double>(t.calls) / static_cast<double>(st.second), per_call_us,
                    share, gbs);
      out += line;
    }
  }
  return out;
}

}  // namespace tessel::llm
