// How long each op of a step takes on the device the what-if model plans for (what_if.h): the rates behind
// `convnext_zero --plan --what-if TOPO --compute-table FILE`, and where they come from, which every report
// states. Two kinds of file (docs/planning.md):
//  * a profile: `bench_train_step --profile N --json` as written (measured on whatever device ran it). Each
//    op name gets the rate it reached there (FLOP/s for matmul-like ops, bytes/s for the rest, over the work
//    op_costs.h counts for the profiled model, batch and image), so other models, batches and images are
//    timed by their own work at those rates. Optionally wrapped as {"profile": {...}, "scale_from": RATES,
//    "scale_to": RATES} to move it to another device by the ratio of peak FLOP and byte rates.
//  * rates: {"device": "...", "source": "...", "matmul_tflops": {"bf16": .., "fp32": ..}, "memory_gbps": ..,
//    "efficiency": {"matmul": .., "memory": .., "depthwise": ..}, "op_overhead_us": ..,
//    "host_optimizer_gbps": ..}: a roofline from peak rates and efficiencies.
// Either kind may carry "comm_cpu": {"network_gbps": .., "shared_memory_gbps": .., "reduce_gbps": ..,
// "step_us": ..}, what a CPU rank's own cores spend on its messages (Note [CPU ranks pay for their messages]
// in what_if.cpp).
// Without a file: the built-in RTX 4090 rates (kRtx4090, rates kind), marked planned.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "dist/plan/op_costs.h"

namespace cz::plan {

struct ComputeTable {
  std::string device;       // what the times are for: "RTX 4090", "cpu"
  std::string provenance;   // one line: measured / scaled / planned, from what
  bool measured = false;    // op times measured on `device` (a profile, not scaled)
  double matmul_flops = 0;  // achieved FLOP/s of matmul-like ops (in the run's compute dtype)
  double memory_bytes = 0;  // achieved bytes/s of memory-bound ops
  double depthwise_bytes = 0;
  double op_overhead_s = 0;  // per op: kernel launches and the gaps between them
  double host_bytes = 0;     // the CPU optimizer under --offload-optimizer, per rank (bytes/s)
  struct OpRate {
    bool by_flops = false;
    double rate = 0;
  };
  std::map<std::string, OpRate> per_op;  // a profile's own rates, by op name
  // The bytes/s at which a rank, on its share of the cores, moves a message through the network stack or
  // through shared memory (each byte sent by it and received by its peer), and adds received partial sums,
  // and the fixed time of one ring step; 0: free (a GPU's copy engines and NCCL's kernels do it beside the
  // compute).
  struct CommCpu {
    double network_bytes = 0, shared_bytes = 0, reduce_bytes = 0;
    double step_s = 0;
    bool any() const { return network_bytes > 0 || shared_bytes > 0 || reduce_bytes > 0; }
  } comm_cpu;

  double seconds(const OpCost& op) const;
};

// `compute`: the run's compute dtype (selects matmul_tflops of a rates table).
ComputeTable compute_table_from_json(const nlohmann::json& j, DType compute);
ComputeTable load_compute_table(const std::string& path, DType compute);
ComputeTable default_compute_table(DType compute);  // the built-in RTX 4090 rates

}  // namespace cz::plan
