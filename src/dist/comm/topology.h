// A machine's communication topology as a tree (hosts, CPU sockets, PCIe switches, GPUs and CPU ranks), its
// JSON form, the ring order derived from it, and a link-load cost model that predicts a ring's bandwidth.
//
// JSON: {"nodes": [{"id": "host0", "type": "host", "up_gbps": 12.5},
//                  {"id": "cpu0", "type": "cpu", "parent": "host0", "up_gbps": 20},
//                  {"id": "sw0", "type": "switch", "parent": "cpu0", "up_gbps": 24},
//                  {"id": "gpu0", "type": "gpu", "parent": "sw0", "up_gbps": 24, "rank": 0}, ...]}
// `up_gbps` is the bandwidth in GB/s per direction of the link to the parent (for a host: its network link).
// Ranks sit on nodes ("rank": r, or "ranks": [...] when several share one, e.g. CPU ranks or a shared GPU).
// Other fields (busid, numa, name, ...) are kept as they are.
//
// Note [Ring order]: the ring visits ranks in a depth-first walk of the tree (children ordered by their
// lowest rank). A ring along a depth-first walk is an Euler tour of the tree, so every link carries exactly
// one ring hop in each direction: a socket link or a switch uplink is crossed once per direction, however the
// ranks are numbered. Rank order on a box whose ranks alternate between sockets crosses the socket link at
// every hop.
//
// Note [Ring cost model]: a ring step moves one chunk (bytes / n) over every hop at once. Each hop loads
// every link on its tree path (up the links from the sender to the common ancestor, down to the receiver); a
// link's time is its load in the busier direction times chunk / up_gbps; a step takes as long as the slowest
// link plus a latency (a fixed step overhead plus a per-link latency along the longest hop). Reduce-scatter
// and all-gather take n-1 steps, all-reduce 2(n-1). Bus bandwidth is reported as nccl-tests defines it.
//
// Note [Two-level cost model]: a two-level collective (Note [Two-level collectives]) on H hosts of R ranks is
// a sequence of phases, each a set of rings running at once: the R-rank rings inside every host on the whole
// buffer, and the H-rank cross rings (one per local index, all R of them sharing each host's network link)
// on a 1/R share. Links loaded by several rings of a phase add their hops, so R cross rings put R hops on a
// host's uplink in each direction where the flat ring (Note [Ring order]) puts one; but the flat ring moves
// chunks of bytes / (H R) in 2(HR-1) steps, the cross rings chunks of bytes / (H R) in 2(H-1) steps (for
// all-reduce; half as many for reduce-scatter and all-gather). So a host's network carries 2(H-1)/H of the
// buffer instead of 2(HR-1)/(HR) (2/3 of it at 2 x 2), and the step count that pays the network's latency
// falls from 2(HR-1) to 2(H-1); in exchange the buffer crosses the host's own links twice more. The phases'
// times add up (each depends on the one before; the pieces of Note [Two-level pipeline] overlap them, so
// this errs towards the flat ring). The local pack copy of reduce-scatter and all-gather is not modelled.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "dist/comm/types.h"

namespace cz::dist {

struct TopoNode {
  std::string id;
  std::string type;  // host, cpu, switch, gpu, proc (a CPU rank), or anything else
  int parent = -1;   // index into Topology::nodes()
  double up_gbps = 0;
  std::vector<int> ranks;
  std::vector<int> children;
  nlohmann::ordered_json extra;  // the other JSON fields, written back unchanged
};

struct CostModel {
  double step_overhead_us = 2.0;  // per ring step
  double link_latency_us = 0.5;   // per link on the longest hop
};

struct RingPrediction {
  double time_s = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  int max_link_load = 0;   // ring hops on the busiest link, in its busier direction
  std::string bottleneck;  // "cpu0 (up 20 GB/s, 4 hops)"
};

// Ring hops crossing one node's uplink, per direction.
struct LinkLoad {
  int node = -1;
  int up = 0;    // child -> parent
  int down = 0;  // parent -> child
};

// A flat ring against a two-level collective over `host_groups` (Note [Two-level cost model]).
struct TwoLevelPrediction {
  double flat_s = 0, hier_s = 0;
  bool hier_faster() const { return hier_s < flat_s; }
  // "hier: predicted 0.91 ms against 1.20 ms for the flat ring (all_reduce of 4194304 bytes, 2 hosts x 2
  // ranks; flat ring bottleneck: ..., cross-host bottleneck: ...)"
  std::string reason;
};

class Topology {
 public:
  // Validates: unique ids, known parents, no cycles, ranks 0..R-1 each placed exactly once. Throws ValueError
  // (IoError for unreadable files) naming the problem.
  static Topology from_json(const nlohmann::json& j);
  static Topology load(const std::string& path);
  Topology() = default;
  explicit Topology(std::vector<TopoNode> nodes);  // parents and ranks set; children are derived

  nlohmann::ordered_json to_json() const;
  std::string to_json_string() const;  // one node per line

  const std::vector<TopoNode>& nodes() const { return nodes_; }
  int num_ranks() const { return num_ranks_; }
  int node_of_rank(int rank) const { return rank_node_.at(size_t(rank)); }
  int find(const std::string& id) const;  // -1 when absent

  std::vector<int> ring_order() const;  // Note [Ring order]
  // Tree links on the path of each hop of the ring `order` (order[i] -> order[i+1], cyclically).
  std::vector<LinkLoad> link_loads(const std::vector<int>& order) const;
  // Note [Ring cost model]; `kind` is reduce_scatter, all_gather or all_reduce; `bytes` the buffer size.
  RingPrediction predict(const std::vector<int>& order, double bytes,
                         Collective kind = Collective::reduce_scatter, const CostModel& model = {}) const;
  // Rings that run at once, each over `bytes` (their link loads add up); any subsets of the ranks.
  // Note [Two-level cost model]: `order` is the world's ring, `host_groups` the ranks of each host (equal
  // sizes), `kind` all_reduce, reduce_scatter or all_gather.
  TwoLevelPrediction predict_two_level(const std::vector<int>& order,
                                       const std::vector<std::vector<int>>& host_groups, double bytes,
                                       Collective kind, const CostModel& model = {}) const;
  RingPrediction predict_rings(const std::vector<std::vector<int>>& rings, double bytes, Collective kind,
                               const CostModel& model = {}) const;
  // The ring `order` restricted to `ranks`, in ring order (what a group's communicator visits).
  std::vector<int> restrict_ring(const std::vector<int>& order, const std::vector<int>& ranks) const;

 private:
  void index();
  // Links (child node indices) from node a up to the common ancestor, and from it down to node b.
  void path(int a, int b, std::vector<int>& up, std::vector<int>& down) const;

  std::vector<TopoNode> nodes_;
  std::vector<int> rank_node_;
  int num_ranks_ = 0;
};

}  // namespace cz::dist
