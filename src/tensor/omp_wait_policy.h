// libgomp's wait policy, chosen per rank at start from whether its threads fit the idle cores it may use
// (Note [Choosing the OpenMP wait policy]).
#pragma once

#include <string>

namespace cz {

// Note [Choosing the OpenMP wait policy]: at a barrier an OpenMP thread either spins (OMP_WAIT_POLICY=active)
// or sleeps in the kernel (passive). Spinning is faster when every thread has a core to itself, and a cliff
// when it does not: a spinning thread steals the core its partner, another rank or another job needs.
// ConvNeXt-atto, 64 px, one process of 2 threads on this 2-core machine (Note [Passive OpenMP waits] in
// parallel.h, and issue 30): beside a compiler 12-14 img/s spinning against 95-110 passive; alone on an idle
// machine 534 img/s passive against 633 active (19% lost). Neither policy is right everywhere, so each rank
// chooses when it starts, from what it can see then:
//   - threads: OpenMP threads per rank as configure_cpu_threads() will set them (OMP_NUM_THREADS, else the
//     cores of the affinity mask shared among the ranks on this host: Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE
//     or MPICH's MPI_LOCALNRANKS before MPI starts);
//   - one thread per rank waits for nobody: passive, which costs nothing then;
//   - threads x local ranks above the cores of the mask: oversubscribed, passive;
//   - otherwise the cores of the mask that are idle, measured over kIdleSampleSeconds from /proc/stat (the
//     other ranks of the job are at the same point, sleeping in the same measurement): active when all the
//     threads of this host's ranks fit them (within kIdleSlack of a core, the noise of a sample), else
//     passive.
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

// The rule above. idle_cores < 0: not measured (unreadable /proc/stat), which chooses passive.
OmpWaitChoice decide_omp_wait_policy(int threads, int local_ranks, int mask_cores, double idle_cores);

// The cores of this process's affinity mask that were idle over `seconds`, from /proc/stat's per-CPU counters
// (idle + iowait over all time); -1 when /proc/stat cannot be read.
double idle_cores_in_mask(double seconds);

// Ranks on this host as the launcher announces them before MPI starts (1 outside any launcher).
int launcher_local_ranks();

// Unless OMP_WAIT_POLICY is already set, decides the policy and re-executes the program with it set. Returns
// in the process that goes on (after the re-exec, or at once when it was set; when exec fails, libgomp's
// default stays and the note says so).
void choose_omp_wait_policy(char** argv);

// "active: 2 threads per rank x 1 rank ..." for the header; empty before choose_omp_wait_policy().
const std::string& omp_wait_policy_note();

}  // namespace cz
