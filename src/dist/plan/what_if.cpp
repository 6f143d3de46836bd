// Note [What-if step model]
// One training step per (stage, ranks), replayed on two timelines: the compute stream runs each op of the
// step (op_costs.h) for the time the compute table gives it; the communication stream runs one collective at
// a time, in the order they are issued, each for the time the ring cost model gives a buffer of its size
// (Note [Ring cost model]) on the first `ranks` ranks of the topology's ring. What decides the overlap is the
// engine's own schedule (Note [ZeRO step], Note [Stage-3 units], Note [Overlapped parameter all-gather]):
//  * backward: a partition's reduction (all-reduce at stage 0, reduce-scatter at 1-3; stages 0-1 on the last
//    micro-step only) is issued when the backward op completing its last gradient ends, so later buckets'
//    reductions run while earlier layers' backward computes; a third collective in flight makes the compute
//    stream wait for the oldest; the end of backward waits for all;
//  * stage 3: a unit is gathered before its forward and again before its backward; the next --prefetch units
//    (the previous ones in backward) are gathered ahead, so their all-gathers overlap the unit's compute;
//  * stages 1-2: the all-gathers of the updated parameters are issued after the optimizer and the next
//    forward waits module by module, so they overlap the next forward: in the steady state the step begins
//    with them queued;
//  * the step: the mean loss and (stages 1-3) the global norm are all-reduced, then the optimizer runs over
//    this rank's shard; under --offload-optimizer a host worker takes each partition's chunk as its reduction
//    ends (a copy over the GPU's share of its PCIe path to the CPU, then the CPU update) and the step waits
//    for the worker, then copies the updated chunks back.
// The steady state is modelled (stage 3 prefetching, the caches warm). On GPUs compute and communication do
// not slow each other down (NCCL's kernels take a few SMs; PCIe is not shared with the copies of offload);
// CPU ranks do (Note [CPU ranks pay for their messages]).
//
// Note [CPU ranks pay for their messages]: a CPU rank's communication thread runs on the cores its compute
// uses. Every byte it sends and receives costs core time in the network stack (TCP over the NIC) or in
// shared-memory copies (two ranks of one host), and every partial sum it receives is added; on the test bed
// of hosts, where 4 ranks share 2 cores, that made steps 25-50% longer than the link time and the compute
// predicted (docs/planning.md). A compute table may give these costs as rates per rank on its share of the
// cores (comm_cpu: network, shared memory, reduction; bench/hosts_mesh.py measures them with commbench on
// the machine). A collective then costs each rank of a ring
//     (sent / rate(hop to the next rank) + received / rate(hop from the previous)) / 2 + reduced / rate
// of core time (each rate counts a byte's send and its receive, so half each side), its slowest rank's.
// The collective takes at least that long, and the same time is owed by the compute stream, which shares
// the cores: the debt is paid by the next op, or by time the compute stream spends waiting anyway (the
// communication thread then has the cores to itself). Each ring step also has a fixed time (step_us: waking
// the communication thread, MPI's matching, the receiver's turn on a shared core), measured from a small
// collective; it lengthens the collective, not the compute. Stage 3 issues three collectives per unit, so
// it shows most where units are small: on the bed's 2 x 2 CPU ranks ~0.2-0.4 ms a step against the 2 us of
// a GPU ring. Without comm_cpu, or on GPUs, messages cost no compute.
//
// Note [What-if on a mesh]: a collective of the mesh (Note [2-D mesh]) runs on every group of its level at
// once, each group its own ring: every host's ranks (the host level), or the ranks with the same index on
// every host (the cross level, whose R rings all cross the hosts' network links, so each link carries R hops
// per direction; predict_rings sums the hops of all rings on each link). Each communicator has its own
// timeline, one collective at a time, as its communication thread (or stream) runs them:
//  * flat: one ring over the world;
//  * --comm-impl hier: the world's collectives in two levels on the world communicator's one timeline: an
//    all-reduce is a reduce-scatter inside each host, an all-reduce of the 1/R shard across hosts and an
//    all-gather inside the host; a reduce-scatter stops after the cross-host reduce-scatter of the shard; an
//    all-gather is the reverse;
//  * --shard-group host (HSDP): the state is sharded over each host's ranks; a bucket is reduce-scattered on
//    the shard (host) communicator and its chunk then all-reduced on the replication (cross) communicator,
//    two timelines, so the next bucket's reduce-scatter overlaps this one's all-reduce; gathers stay inside
//    the host; the global norm is reduced over the shard group;
//  * --hpz (stage 3): forward gathers over the world, backward gathers inside the host (the secondary copy).
// The bytes a host sends to other hosts in a step are counted hop by hop: what the veth counters of the test
// bed see (bench/hosts_mesh.py).
#include "dist/plan/what_if.h"

