// CPU threading. Note [CPU threads per rank]: when several ranks share a node, each must use only its share
// of the cores; oversubscribed threads that spin while waiting (OpenMP barriers, OpenBLAS workers) stall
// everyone. configure_cpu_threads() sizes OpenMP and OpenBLAS (its OpenMP build, which shares OpenMP's pool)
// to the rank's share of its node's cores. OMP_NUM_THREADS, if set, wins.
#pragma once

#include <cstdint>
#include <vector>

namespace cz {

// Note [Passive OpenMP waits]: libgomp's default wait policy spins at every barrier for a while before it
// sleeps. Where a rank's threads share cores with anything else (other ranks, other jobs, namespace hosts of
// the test bed, a build) a spinning thread steals the core its partner needs and every parallel region gets
// several times slower. ConvNeXt-atto (64 px, micro-batch 16, one process of 2 threads on this 2-core
// machine):
//   beside a compiler:            12-14 img/s spinning (the default), 95-110 passive;
//   beside two busy loops:        50-54 img/s spinning even with GOMP_SPINCOUNT=1000-10000, 228 passive;
//   alone on an idle machine:     390-395 img/s spinning, 303-312 passive (22% slower).
// No spin count avoids the cliff. commbench and bench_kernels call this first thing in main(): unless
// OMP_WAIT_POLICY is set, it sets it to passive and re-executes the program, since libgomp reads it only
// when it loads. convnext_zero chooses active or passive per rank instead, from whether its threads fit the
// idle cores it may use (Note [Choosing the OpenMP wait policy] in omp_wait_policy.h): passive waits cost
// 19% on an idle machine. With one thread per rank (ranks >= cores) the policy makes no
// difference. The pid, arguments and open files stay. Returns only when no re-exec happened (set already, or
// exec failed: then the default policy stays).
void use_passive_omp_waits(char** argv);

int available_cores();             // CPUs in this process's affinity mask
std::vector<int> affinity_cpus();  // those CPUs' numbers, ascending
// Pins the calling thread to `cpus` (sched_setaffinity); false when the kernel refuses (a CPU outside the
// mask), and the thread keeps the mask it had.
bool pin_current_thread(const std::vector<int>& cpus);
// Sizes OpenMP and OpenBLAS to the cores this rank really has: its share of the node's CPUs (Note [A rank's
// CPUs on a node] in cpu_share.h; dist::World gathers the node's masks), unless set_omp_threads_per_rank or
// OMP_NUM_THREADS says otherwise. The loader's default --loader-threads takes the same share.
void configure_cpu_threads(int cores);
// OpenMP threads per rank for configure_cpu_threads to take instead of the cores (0: the cores);
// OMP_NUM_THREADS still wins. A CUDA rank sets it (Note [CPU threads on a CUDA rank] in omp_wait_policy.h).
void set_omp_threads_per_rank(int threads);
int cpu_threads();  // threads CPU kernels use (as configured; a thread started later must apply it itself)

// Parallel loops below this many elements of work stay on one thread.
inline constexpr int64_t kParallelGrain = 1 << 14;

}  // namespace cz
