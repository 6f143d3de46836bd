// Reference AdamW loops the optimizer benchmark compares the SIMD kernel against (same math and constants).
#pragma once

#include <cstdint>

namespace cz::bench {

struct AdamWRefConsts {
  float decay, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, neg_step_size;
};

// The plain scalar loop, compiled with -fno-tree-vectorize (adamw_scalar.cpp): what a straightforward C++
// optimizer costs when the compiler does not vectorize it.
void adamw_scalar(float* p, const float* g, float* m, float* v, int64_t n, const AdamWRefConsts& c);

}  // namespace cz::bench
