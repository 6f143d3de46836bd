// The ZeRO engine's allocations during a training step, replayed through a MemoryEvents: the step replay
// (step_replay.cpp) calls it where ZeroEngine's hooks fire, and it allocates and frees what the engine does
// there (Note [What the engine allocates] in engine_events.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist/comm/types.h"
#include "dist/plan/memory_events.h"
#include "dist/zero/partition.h"
#include "dist/zero/step_plan.h"
#include "tensor/dtype.h"

namespace cz::plan {

struct EngineSpec {
  // Note [Step plan]: the stage's schedules, the reductions' kind, dtypes, quantization, hpZ, two hops; the
  // world and the shard group (a 2-D mesh, --shard-group: each group of more than one rank that does not
  // span the world has a communicator, and so a ring scratch, of its own: the world's carries the loss, the
  // shard group's the reduce-scatters and the norm, the replication group's the gradient chunks'
  // all-reduces; hpZ allocates nothing during a step: its secondary copies are model state, and all-gathers
  // need no ring scratch).
  zero::StepPlan plan;
  std::vector<std::string> units;  // the model's units (ConvNeXt::units()): stages 1-2 wait at their forwards
  zero::ZeroLayout layout;         // the engine's partitions (zero_layout)
  int prefetch = 1;
  bool cuda = false;  // the ring's scratch comes from the device allocator with a 256-byte minimum on CUDA
  // The world's communicator in two levels (--comm-impl hier or auto on hosts of several ranks, Note
  // [Two-level collectives]): the ranks of a host (consecutive world ranks), this rank, and which calls take
  // them (dist::takes_two_levels); 0 / empty: the flat ring.
  int ranks_per_host = 0;
  int rank = 0;
  std::function<bool(dist::Collective kind, int64_t bytes)> two_level;
};

// It drives the engine's own step schedule (Note [Step plan]) and carries its events out on the trace.
class EngineEvents : private zero::ReduceSchedule::Sink,
                     private zero::UnitSchedule::Sink,
                     private zero::ChunkSchedule::Sink {
 public:
  using Id = MemoryEvents::Id;
  EngineEvents(MemoryEvents& m, EngineSpec spec);

  // Flat index of a parameter ("stages.0.blocks.1.mlp.fc1.weight"); the unit (partition) of a stage-3 module
  // ("stages.0.blocks.1"), or -1 when the module is not a unit or the stage is not 3.
  size_t param_index(const std::string& name) const;
  int unit_of_module(const std::string& module) const;

  // ZeroEngine::backward: before loss.backward() and after it (flush: what is still in flight ends).
  void backward_begin(bool last_micro_step);
  void backward_end();
  // Stage-3 module hooks of unit `u` (Note [Stage-3 units]); no-ops for u < 0.
  void forward_pre(int u);
  // Stages 1-2: the forward of unit `module` waits for its partitions' gathers (ChunkGatherer's hook).
  void chunk_forward_pre(const std::string& module);
  void forward_post(int u);
  void backward_pre(int u);
  // AccumulateGrad of parameter `param` got `grad`: the engine's grad-ready hook runs, then the gradient is
  // freed (released here).
  void grad_ready(size_t param, Id grad);
  // ProcessGroup::all_reduce of a scalar (a one-element f64 tensor and its all-reduce) and ZeroEngine::step.
  void all_reduce_scalar();
  void optimizer_step();
  const zero::StepPlan& plan() const { return s_.plan; }

 private:
  struct InFlight {
    Id cast = -1;      // stages 0-1: the gradient cast to the reduce dtype, when it differs
    Id records = -1;   // --reduce-dtype int8: the records sent and received (Note [Quantized reduction])
    Id records2 = -1;  // stage 0: the second exchange's records (Note [Quantized all-reduce]); two hops:
                       // the host's partial sums
    Id records3 =
        -1;  // stage 0 in two hops: the second exchange's records (Note [Two-hop quantized all-reduce])
  };
  // ReduceSchedule::Sink
  void prepare(size_t p) override;
  void launch(size_t p) override;
  void finish(size_t p) override;
  // UnitSchedule::Sink
  void gather(size_t p) override;
  void use(size_t p) override;  // the gathered records decoded, their buffer freed
  void release(size_t p) override;
  // ChunkSchedule::Sink
  void gather_partition(size_t p) override;
  void use_partition(size_t p) override;
  // A parameter gather of partition p launched: its records' buffer, if records travel, and the collective.
  void gather_collective(size_t p, bool backward);
  // The communicators whose threads grow a scratch: the mesh's, and a two-level world's host and cross
  // communicators and its own thread (the pack scratch; its flat ring is world_comm).
  enum Comm { world_comm, shard_comm, replicate_comm, host_level, cross_level, pack, kComms };
  // A `kind` collective of `count` elements on communicator `c` (a mesh group's): the scratch it grows.
  void collective(Comm c, dist::Collective kind, int64_t count, int64_t elem_bytes);
  void two_level(dist::Collective kind, int64_t count, int64_t elem_bytes);
  // A ring reduce-scatter or all-reduce of `count` elements over `size` ranks on `c`.
  void ring_scratch(Comm c, int size, int64_t count, int64_t elem_bytes);
  void grow(Comm c, int64_t need);
  bool hier() const {
    return s_.ranks_per_host > 1 && s_.ranks_per_host < s_.plan.world() && bool(s_.two_level);
  }
  void all_reduce_scalar_in(Comm c);

  MemoryEvents& m_;
  EngineSpec s_;
  std::unordered_map<std::string, size_t> param_index_;
  zero::StepSchedule schedule_;
  std::unordered_map<std::string, size_t> unit_index_;  // stages 1-2: the units whose forwards wait
  std::vector<Id> bucket_;                              // stages 2-3
  std::vector<Id> gathered_;                            // stage 3: kNone while released
  std::vector<Id> wire_;             // quantized: the gathered records, from gather to use (decode)
  std::vector<InFlight> in_flight_;  // per partition, while its reduction is in flight
  Id scratch_[kComms] = {-1, -1, -1, -1, -1, -1};
  int64_t scratch_bytes_[kComms] = {};
};

}  // namespace cz::plan
