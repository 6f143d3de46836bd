// Thread-count policy for OpenMP and OpenBLAS.
#include "tensor/parallel.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace cz {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void configure_cpu_threads(int ranks_on_node) {
  int threads = std::max(1, available_cores() / std::max(1, ranks_on_node));
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) threads = std::atoi(env);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int cpu_threads() {
  return omp_get_max_threads();
}

}  // namespace cz