#include <algorithm>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/comm/mesh.h"
#include "dist/comm/quant.h"
#include "dist/plan/planner.h"
#include "dist/plan/zero_memory.h"
#include "dist/zero/engine.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/step_plan.h"
#include "tensor/check.h"
#include "tensor/device.h"

namespace cz::plan {

dist::Topology first_ranks(const dist::Topology& t, int ranks) {
  CZ_CHECK(ranks >= 1 && ranks <= t.num_ranks(), "what-if: {} ranks on a topology of {}", ranks,
           t.num_ranks());
  if (ranks == t.num_ranks()) return t;
  const std::vector<int> ring = t.ring_order();
  std::map<int, int> renumber;
  for (int i = 0; i < ranks; ++i) renumber[ring[size_t(i)]] = i;
  const auto& nodes = t.nodes();
  std::vector<bool> keep(nodes.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int r : nodes[i].ranks)
      if (renumber.count(r))
        for (int p = int(i); p >= 0 && !keep[size_t(p)]; p = nodes[size_t(p)].parent) keep[size_t(p)] = true;
  std::vector<int> index(nodes.size(), -1);
  std::vector<dist::TopoNode> out;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (keep[i]) {
      index[i] = int(out.size());
      dist::TopoNode n = nodes[i];
      n.ranks.clear();
      for (int r : nodes[i].ranks)
        if (renumber.count(r)) n.ranks.push_back(renumber.at(r));
      n.children.clear();
      out.push_back(std::move(n));
    }
  for (dist::TopoNode& n : out)
    if (n.parent >= 0) n.parent = index[size_t(n.parent)];
  return dist::Topology(std::move(out));
}

CommModel::CommModel(const dist::Topology& topology, int ranks)
    : ranks_(ranks), topology_(first_ranks(topology, ranks)), order_(topology_.ring_order()) {}

dist::RingPrediction CommModel::predict(dist::Collective kind, double bytes) const {
  return topology_.predict(order_, bytes, kind);
}

double CommModel::seconds(dist::Collective kind, double bytes) const {
  return ranks_ < 2 ? 0.0 : predict(kind, bytes).time_s;
}

std::vector<std::vector<int>> host_groups(const dist::Topology& t) {
  const auto& nodes = t.nodes();
  std::map<int, std::vector<int>> by_host;  // host node (or the rank's own node) -> ranks
  for (int r : t.ring_order()) {
    int h = t.node_of_rank(r);
    for (int p = h; p >= 0; p = nodes[size_t(p)].parent)
      if (nodes[size_t(p)].type == "host") h = p;
    by_host[h].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [h, ranks] : by_host) out.push_back(std::move(ranks));
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

using dist::Collective;

// Per GPU, to its CPU socket, when every GPU copies at once: the narrowest link on the way up, shared by the
// GPUs below it. The slowest GPU's figure.
double host_link_gbps(const dist::Topology& t) {
  const auto& nodes = t.nodes();
  std::vector<int> below(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!nodes[i].ranks.empty())
      for (int p = int(i); p >= 0; p = nodes[size_t(p)].parent)
        below[size_t(p)] += int(nodes[i].ranks.size());
  double slowest = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].ranks.empty()) continue;
    double best = 1e30;
    for (int p = int(i); p >= 0 && nodes[size_t(p)].type != "cpu" && nodes[size_t(p)].type != "host";
         p = nodes[size_t(p)].parent)
      if (nodes[size_t(p)].up_gbps > 0) best = std::min(best, nodes[size_t(p)].up_gbps / below[size_t(p)]);
    if (best < 1e30) slowest = slowest == 0 ? best : std::min(slowest, best);
  }
  return slowest;
}

// How the ranks communicate, from the flags (Note [What-if on a mesh]).
struct MeshSpec {
  bool shard_by_host = false;
  bool hpz = false;
  enum class Impl { flat, hier, automatic } impl = Impl::flat;
};

// The shard group is the world or a host's ranks (what_if_request in train/plan_request.h checks the flag).
MeshSpec mesh_spec(const RunSpec& run) {
  MeshSpec m{.shard_by_host = run.shard_group == "host", .hpz = run.zero.hpz};
  m.impl = run.world_algorithm == dist::Algorithm::hier        ? MeshSpec::Impl::hier
           : run.world_algorithm == dist::Algorithm::automatic ? MeshSpec::Impl::automatic
                                                               : MeshSpec::Impl::flat;
  return m;
}

struct Run {
  const RunSpec& spec;
  MeshSpec mesh;
  const std::vector<ModuleCost>& work;
  const ComputeTable& compute;
  DType ec, er;
  int64_t psi_params = 0;
};

