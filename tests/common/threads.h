// OpenMP's thread count for a scope of a test (cpu_threads() follows it where no rank configured the
// threads).
#pragma once

#include <omp.h>

namespace cz::testing {

// f() with `n` OpenMP threads, restoring the previous count.
template <class F>
auto with_threads(int n, F&& f) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(n);
  auto r = f();
  omp_set_num_threads(prev);
  return r;
}

}  // namespace cz::testing
