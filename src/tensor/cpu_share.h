// Which CPUs of a node each rank takes, from the affinity masks the launcher gave the node's ranks (Note [A
// rank's CPUs on a node]).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cz {

// Note [A rank's CPUs on a node]: a launcher either binds each rank to CPUs of its own (srun
// --cpus-per-task=14, mpirun --map-by ppr:8:node:PE=14), or gives several ranks one mask (mpirun's default
// binding to a socket for more than two ranks, --bind-to none, a job step without task binding). Dividing
// every mask by the ranks on the node is right only for the last: a rank bound to 14 CPUs of its own would
// get 14 / 8 = 1. So the ranks of a node gather their masks (the shared-memory
// communicator, dist::World) and each CPU goes to the ranks whose masks hold it:
//   - a CPU that one rank's mask holds is that rank's;
//   - CPUs that several ranks' masks hold (grouped by exactly which ranks hold them) are split among those
//     ranks by whole cores: SMT siblings (sysfs thread_siblings_list) stay together, each holder gets
//     cores / holders of them, the first ranks one more where it does not divide; a rank whose GPU is near
//     some of them (its PCI device's local_cpulist) takes those first, the others then take what is left in
//     CPU order, so that slices stay contiguous;
//   - where a group has fewer cores than holders, the holders take its cores in turn and share them: the
//     share is then "crowded" (the launcher placed more ranks than cores there), and nothing is pinned.
// Every rank computes the same answer from the same gathered masks. A rank's share gives its OpenMP threads
// (one per CPU of it, as before the gather: a sibling kept with its core, so that no two ranks split a core,
// but not left idle; OMP_NUM_THREADS=cores for one thread a core) and, on a CUDA rank, its loader threads
// (its CPUs less the one left to the thread that launches kernels, taken on the GPU's NUMA node): Note [CPU
// threads on a CUDA rank] in omp_wait_policy.h.
struct RankCpus {
  std::vector<int> mask;  // the CPUs the launcher let this rank run on, ascending
  std::vector<int> near;  // CPUs local to this rank's GPU (its PCI device's local_cpulist); empty: none
};

struct CpuShare {
  std::vector<int> cpus;  // ascending
  int cores = 0;          // distinct cores among them (SMT siblings count once)
  int holders = 1;        // ranks of the node whose masks hold a CPU of this rank's mask, itself included
  bool crowded = false;   // fewer cores than ranks somewhere in its mask: CPUs shared with other ranks
  int near = 0;           // of `cpus`, those near the rank's GPU
};

// SMT siblings: each CPU's core, as the smallest CPU of its thread_siblings_list; a CPU missing from the
// map is a core of its own.
using CoreOf = std::map<int, int>;

// The rule above for every rank of a node (ranks in local-rank order).
std::vector<CpuShare> share_node_cpus(const std::vector<RankCpus>& ranks, const CoreOf& core_of = {});

// Where a rank's threads run. The launching thread's CPU: the share's first CPU near the GPU, else its
// first; the loader threads on every other CPU of the share. `loaders` empty (no pinning) when the share
// has one CPU or is crowded.
struct ThreadCpus {
  int launcher = -1;
  std::vector<int> loaders;
};
ThreadCpus thread_cpus(const CpuShare& share, const std::vector<int>& near);

// Before the masks are gathered (the wait policy's choice, which precedes MPI; a plan): this rank's share
// as if `local_ranks x mask / online CPUs` ranks (at least 1, at most local_ranks) held the same mask:
// exact for unbound ranks (all hold the whole machine) and for ranks bound to equal slices of it (each its
// own), and for a socket shared by the ranks on it.
CpuShare estimate_share(const std::vector<int>& mask, int local_ranks, int online_cpus,
                        const CoreOf& core_of = {});

// The header's line for the ranks of one node: each rank's mask, its share and why.
std::string describe_node_shares(const std::vector<RankCpus>& ranks, const std::vector<CpuShare>& shares);

// "0-3,8-11" <-> {0, 1, 2, 3, 8, 9, 10, 11}. parse_cpu_list: empty for an empty or unreadable list.
std::vector<int> parse_cpu_list(const std::string& list);
std::string cpu_list(const std::vector<int>& cpus);

// SMT siblings from <root>/devices/system/cpu/cpuN/topology/thread_siblings_list for `cpus` (root "/sys";
// $CZ_SYSFS_ROOT overrides it, as for the topology).
CoreOf read_core_of(const std::vector<int>& cpus, const std::string& root = "");

}  // namespace cz