// The groups of each mesh level on a topology's ranks, in ring order (Note [What-if on a mesh]).
struct Levels {
  const dist::Topology* topology = nullptr;
  std::vector<std::vector<int>> hosts, cross;
  int per_host = 1;  // ranks on every host (0: hosts differ)
};

Levels mesh_levels(const dist::Topology& t) {
  Levels lv;
  lv.topology = &t;
  lv.hosts = host_groups(t);
  lv.per_host = int(lv.hosts.front().size());
  for (const auto& h : lv.hosts)
    if (int(h.size()) != lv.per_host) lv.per_host = 0;
  if (lv.per_host > 0) lv.cross = dist::replicate_groups(lv.hosts);
  return lv;
}

// The timelines of one simulated step (Note [What-if on a mesh]): the compute stream's clock `t`, when each
// communicator is free, the bytes each host sends, and the core time CPU ranks owe their messages.
enum Lane { kWorld, kShard, kReplicate, kHost, kLanes };
enum class Level { world, hosts, cross };
struct StepClock {
  StepClock(const Run& run, const CommModel& comm, const Levels& lv, WhatIfRow& row,
            std::function<bool(Collective, double)> hier, int ranks_per_host)
      : run(run), comm(comm), lv(lv), row(row), hier(std::move(hier)), R(ranks_per_host) {
    host_sent.assign(lv.hosts.size(), 0);
    host_of.assign(size_t(comm.ranks()), 0);
    for (size_t h = 0; h < lv.hosts.size(); ++h)
      for (int r : lv.hosts[h]) host_of[size_t(r)] = int(h);
  }
  // One collective on every group of `level` at once, on lane `lane`, not before `at`: when it ends.
  double level_collective(Level level, Collective kind, double bytes, double at, Lane lane);
  // A collective of the world, flat or in two levels on the world communicator's lane.
  double world_collective(Collective kind, double bytes, double at);
  // The compute stream waits for what ends at `until`.
  void wait_for(double until);
  // The compute stream runs `op` (after the core time it owes the communication thread).
  void run_op(const OpCost& op);

  const Run& run;
  const CommModel& comm;
  const Levels& lv;
  WhatIfRow& row;
  std::function<bool(Collective, double)> hier;  // whether the world's call of `bytes` takes two levels
  int R;                                         // ranks per host
  double t = 0;
  double comm_free[kLanes] = {0, 0, 0, 0};
  std::vector<double> host_sent;  // per host
  std::vector<int> host_of;       // per rank
  double cpu_debt = 0;            // core time the compute stream owes the communication thread
};

double StepClock::level_collective(Level level, Collective kind, double bytes, double at, Lane lane) {
  const ComputeTable::CommCpu& cpu_cost = run.compute.comm_cpu;
  const std::vector<std::vector<int>>& rings = level == Level::hosts ? lv.hosts
                                               : level == Level::cross
                                                   ? lv.cross
                                                   : std::vector<std::vector<int>>{comm.order()};
  double d = 0;
  if (level == Level::world)
    d = comm.seconds(kind, bytes);
  else
    d = lv.topology->predict_rings(rings, bytes, kind).time_s;
  const int g = int(rings.front().size());
  if (g > 1) {
    const int steps = kind == Collective::all_reduce ? 2 * (g - 1) : g - 1;
    const double moved = steps * bytes / g;
    const double reduced = kind == Collective::all_gather ? 0 : (g - 1) * bytes / g;
    row.comm_bytes += int64_t(moved);
    double cpu = 0;  // Note [CPU ranks pay for their messages]: the slowest rank's core time
    for (const auto& ring : rings)
      for (size_t i = 0; i < ring.size(); ++i) {
        const int a = ring[i], next = ring[(i + 1) % ring.size()], prev = ring[(i + g - 1) % ring.size()];
        const bool out_net = host_of[size_t(a)] != host_of[size_t(next)];
        const bool in_net = host_of[size_t(a)] != host_of[size_t(prev)];
        if (out_net) host_sent[size_t(host_of[size_t(a)])] += moved;
        if (cpu_cost.any())
          cpu = std::max(cpu, moved / 2 / (out_net ? cpu_cost.network_bytes : cpu_cost.shared_bytes) +
                                  moved / 2 / (in_net ? cpu_cost.network_bytes : cpu_cost.shared_bytes) +
                                  reduced / cpu_cost.reduce_bytes);
      }
    d = std::max(d, cpu) + steps * cpu_cost.step_s;
    cpu_debt += cpu;
  }
  const double start = std::max(at, comm_free[lane]);
  comm_free[lane] = start + d;
  row.comm_s += d;
  return comm_free[lane];
}

