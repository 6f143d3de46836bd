// CPU threading. Note [CPU threads per rank]: when several ranks share a node, each must use only its share
// of the cores; oversubscribed threads that spin while waiting (OpenMP barriers, OpenBLAS workers) stall
// everyone. configure_cpu_threads() sizes OpenMP and OpenBLAS (its OpenMP build, which shares OpenMP's pool)
// to max(1, cores this process may run on / ranks on this node). OMP_NUM_THREADS, if set, wins.
#pragma once

#include <cstdint>

namespace cz {

int available_cores();  // CPUs in this process's affinity mask
void configure_cpu_threads(int ranks_on_node);
int cpu_threads();  // threads CPU kernels use (as configured; a thread started later must apply it itself)

// Parallel loops below this many elements of work stay on one thread.
inline constexpr int64_t kParallelGrain = 1 << 14;

}  // namespace cz
