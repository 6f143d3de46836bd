// The plain scalar AdamW loop of the optimizer benchmark; this file is compiled with -fno-tree-vectorize.
#include <cmath>

#include "adamw_reference.h"

namespace cz::bench {

void adamw_scalar(float* p, const float* g, float* m, float* v, int64_t n, const AdamWRefConsts& c) {
  for (int64_t i = 0; i < n; ++i) {
    const float mi = m[i] + c.one_minus_beta1 * (g[i] - m[i]);
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * g[i] * g[i];
    const float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * c.decay + c.neg_step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace cz::bench