double StepClock::world_collective(Collective kind, double bytes, double at) {
  if (!hier(kind, bytes)) return level_collective(Level::world, kind, bytes, at, kWorld);
  switch (kind) {
    case Collective::all_reduce:
      at = level_collective(Level::hosts, Collective::reduce_scatter, bytes, at, kWorld);
      at = level_collective(Level::cross, Collective::all_reduce, bytes / R, at, kWorld);
      return level_collective(Level::hosts, Collective::all_gather, bytes, at, kWorld);
    case Collective::reduce_scatter:
      at = level_collective(Level::hosts, Collective::reduce_scatter, bytes, at, kWorld);
      return level_collective(Level::cross, Collective::reduce_scatter, bytes / R, at, kWorld);
    default:
      at = level_collective(Level::cross, Collective::all_gather, bytes / R, at, kWorld);
      return level_collective(Level::hosts, Collective::all_gather, bytes, at, kWorld);
  }
}

void StepClock::wait_for(double until) {
  if (until > t) {
    row.comm_wait_s += until - t;
    cpu_debt -= std::min(cpu_debt, until - t);
    t = until;
  }
}

void StepClock::run_op(const OpCost& op) {
  const double s = run.compute.seconds(op);
  t += s + cpu_debt;
  row.compute_s += s;
  row.comm_cpu_s += cpu_debt;
  cpu_debt = 0;
}

// Whether a world collective of `bytes` takes two levels: across hosts of several ranks, always with hier,
// per call with auto where the communicator's own model says (Note [Two-level cost model]).
std::function<bool(Collective, double)> two_level_rule(const MeshSpec& mesh, const CommModel& comm,
                                                       const Levels& lv) {
  const bool two_levels = mesh.impl != MeshSpec::Impl::flat && lv.hosts.size() > 1 && lv.per_host > 1;
  return [two_levels, impl = mesh.impl, &comm, &lv](Collective kind, double bytes) {
    if (!two_levels) return false;
    if (impl == MeshSpec::Impl::hier) return true;
    return lv.topology->predict_two_level(comm.order(), lv.hosts, bytes, kind).hier_faster();
  };
}

// Note [Step plan]: the engine's plan for this stage on this mesh (HSDP: shard groups of a host's ranks).
zero::StepPlan plan_at(const Run& run, int stage, int n, const Levels& lv) {
  const MeshSpec& mesh = run.mesh;
  CZ_CHECK(!(mesh.shard_by_host || mesh.hpz || mesh.impl == MeshSpec::Impl::hier) || lv.hosts.size() < 2 ||
               lv.per_host > 0,
           "--what-if: HSDP, hpZ and two-level collectives need the same number of ranks on every host");
  zero::ZeroConfig zc = run.spec.zero;
  zc.device = parse_device(run.spec.device);
  zc.stage = stage;
  return zero::make_step_plan(zc, {.world = n,
                                   .shard_group = mesh.shard_by_host ? std::max(lv.per_host, 1) : 0,
                                   .hosts = int(lv.hosts.size()),
                                   .ranks_per_host = lv.per_host,
                                   .flat_impl = mesh.impl == MeshSpec::Impl::flat});
}

// One simulated step (Note [What-if step model]): the step's schedules (Note [Step plan]) driven from the
// same points as the engine's hooks, their events carried out on the timelines of a StepClock. Stage 3's
// units in the steady state: the unit order recorded (ConvNeXt's units run in partition order). Stages 1-2:
// each work module (a unit) waits for the partitions holding its parameters.
class SimulatedStep final : zero::ReduceSchedule::Sink, zero::UnitSchedule::Sink, zero::ChunkSchedule::Sink {
 public:
  SimulatedStep(const Run& run, const zero::StepPlan& plan, const CommModel& comm, const Levels& lv,
                double host_link, WhatIfRow& row);
  // Gradients zeroed, the micro-steps' forwards and backwards, then the update.
  void run();

 private:
  // ReduceSchedule::Sink: a partition's gradients reduced, as plan_.reduce_kind() says.
  void prepare(size_t) override {}
  void launch(size_t p) override;
  void finish(size_t p) override;
  // UnitSchedule::Sink (stage 3): when each unit's gather ends.
  void gather(size_t u) override;
  void use(size_t u) override { clock_.wait_for(resident_[u]); }
  void release(size_t u) override { resident_[u] = -1; }
  // ChunkSchedule::Sink (stages 1-2): the previous step's gathers, launched after its update (quantized,
  // decoded at once on the training thread), waited for at each unit's forward.
  void gather_partition(size_t p) override;
  void use_partition(size_t p) override { clock_.wait_for(param_gather_[p]); }

  // The engine's collectives: a bucket's reduction (unquantized), a parameter gather (backward: stage 3's
  // second gather of a unit) of StepPlan::gather_bytes (the encode and decode passes, at memory speed, are
  // not charged).
  double reduce(double bytes, double at);
  double param_gather(size_t p, double at, bool backward);
  void update();

