// Process start-up for distributed runs: MPI at a thread level that lets communication threads call MPI,
// world and node-local ranks, the GPU each rank drives, peer liveness, and the last-resort abort path that
// main() takes when a collective fails (Note [Failure handling] in communicator.h).
#pragma once

#include <mpi.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cpu_share.h"

namespace cz::dist {

struct WorldOptions {
  bool configure_threads = true;        // configure_cpu_threads(this rank's share of the node's cores)
  bool select_gpu = true;               // use GPU local_rank % device_count when GPUs are visible
  bool install_signal_handlers = true;  // a SIGTERM from the launcher prints what this rank was doing
};

struct PeerInfo {
  int pid = 0;
  std::string host;
};

class World {
 public:
  // MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is already initialised; a program started without a
  // launcher is an MPI singleton, i.e. a world of size 1. Sets the log prefix to "[rank R] ".
  static World& init(int* argc, char*** argv, const WorldOptions& options = {});
  static World& get();  // InternalError before init()
  static bool initialized();
  // MPI_Finalize (when init() started MPI). Destroy communicators first.
  static void finalize();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_size() const { return local_size_; }
  int local_rank() const { return local_rank_; }
  const std::string& hostname() const { return peers_[size_t(rank_)].host; }
  bool launched() const { return launched_; }  // by mpirun/srun rather than as a singleton
  MPI_Comm comm() const { return MPI_COMM_WORLD; }
  int gpu() const { return gpu_; }  // this rank's CUDA device, -1 without one
  // The CPUs of this node's ranks (Note [A rank's CPUs on a node] in tensor/cpu_share.h): each local rank's
  // affinity mask and the CPUs near its GPU, gathered at init over the node, and every one's share of them.
  const std::vector<RankCpus>& node_cpus() const { return node_cpus_; }
  const std::vector<CpuShare>& node_shares() const { return node_shares_; }
  const CpuShare& cpu_share() const { return node_shares_.at(size_t(local_rank_)); }

  const PeerInfo& peer(int rank) const { return peers_.at(size_t(rank)); }
  bool same_host(int rank) const { return peer(rank).host == hostname(); }
  // False once a rank on this host has exited (its pid is gone or a zombie). Ranks on other hosts count as
  // alive: their failures surface as timeouts.
  bool peer_alive(int rank) const;

 private:
  World() = default;
  void setup(const WorldOptions& options);
  void gather_node_cpus(MPI_Comm node);  // node_cpus_ and node_shares_, over the node's communicator

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, gpu_ = -1;
  bool launched_ = false, owns_mpi_ = false;
  std::vector<PeerInfo> peers_;
  std::vector<bool> pid_visible_;  // same-host peers whose pid this process can see (same pid namespace)
  std::vector<RankCpus> node_cpus_;
  std::vector<CpuShare> node_shares_;
};

// Hooks abort_world() runs before MPI_Abort (NCCL communicators register ncclCommAbort). Returns an id.
int add_abort_hook(std::function<void()> hook);
void remove_abort_hook(int id);
// Aborts every registered communicator, then the whole job (MPI_Abort; _exit without MPI). Never returns.
[[noreturn]] void abort_world(int exit_code) noexcept;
// What main() does with an exception from a distributed run: prints "[rank R] <what>; aborting" to stderr,
// then abort_world(1), so that no other rank waits for this one.
[[noreturn]] void die(const std::exception& e) noexcept;

// What this process is communicating right now ("all_reduce of 64 bytes on ranks [0, 1]"), shown by the
// SIGTERM handler. Cheap; called by communication threads before each collective.
void set_current_activity(const std::string& what);

}  // namespace cz::dist
