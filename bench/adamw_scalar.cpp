// The plain scalar AdamW loop of the optimizer benchmark; this file is compiled with -fno-tree-vectorize.
#include "adamw_reference.h"

namespace cz::bench {

void adamw_scalar(float* p, const float* g, float* m, float* v, int64_t n, const AdamWRefConsts& c) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p, g, m, v, i, c);
}

}  // namespace cz::bench