  const Run& run_;
  const zero::StepPlan& plan_;
  WhatIfRow& row_;
  const int n_, R_;
  const bool hsdp_;  // the state sharded over each host's ranks
  const double host_link_;
  StepClock clock_;
  const std::vector<nn::ParamInfo> params_;
  const zero::ZeroLayout L_;
  std::map<std::string, size_t> param_of_;
  std::vector<size_t> unit_of_work_;    // stage 3: the unit (partition) of each work module
  std::vector<size_t> chunks_of_work_;  // stages 1-2: the unit whose partitions each work module waits for
  zero::StepSchedule schedule_;
  std::vector<double> param_gather_, resident_, reduced_;
  double worker_free_ = 0;  // offload: when the host worker is free
};

SimulatedStep::SimulatedStep(const Run& run, const zero::StepPlan& plan, const CommModel& comm,
                             const Levels& lv, double host_link, WhatIfRow& row)
    : run_(run),
      plan_(plan),
      row_(row),
      n_(comm.ranks()),
      R_(lv.per_host > 0 ? lv.per_host : 1),
      hsdp_(plan.shards() < n_),
      host_link_(host_link),
      clock_(run, comm, lv, row, two_level_rule(run.mesh, comm, lv), R_),
      params_(nn::convnext_parameters(run.spec.model)),
      L_(zero_layout(params_, plan)),
      schedule_(plan, L_, run.spec.zero.prefetch, nn::convnext_units(run.spec.model)) {
  const size_t np = L_.partitions.size();
  std::map<std::string, size_t> first_part;  // of each unit
  for (size_t p = np; p-- > 0;)
    for (size_t i = L_.partitions[p].first_param; i < L_.partitions[p].end_param; ++i) {
      param_of_[params_[i].name] = i;
      first_part[params_[i].unit] = p;
    }
  const std::vector<std::string> units = nn::convnext_units(run.spec.model);
  std::map<std::string, size_t> unit_index;
  for (size_t u = 0; u < units.size(); ++u) unit_index[units[u]] = u;
  for (const ModuleCost& m : run.work) {
    unit_of_work_.push_back(first_part.at(m.module));
    chunks_of_work_.push_back(unit_index.at(m.module));
  }
  std::vector<size_t> order(np);
  for (size_t u = 0; u < np; ++u) order[u] = u;
  schedule_.assume_unit_order(order);
  param_gather_.assign(np, 0);
  resident_.assign(np, -1);
  reduced_.assign(np, 0);
  schedule_.bind(this, this, this);
}

double SimulatedStep::reduce(double bytes, double at) {
  if (!plan_.sharded()) return clock_.world_collective(Collective::all_reduce, bytes, at);
  if (!hsdp_) return clock_.world_collective(Collective::reduce_scatter, bytes, at);
  at = clock_.level_collective(Level::hosts, Collective::reduce_scatter, bytes, at, kShard);
  return clock_.level_collective(Level::cross, Collective::all_reduce, bytes / R_, at, kReplicate);
}

double SimulatedStep::param_gather(size_t p, double at, bool backward) {
  const double bytes = double(plan_.gather_bytes(L_, p, backward));
  if (hsdp_) return clock_.level_collective(Level::hosts, Collective::all_gather, bytes, at, kShard);
  if (plan_.host_local_gather(backward))
    return clock_.level_collective(Level::hosts, Collective::all_gather, bytes, at, kHost);
  return clock_.world_collective(Collective::all_gather, bytes, at);
}

void SimulatedStep::gather(size_t u) {
  const bool backward = schedule_.in_backward();
  resident_[u] = n_ > 1 ? param_gather(u, clock_.t, backward) : clock_.t;
}

void SimulatedStep::gather_partition(size_t p) {
  param_gather_[p] = n_ > 1 ? param_gather(p, 0, false) : 0;
}

