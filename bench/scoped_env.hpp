// An environment variable set for one scope, the caller's value restored after it: a suite that
// forces a path for a check must not clear a variable the caller set for the whole run (an A/B
// through TESSEL_ATTENTION_BWD_PATH otherwise reached only the suite's first case).
#pragma once

#include <cstdlib>
#include <string>

namespace tessel::bench {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace tessel::bench
