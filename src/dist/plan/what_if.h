// The what-if model behind `convnext_zero --plan --what-if TOPO.json [--compute-table FILE]`: for a machine
// described by a topology file (src/dist/comm/topology.h) and a table of op rates (compute_table.h), the
// step time, img/s and memory per GPU of the run the flags describe, at each ZeRO stage and rank count
// (Note [What-if step model] in what_if.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm/topology.h"
#include "dist/plan/compute_table.h"
#include "dist/plan/run_spec.h"

namespace cz::plan {

// The ring cost model (Note [Ring cost model]) on the first `ranks` ranks of a topology's ring order: the
// sub-tree that holds them, ranks renumbered in that order (the whole topology when `ranks` is all of it).
class CommModel {
 public:
  CommModel(const dist::Topology& topology, int ranks);
  int ranks() const { return ranks_; }
  const std::vector<int>& order() const { return order_; }
  // One collective of `bytes` (the whole buffer); 0 on one rank.
  double seconds(dist::Collective kind, double bytes) const;
  dist::RingPrediction predict(dist::Collective kind, double bytes) const;

 private:
  int ranks_;
  dist::Topology topology_;
  std::vector<int> order_;
};

// The topology restricted to the first `ranks` ranks of its ring order (renumbered 0..ranks-1 in that order).
dist::Topology first_ranks(const dist::Topology& topology, int ranks);

// The ranks of each host of `topology` (under the same node of type "host"; ranks without one are a host of
// their own), each in ring order.
std::vector<std::vector<int>> host_groups(const dist::Topology& topology);

struct WhatIfRequest {
  // The run: model, image size, micro-batch, precision, ZeRO flags, and how the ranks communicate (Note
  // [What-if on a mesh] in what_if.cpp): --shard-group world or host, --hpz, --comm-impl (run_spec in
  // train/plan_request.h makes it from the training flags).
  RunSpec run;
  std::string device_reason;  // why run.device (plan_device in planner.h), shown with the report
  dist::Topology topology;
  ComputeTable compute;
  std::optional<int64_t> gpu_mem;
  std::vector<int> ranks;  // empty: 1, 2, 4, ... below the topology's rank count, and that count
  std::vector<int> stages = {0, 1, 2, 3};
  bool memory = true;  // false: no memory plan per row (memory_bytes 0, fits unset): the timelines alone
};

struct WhatIfRow {
  int stage = 0, ranks = 1;
  double compute_s = 0;    // the device's own work in a step (every micro-step and the optimizer)
  double comm_s = 0;       // the step's collectives, end to end, one after another on the comm stream
  double comm_wait_s = 0;  // time the compute stream waited for collectives (exposed communication)
  double host_wait_s = 0;  // offload: time it waited for the host (copies and the CPU optimizer)
  double comm_cpu_s = 0;   // CPU ranks: compute delayed by the cores' work on messages (Note [CPU ranks ...])
  double step_s = 0;
  double img_per_s = 0;
  double scaling = 0;            // img/s over (ranks x img/s on one rank) at the same stage
  int64_t comm_bytes = 0;        // bytes this rank sends (the ring's count)
  int64_t cross_host_bytes = 0;  // bytes the busiest host sends to other hosts in a step (all its ranks)
  int64_t memory_bytes = 0;      // the planner's required bytes per GPU
  std::optional<bool> fits;
};

struct WhatIfRing {
  int ranks = 0;
  std::vector<int> order;  // in the topology's rank numbers
  std::string bottleneck;
  double reduce_scatter_busbw_gbps = 0;  // a 64 MiB reduce-scatter, as commbench --show-ring reports it
  double all_reduce_busbw_gbps = 0;      // a 64 MiB all-reduce
  double host_link_gbps = 0;             // per GPU to its CPU when every GPU copies at once (offload)
};

struct WhatIf {
  std::string model, precision, compute_provenance, compute_device;
  std::string device, device_reason;  // the backend the memory column is planned for, and why
  int64_t image_size = 0, micro_batch = 0, grad_accum = 1;
  bool checkpointing = false, offload = false;
  std::vector<WhatIfRing> rings;
  std::vector<WhatIfRow> rows;
};

WhatIf what_if(const WhatIfRequest& request);
std::string format_what_if(const WhatIf& w);
nlohmann::json what_if_to_json(const WhatIf& w);

}  // namespace cz::plan