// --reduce-dtype int8 (Note [Quantized reduction]): an all-to-all of N records, timed as a ring
// reduce-scatter of as many bytes (each rank sends N - 1 records either way); at stage 0 two of them (Note
// [Quantized all-reduce]), timed as a ring all-reduce of N records. Note [Two-hop quantized reduction]: (R -
// 1) messages of H records inside the host, then H - 1 records across hosts: ring reduce-scatters of as many
// bytes per rank on the host and cross groups. Note [Two-hop quantized all-reduce]: the two hops, then the
// owners' records across hosts (H records in all) and inside the host (N records in all), as ring
// all-gathers.
void SimulatedStep::launch(size_t p) {
  const int64_t qb = plan_.quant_block(), shards = plan_.shards();
  const zero::ReduceKind kind = plan_.reduce_kind();
  const bool all =
      kind == zero::ReduceKind::quantized_all_reduce || kind == zero::ReduceKind::two_hop_all_reduce;
  const bool scatter =
      kind == zero::ReduceKind::quantized_reduce_scatter || kind == zero::ReduceKind::two_hop_reduce_scatter;
  const double rec = all       ? double(dist::quant_packed_bytes(L_.partitions[p].numel / shards, qb))
                     : scatter ? double(dist::quant_packed_bytes(L_.chunk(p), qb))
                               : 0;
  const double bytes =
      all || scatter ? double(shards) * rec : double(L_.partitions[p].numel) * double(dtype_size(run_.er));
  const double cross = double(n_ / R_) * rec;  // H records
  if (n_ <= 1) {
    reduced_[p] = clock_.t;
  } else if (kind == zero::ReduceKind::two_hop_reduce_scatter) {
    const double at =
        clock_.level_collective(Level::hosts, Collective::reduce_scatter, bytes, clock_.t, kWorld);
    reduced_[p] = clock_.level_collective(Level::cross, Collective::reduce_scatter, cross, at, kWorld);
  } else if (kind == zero::ReduceKind::two_hop_all_reduce) {
    double at = clock_.level_collective(Level::hosts, Collective::reduce_scatter, bytes, clock_.t, kWorld);
    at = clock_.level_collective(Level::cross, Collective::reduce_scatter, cross, at, kWorld);
    at = clock_.level_collective(Level::cross, Collective::all_gather, cross, at, kWorld);
    reduced_[p] = clock_.level_collective(Level::hosts, Collective::all_gather, bytes, at, kWorld);
  } else {
    reduced_[p] = reduce(bytes, clock_.t);
  }
}

// The oldest reduction waited for; under offload its chunk goes to the host worker: copied, then updated.
void SimulatedStep::finish(size_t p) {
  clock_.wait_for(reduced_[p]);
  if (!plan_.offload()) return;
  const double chunk = double(L_.chunk(p));
  const double copy = chunk * 4 / (host_link_ * 1e9), update = chunk * 28 / run_.compute.host_bytes;
  worker_free_ = std::max(worker_free_, reduced_[p]) + copy + update;
}

void SimulatedStep::run() {
  schedule_.after_update();  // the previous step's
  // Gradients back to zero: the full buffer's fill on CUDA (on the CPU nothing fills it: Note [Deferred
  // gradient zero]), else the fp32 chunks'.
  if (!plan_.full_grads())
    clock_.run_op(zero_grad_work(L_.shard_numel() * 4));
  else if (plan_.config().device.is_cuda())
    clock_.run_op(zero_grad_work(int64_t(double(L_.flat.numel) * double(dtype_size(run_.ec)))));
  const std::vector<ModuleCost>& work = run_.work;
  const int64_t micro_steps = run_.spec.grad_accum;
  for (int64_t a = 0; a < micro_steps; ++a) {
    for (size_t m = 0; m < work.size(); ++m) {
      schedule_.unit_forward_pre(unit_of_work_[m]);
      schedule_.unit_forward_pre_chunks(chunks_of_work_[m]);
      for (const OpCost& op : work[m].forward) clock_.run_op(op);
      schedule_.unit_forward_post(unit_of_work_[m]);
    }
    schedule_.begin_backward(a + 1 == micro_steps);
    for (size_t m = work.size(); m-- > 0;) {
      schedule_.unit_backward_pre(unit_of_work_[m]);
      for (const OpCost& op : work[m].backward) {
        clock_.run_op(op);
        for (const std::string& g : op.grads) schedule_.grad_ready(param_of_.at(g));
      }
    }
    schedule_.end_backward(true);
  }
  update();
}

// The step: the mean loss, the global norm (stages 1-3), the optimizer over this rank's shard.
void SimulatedStep::update() {
  StepClock& c = clock_;
  if (n_ > 1) c.wait_for(c.world_collective(Collective::all_reduce, 8, c.t));
  if (n_ > 1 && plan_.sharded())
    c.wait_for(hsdp_ ? c.level_collective(Level::hosts, Collective::all_reduce, 8, c.t, kShard)
                     : c.world_collective(Collective::all_reduce, 8, c.t));
  if (plan_.offload()) {
    const double before = c.t;
    const double copy = double(L_.shard_numel()) * double(dtype_size(run_.ec)) / (host_link_ * 1e9);
    c.t = std::max(c.t, worker_free_) + copy;
    row_.host_wait_s = c.t - before;
  } else {
    c.run_op(optimizer_work(L_.shard_numel(), plan_.mixed()));
  }
  row_.comm_cpu_s += c.cpu_debt;
  c.t += c.cpu_debt;
  row_.step_s = c.t;
  for (double b : c.host_sent) row_.cross_host_bytes = std::max(row_.cross_host_bytes, int64_t(b));
  row_.img_per_s = double(run_.spec.micro_batch * run_.spec.grad_accum * n_) / c.t;
}

