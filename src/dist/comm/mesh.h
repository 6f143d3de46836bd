// Where the launch put the ranks (which host each is on) and the process groups a run communicates in: the
// world, its shard and replication groups (a 2-D mesh), and each host's ranks and the ranks across hosts.
//
// Note [2-D mesh]: the world's ranks are cut into shard groups of equal size S; the ranks holding the same
// index in every shard group form a replication group (size world / S). ZeRO shards the model state inside a
// shard group and replicates it across the replication group (FSDP's HSDP, ZeRO++'s hpZ for the gathers):
// with S = the ranks of a host, the collectives that move the model state stay inside a host, and only the
// gradient shard's all-reduce crosses hosts. S = the world size is a flat run (the replication groups are
// groups of one). `--shard-group host` takes each host's ranks (every host must have the same number);
// `--shard-group N` takes blocks of N consecutive world ranks.
//
// The host groups (the ranks of this rank's host) and the cross groups (the ranks with this rank's local
// index on every host) are the two levels of the node-aware collectives and of hpZ's host-local copy; a
// host's ranks are numbered by world rank, so cross group i holds the i-th rank of each host.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dist/comm/process_group.h"

namespace cz::dist {

class World;

// The labels of the mesh's communicators (CommOptions::label, so their communication threads'
// current_communicator()); the planner's replay tags each ring scratch with them (engine_events.cpp in
// src/dist/plan).
inline constexpr const char* kWorldComm = "world";
inline constexpr const char* kShardComm = "shard";
inline constexpr const char* kReplicateComm = "replicate";
inline constexpr const char* kHostComm = "host";
inline constexpr const char* kCrossComm = "cross";

// The hosts of a launch, from the host name each rank reported at start (World::peer).
struct HostMap {
  std::vector<std::string> hosts;       // in the order of their lowest rank
  std::vector<int> host_of;             // per world rank: its index in `hosts`
  std::vector<std::vector<int>> ranks;  // per host: its world ranks, ascending
  std::vector<int> local_index;         // per world rank: its index in its host's ranks

  int num_hosts() const { return int(hosts.size()); }
  // The ranks every host has, or 0 when hosts differ.
  int ranks_per_host() const;
  static HostMap of(const std::vector<std::string>& host_of_rank);
};
HostMap host_map(const World& world);

// The shard groups of a world of `world` ranks on `hosts` (Note [2-D mesh]): `spec` is "world", "host" or a
// number of ranks. ValueError naming the flag value when it does not divide the world or the hosts differ.
std::vector<std::vector<int>> shard_groups(const std::string& spec, const HostMap& hosts);
// The shard group's spelling (world, host or a number of ranks >= 1), checked: the one place --shard-group's
// range is written (the flag table calls it with the flag's name).
void check_shard_group(const std::string& spec, std::string_view flag = "--shard-group");
// The replication groups of `shards`: member i of every shard group.
std::vector<std::vector<int>> replicate_groups(const std::vector<std::vector<int>>& shards);

class Mesh {
 public:
  // A mesh of one process: every group is a group of one.
  explicit Mesh(Device device = Device::cpu());
  // Collective over the world: the communicators of every group this rank is in, built with `options`
  // (members set per group). `shard_spec` as in shard_groups(); `host_levels`: also the host and cross groups
  // (hpZ, node-aware collectives). Groups of one get no communicator, except that with `comm_of_one` a world
  // of one rank gets one (and its shard and replication groups share it): the collectives' own code paths at
  // one rank, which a run of one otherwise never takes (--comm-backend named at one rank).
  Mesh(World& world, const CommOptions& options, const std::string& shard_spec, bool host_levels,
       bool comm_of_one = false);
  ~Mesh();
  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;

  const ProcessGroup& world() const { return world_; }
  const ProcessGroup& shard() const { return shard_; }
  const ProcessGroup& replicate() const { return replicate_; }
  const ProcessGroup& host() const { return host_; }    // with host_levels; else a group of one
  const ProcessGroup& cross() const { return cross_; }  // with host_levels; else a group of one
  const HostMap& hosts() const { return hosts_; }
  bool flat() const { return replicate_.size() == 1; }

 private:
  std::vector<std::unique_ptr<Communicator>> comms_;
  ProcessGroup world_, shard_, replicate_, host_, cross_;
  HostMap hosts_;
};

}  // namespace cz::dist
