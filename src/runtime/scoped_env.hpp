// An environment variable set (or unset, value nullptr) for one scope, the caller's value
// restored after it. Tests and bench suites force a path this way without clearing a variable
// the caller set for the whole run (an A/B through TESSEL_ATTENTION_BWD_PATH otherwise reached
// only a suite's first case).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace tessel::detail {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace tessel::detail