// Note [What-if step model] for one stage and rank count.
WhatIfRow simulate(const Run& run, int stage, const CommModel& comm, const Levels& lv, double host_link) {
  const zero::StepPlan plan = plan_at(run, stage, comm.ranks(), lv);
  WhatIfRow row;
  row.stage = stage;
  row.ranks = comm.ranks();
  SimulatedStep(run, plan, comm, lv, host_link, row).run();
  return row;
}

// The ring of the first `sub.num_ranks()` ranks of `topology`, numbered by their place on its whole ring, and
// its figures for the report: a 64 MiB reduce-scatter's and all-reduce's bus bandwidth, the host link.
WhatIfRing ring_of(const dist::Topology& topology, const CommModel& comm, const dist::Topology& sub) {
  WhatIfRing r;
  r.ranks = sub.num_ranks();
  const std::vector<int> ring = topology.ring_order();
  for (int i : comm.order()) r.order.push_back(r.ranks == topology.num_ranks() ? i : ring[size_t(i)]);
  if (r.ranks > 1) {
    constexpr double kBytes = 64.0 * 1024 * 1024;
    const dist::RingPrediction rs = comm.predict(Collective::reduce_scatter, kBytes);
    r.bottleneck = rs.bottleneck;
    r.reduce_scatter_busbw_gbps = rs.busbw_gbps;
    r.all_reduce_busbw_gbps = comm.predict(Collective::all_reduce, kBytes).busbw_gbps;
  }
  r.host_link_gbps = host_link_gbps(sub);
  return r;
}

// The memory plan's request for a row: the run at `stage` on `k` ranks of the topology's hosts.
PlanRequest row_request(const RunSpec& run, int stage, int k, const Levels& levels,
                        std::optional<int64_t> gpu_mem) {
  PlanRequest pr;
  pr.run = run;
  zero::ZeroConfig& z = pr.run.zero;
  z.stage = stage;
  // hpZ is stage 3's across hosts: its other rows are plain stages.
  if (!zero::stage_rules(stage).unit_gathers || levels.hosts.size() < 2) z.hpz = false;
  // Quantized communication is stages 1-3's (stage 0 gathers nothing, and all-reduces): its stage-0 row is
  // the unquantized run, as simulate() times it.
  if (!zero::stage_rules(stage).sharded) {
    z.gather_dtype = z.reduce_dtype = DType::f32;
    z.reduce_int8 = false;
  }
  pr.world = k;
  pr.ranks_per_host = levels.hosts.size() > 1 ? levels.per_host : 0;
  pr.gpu_mem = gpu_mem;
  pr.max_micro_batch = false;
  return pr;
}

}  // namespace

WhatIf what_if(const WhatIfRequest& req) {
  const RunSpec& spec = req.run;
  const DType ec = spec.compute, er = spec.zero.reduce_dtype;
  const nn::ConvNeXtConfig& mc = spec.model;
  std::vector<int> ranks = req.ranks;
  const int total = req.topology.num_ranks();
  if (ranks.empty()) {
    for (int k = 1; k < total; k *= 2) ranks.push_back(k);
    ranks.push_back(total);
  }
  for (int k : ranks)
    CZ_CHECK(k >= 1 && k <= total, "--what-if: {} ranks, but the topology has {}", k, total);

  WhatIf w;
  w.model = mc.name;
  w.precision = spec.precision;
  w.device = parse_device(spec.device).is_cuda() ? "cuda" : "cpu";
  w.device_reason = req.device_reason;
  w.compute_provenance = req.compute.provenance;
  w.compute_device = req.compute.device;
  w.image_size = spec.image_size;
  w.micro_batch = spec.micro_batch;
  w.grad_accum = spec.grad_accum;
  w.checkpointing = spec.checkpointing;
  w.offload = spec.zero.offload;

  const std::vector<ModuleCost> work = step_work(*nn::convnext_spec(mc), spec.image_size, spec.micro_batch,
                                                 ec, spec.checkpointing, parse_device(spec.device).is_cuda());
  const Run run{spec, mesh_spec(spec), work, req.compute, ec, er};
  std::map<int, double> one_rank;  // img/s on one rank, per stage
  for (int k : ranks) {
    const CommModel comm(req.topology, k);
    const dist::Topology sub = first_ranks(req.topology, k);
    const Levels levels = mesh_levels(sub);
    const WhatIfRing r = ring_of(req.topology, comm, sub);
    CZ_CHECK(!spec.zero.offload || r.host_link_gbps > 0,
             "--what-if: --offload-optimizer needs up_gbps on the links from the GPUs to their CPU");
    w.rings.push_back(r);
    for (int stage : req.stages) {
      WhatIfRow row = simulate(run, stage, comm, levels, r.host_link_gbps);
      if (k == 1) one_rank[stage] = row.img_per_s;
      if (one_rank.count(stage)) row.scaling = row.img_per_s / (double(k) * one_rank.at(stage));
      if (!req.memory) {
        w.rows.push_back(row);
        continue;
      }
      const Plan p = make_plan(row_request(spec, stage, k, levels, req.gpu_mem));
      row.memory_bytes = p.required_bytes;
      row.fits = p.fits;
      w.rows.push_back(row);
    }
  }
  return w;
}

