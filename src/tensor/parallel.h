// CPU threading. Note [CPU threads per rank]: when several ranks share a node, each must use only its share
// of the cores; oversubscribed threads that spin while waiting (OpenMP barriers, OpenBLAS workers) stall
// everyone. configure_cpu_threads() sizes OpenMP and OpenBLAS (its OpenMP build, which shares OpenMP's pool)
// to max(1, cores this process may run on / ranks on this node). OMP_NUM_THREADS, if set, wins.
#pragma once

#include <cstdint>

namespace cz {

// Note [Passive OpenMP waits]: libgomp's default wait policy spins at every barrier for a while before it
// sleeps. Where a rank's threads share cores with anything else (other ranks, other jobs, namespace hosts of
// the test bed, a build) a spinning thread steals the core its partner needs and every parallel region gets
// several times slower: ConvNeXt-atto (64 px, micro-batch 16, one process of 2 threads) trained at 12-14 img/s
// with the default policy on this 2-core machine while a compiler ran beside it, against 95-110 with passive
// waits. The project never spins, so programs call this first thing in main(): unless OMP_WAIT_POLICY is set
// (the user's choice wins), it sets it to passive and re-executes the program, since libgomp reads it only
// when it loads. The pid, arguments and open files stay. Returns only when no re-exec happened (set already,
// or exec failed: then the default policy stays).
void use_passive_omp_waits(char** argv);

int available_cores();  // CPUs in this process's affinity mask
void configure_cpu_threads(int ranks_on_node);
int cpu_threads();  // threads CPU kernels use (as configured; a thread started later must apply it itself)

// Parallel loops below this many elements of work stay on one thread.
inline constexpr int64_t kParallelGrain = 1 << 14;

}  // namespace cz
