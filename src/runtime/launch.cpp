#include "tessel/launch.hpp"

namespace tessel {
namespace {
thread_local bool g_dependent_launch = false;
}

bool set_dependent_launch(bool enabled) {
  const bool prev = g_dependent_launch;
  g_dependent_launch = enabled;
  return prev;
}

bool dependent_launch() { return g_dependent_launch; }

}  // namespace tessel
