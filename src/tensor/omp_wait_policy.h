// libgomp's wait policy, chosen per rank at start from whether its threads fit the idle cores it may use
// (Note [Choosing the OpenMP wait policy]), and a CUDA rank's CPU threads (Note [CPU threads on a CUDA
// rank]).
#pragma once

#include <string>
#include <vector>

#include "tensor/cpu_share.h"

namespace cz {

// Note [Choosing the OpenMP wait policy]: at a barrier an OpenMP thread either spins (OMP_WAIT_POLICY=active)
// or sleeps in the kernel (passive). Spinning is faster when every thread has a core to itself, and a cliff
// when it does not: a spinning thread steals the core its partner, another rank or another job needs.
// ConvNeXt-atto, 64 px, one process of 2 threads on this 2-core machine (Note [Passive OpenMP waits] in
// parallel.h): beside a compiler 12-14 img/s spinning against 95-110 passive; alone on an idle
// machine 534 img/s passive against 633 active (19% lost). Neither policy is right everywhere, so each rank
// chooses when it starts, from what it can see then:
//   - threads: OpenMP threads per rank as configure_cpu_threads() will set them (OMP_NUM_THREADS, else the
//     cores of the rank's share of the node, estimated before MPI starts from the mask and the ranks on this
//     host, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE or MPICH's MPI_LOCALNRANKS: estimate_share in
//     cpu_share.h; the ranks that share the mask are those whose threads must fit it);
//   - one thread per rank waits for nobody: passive, which costs nothing then;
//   - threads x the ranks sharing the mask above its cores: oversubscribed, passive;
//   - otherwise the cores of the mask that are idle, measured over kIdleSampleSeconds from /proc/stat (the
//     other ranks of the job are at the same point, sleeping in the same measurement): active when all the
//     threads of the ranks sharing the mask fit them (within kIdleSlack of a core, the noise of a sample),
//     else passive.
// libgomp reads OMP_WAIT_POLICY only when it loads, so the choice is made before MPI starts and the program
// re-executes itself with it set (pid, arguments and open files stay); the re-executed process finds its own
// choice in $CZ_OMP_WAIT_CHOICE and says it in the run's header. OMP_WAIT_POLICY set by the user always wins.
// A machine idle at start may get busy later (a build started mid-run): the choice is not revisited; set
// OMP_WAIT_POLICY=passive where that is expected.
inline constexpr double kIdleSampleSeconds = 0.15;
inline constexpr double kIdleSlack = 0.3;

struct OmpWaitChoice {
  std::string policy;  // "active" or "passive"
  std::string reason;  // for the run's header
};

// The rule above. idle_cores < 0: not measured (unreadable /proc/stat), which chooses passive. After MPI
// starts the threads are the share's own (configure_cpu_threads): where the estimate was off, they only
// fit the share better, and a crowded share has one thread, which never spins.
OmpWaitChoice decide_omp_wait_policy(int threads, int ranks_sharing, int mask_cores, double idle_cores);

// The cores of this process's affinity mask that were idle over `seconds`, from /proc/stat's per-CPU counters
// (idle + iowait over all time); -1 when /proc/stat cannot be read.
double idle_cores_in_mask(double seconds);

// Ranks on this host as the launcher announces them before MPI starts (1 outside any launcher).
int launcher_local_ranks();

// Note [CPU threads on a CUDA rank]: on a CUDA rank the host does little math: one thread launches every
// kernel, and the loader's threads decode and augment. The rule above, made for ranks that compute on the
// CPU, would let 16 OpenMP threads spin beside 16 loader threads on a 16-core H200 host and starve the
// launching thread: run that way, ConvNeXt-T b64 took 23.9 ms a step against the benchmark's 15.0 (0.62x;
// the GPU busy 35% of the time), and 14.9 ms with OMP_WAIT_POLICY=passive. So a CUDA rank takes:
//   - OpenMP waiting passively, with 1 thread (its math is on the GPU: what is left on the host is the odd
//     scalar and the start's weight draws), or the rank's CPUs less one with --offload-optimizer (the host
//     then runs the optimizer's update);
//   - loader threads = the rank's CPUs less one, the one left to the launching thread;
//   - where the rank has 2 or more CPUs of its own, the loader threads pinned to all of them but the
//     launching thread's, which is on the GPU's NUMA node where the share has a CPU there (thread_cpus in
//     cpu_share.h), and the launching thread kept to the share;
// the rank's CPUs being its share of the node (Note [A rank's CPUs on a node] in cpu_share.h).
// OMP_NUM_THREADS, OMP_WAIT_POLICY and --loader-threads still win, and the header says which did. A CPU rank
// keeps the rule above: OpenMP threads and loader threads both take the share's cores.
struct CpuThreadsRequest {
  bool cuda = false;
  bool offload = false;         // --offload-optimizer (the host runs the optimizer)
  int mask_cores = 1;           // CPUs of this process's affinity mask
  int local_ranks = 1;          // ranks on this host
  CpuShare share;               // this rank's share of the node's CPUs
  bool gathered = false;        // `share` from the node's gathered masks (false: estimate_share's estimate)
  int omp_threads_env = 0;      // OMP_NUM_THREADS (0: unset)
  std::string wait_policy_env;  // OMP_WAIT_POLICY ("": unset)
  // The policy this process already runs with by its own choice (choose_omp_wait_policy's re-exec; "": none
  // yet): a CPU rank's choice rests on an idle-core measurement that is not repeated.
  OmpWaitChoice wait_chosen;
  int loader_threads_flag = -1;  // --loader-threads (-1: not given)
  double idle_cores = -1;        // CPU ranks: the idle cores measured at start (idle_cores_in_mask)
};
struct CpuThreads {
  int cores = 1;        // the CPUs of this rank's share
  int omp_threads = 1;  // OpenMP (and OpenBLAS) threads
  OmpWaitChoice wait;   // policy and why
  int loader_threads = 1;
  bool keep_launcher_core = false;  // CUDA: one CPU left to the launching thread
};
CpuThreads decide_cpu_threads(const CpuThreadsRequest& r);

// The header's line: "CPU threads per rank ...: ..." (what each pool got, why, and what the user's settings
// overrode); `cpus`: thread_cpus' answer on a CUDA rank.
std::string describe_cpu_threads(const CpuThreadsRequest& r, const CpuThreads& t,
                                 const ThreadCpus& cpus = {});

// The request as this process sees it before MPI starts (mask, launcher's local ranks, environment), its
// share estimated (estimate_share); a rank that has gathered its node's masks sets `share` and `gathered`.
CpuThreadsRequest cpu_threads_request(bool cuda, bool offload, int loader_threads_flag, int local_ranks);

// Unless OMP_WAIT_POLICY is already set, decides the policy and re-executes the program with it set. Returns
// in the process that goes on (after the re-exec, or at once when it was set; when exec fails, libgomp's
// default stays and the note says so). On a CUDA rank (Note [CPU threads on a CUDA rank]) the policy is
// passive without a measurement, and OpenMP's threads per rank are set (set_omp_threads_per_rank) unless
// OMP_NUM_THREADS is.
void choose_omp_wait_policy(char** argv, bool cuda = false, bool offload = false);

// "active: 2 threads per rank x 1 rank ..." for the header; empty before choose_omp_wait_policy().
const std::string& omp_wait_policy_note();

}  // namespace cz
