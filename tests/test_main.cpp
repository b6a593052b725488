// GoogleTest entry point of tessel_tests.
//
// GPU suites (names containing "Gpu") skip without a CUDA GPU; TESSEL_REQUIRE_GPU=1 makes
// them fail instead. TESSEL_TEST_SEED=<n> replays the random inputs of a failing test.
#include <gtest/gtest.h>

#include <cstdio>

#include "tessel/tensor.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef GTEST_FLAG_GET
  const bool listing = GTEST_FLAG_GET(list_tests);
#else
  const bool listing = ::testing::GTEST_FLAG(list_tests);
#endif
  // Not while listing: CTest's test discovery parses that output.
  if (!listing) {
    const int devices = tessel::cuda_device_count();
    std::printf("tessel_tests: %d CUDA device(s)%s\n", devices,
                devices == 0 ? "; GPU tests skip (fail with TESSEL_REQUIRE_GPU=1)" : "");
  }
  return RUN_ALL_TESTS();
}