std::string format_what_if(const WhatIf& w) {
  std::string out = fmt::format(
      "What-if: {} at {}x{} px, micro-batch {} x {} micro-step{} per rank, {}, activation checkpointing {}, "
      "optimizer offload {}\n",
      w.model, w.image_size, w.image_size, w.micro_batch, w.grad_accum, w.grad_accum == 1 ? "" : "s",
      w.precision, w.checkpointing ? "on" : "off", w.offload ? "on" : "off");
  if (!w.device_reason.empty())
    out += fmt::format("Memory planned for the {} backend: {}.\n", w.device == "cuda" ? "CUDA" : "CPU",
                       w.device_reason);
  out += fmt::format("Compute: {}\n", w.compute_provenance);
  out += "Communication: the ring cost model (Note [Ring cost model]) on the first N ranks of the ring:\n";
  for (const WhatIfRing& r : w.rings) {
    if (r.ranks == 1) continue;
    out += fmt::format(
        "  {} ranks: ring {}; 64 MiB reduce-scatter {:.2f} GB/s bus, all-reduce {:.2f} GB/s bus ({}); to the "
        "host {:.1f} GB/s per GPU\n",
        r.ranks, fmt::join(r.order, " "), r.reduce_scatter_busbw_gbps, r.all_reduce_busbw_gbps, r.bottleneck,
        r.host_link_gbps);
  }
  out += fmt::format("\n  {:>5} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>12} {:>5}\n", "stage",
                     "ranks", "step ms", "compute ms", "comm ms", "exposed ms", "host ms", "img/s", "scaling",
                     "memory/GPU", "fits");
  for (const WhatIfRow& r : w.rows)
    out += fmt::format(
        "  {:>5} {:>5} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>9.1f} {:>7.0f}% {:>8.2f} GiB "
        "{:>5}\n",
        r.stage, r.ranks, 1e3 * r.step_s, 1e3 * r.compute_s, 1e3 * r.comm_s, 1e3 * r.comm_wait_s,
        1e3 * r.host_wait_s, r.img_per_s, 100 * r.scaling, double(r.memory_bytes) / double(int64_t(1) << 30),
        r.fits ? (*r.fits ? "yes" : "NO") : "-");
  out +=
      "\nPlanned figures (Note [What-if step model]): exposed = the time the compute stream waited for "
      "collectives; memory/GPU is the planner's required bytes.\n";
  return out;
}

nlohmann::json what_if_to_json(const WhatIf& w) {
  nlohmann::json j = {{"model", w.model},
                      {"precision", w.precision},
                      {"device", w.device},
                      {"device_reason", w.device_reason},
                      {"image_size", w.image_size},
                      {"micro_batch", w.micro_batch},
                      {"grad_accum", w.grad_accum},
                      {"activation_checkpointing", w.checkpointing},
                      {"offload_optimizer", w.offload},
                      {"compute", {{"device", w.compute_device}, {"provenance", w.compute_provenance}}}};
  nlohmann::json rings = nlohmann::json::array();
  for (const WhatIfRing& r : w.rings)
    rings.push_back({{"ranks", r.ranks},
                     {"ring", r.order},
                     {"bottleneck", r.bottleneck},
                     {"reduce_scatter_busbw_gbps", r.reduce_scatter_busbw_gbps},
                     {"all_reduce_busbw_gbps", r.all_reduce_busbw_gbps},
                     {"host_link_gbps", r.host_link_gbps}});
  j["rings"] = rings;
  nlohmann::json rows = nlohmann::json::array();
  for (const WhatIfRow& r : w.rows)
    rows.push_back({{"stage", r.stage},
                    {"ranks", r.ranks},
                    {"step_s", r.step_s},
                    {"compute_s", r.compute_s},
                    {"comm_s", r.comm_s},
                    {"comm_exposed_s", r.comm_wait_s},
                    {"host_wait_s", r.host_wait_s},
                    {"comm_cpu_s", r.comm_cpu_s},
                    {"img_per_s", r.img_per_s},
                    {"scaling", r.scaling},
                    {"comm_bytes", r.comm_bytes},
                    {"cross_host_bytes", r.cross_host_bytes},
                    {"memory_bytes", r.memory_bytes},
                    {"fits", r.fits ? nlohmann::json(*r.fits) : nlohmann::json()}});
  j["rows"] = rows;
  return j;
}

}  // namespace cz::plan
