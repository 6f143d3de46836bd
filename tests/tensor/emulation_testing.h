// What the tests of emulated CUDA kernels share (test_grn_emulation.cpp, test_soft_target_emulation.cpp):
// inputs rounded to the kernel's dtype T, and one test a dtype, each against the CPU backend in f32 at the
// tolerance that dtype's rounding allows.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "tensor/half.h"

namespace cz::testing {

// Each value rounded to f32, then to T.
template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  std::vector<T> out;
  for (double x : v) out.push_back(T(float(x)));
  return out;
}

}  // namespace cz::testing

// suite.F32MatchesCpu, Bf16MatchesCpu and F16MatchesCpu: check<T>(dtype, tolerance) at 1e-5, 1e-2 and 2e-3.
#define EMULATION_TESTS_EACH_DTYPE(suite) \
  TEST(suite, F32MatchesCpu) {            \
    check<float>(DType::f32, 1e-5);       \
  }                                       \
  TEST(suite, Bf16MatchesCpu) {           \
    check<BFloat16>(DType::bf16, 1e-2);   \
  }                                       \
  TEST(suite, F16MatchesCpu) {            \
    check<Half>(DType::f16, 2e-3);        \
  }
