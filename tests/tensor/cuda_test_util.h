// Shared by the CUDA test files: skip without a GPU, and the device the tests run on.
#pragma once

#include <gtest/gtest.h>

#include "tensor/device.h"

// Skips the current test (from a TEST body or a fixture's SetUp) when no GPU is visible.
#define CZ_REQUIRE_GPU()                                                   \
  do {                                                                     \
    if (!::cz::cuda_available()) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

namespace cz::testing {
inline Device gpu() {
  return Device::cuda(0);
}
}  // namespace cz::testing
