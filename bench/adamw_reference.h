// Reference AdamW loops the optimizer benchmark compares the SIMD kernel against (same math and constants).
#pragma once

#include <cmath>
#include <cstdint>

namespace cz::bench {

struct AdamWRefConsts {
  float decay, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, neg_step_size;
};

// Element i of the update, as both reference loops run it.
inline void adamw_element(float* p, const float* g, float* m, float* v, int64_t i, const AdamWRefConsts& c) {
  const float mi = m[i] + c.one_minus_beta1 * (g[i] - m[i]);
  const float vi = c.beta2 * v[i] + c.one_minus_beta2 * g[i] * g[i];
  const float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
  p[i] = p[i] * c.decay + c.neg_step_size * (mi / denom);
  m[i] = mi;
  v[i] = vi;
}

// The plain scalar loop, compiled with -fno-tree-vectorize (adamw_scalar.cpp): what a straightforward C++
// optimizer costs when the compiler does not vectorize it.
void adamw_scalar(float* p, const float* g, float* m, float* v, int64_t n, const AdamWRefConsts& c);

}  // namespace cz::bench
