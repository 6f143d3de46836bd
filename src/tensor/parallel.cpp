// Thread-count policy for OpenMP and OpenBLAS.
#include "tensor/parallel.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace cz {
namespace {
// OpenMP's thread count is a per-thread setting: the configured one, for threads started later.
std::atomic<int> g_configured_threads{0};
std::atomic<int> g_threads_per_rank{0};  // set_omp_threads_per_rank
}  // namespace

void use_passive_omp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

bool pin_current_thread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return CPU_COUNT(&set) > 0 && sched_setaffinity(0, sizeof(set), &set) == 0;  // 0: the calling thread
}

void set_omp_threads_per_rank(int threads) {
  g_threads_per_rank.store(std::max(0, threads));
}

void configure_cpu_threads(int cores) {
  int threads = g_threads_per_rank.load() > 0 ? g_threads_per_rank.load() : std::max(1, cores);
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) threads = std::atoi(env);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  g_configured_threads.store(threads);
}

int cpu_threads() {
  const int configured = g_configured_threads.load();
  return configured > 0 ? configured : omp_get_max_threads();
}

}  // namespace cz
