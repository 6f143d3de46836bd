// The ZeRO engine's allocations during a training step, replayed through a MemoryTrace: the step replay
// (step_trace.cpp) calls it where ZeroEngine's hooks fire, and it allocates and frees what the engine does
// there (Note [What the engine allocates] in engine_trace.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist/plan/memory_trace.h"
#include "dist/zero/partition.h"
#include "tensor/dtype.h"

namespace cz::plan {

struct EngineSpec {
  int stage = 0;
  int world = 1;
  // A 2-D mesh (--shard-group): the shard group's size (0: the world). Each group of more than one rank that
  // does not span the world has a communicator, and so a ring scratch, of its own: the world's carries the
  // loss, the shard group's the reduce-scatters and the norm, the replication group's the gradient chunks'
  // all-reduces. (hpZ allocates nothing during a step: its secondary copies are model state, and
  // all-gathers need no ring scratch.)
  int shard = 0;
  zero::ZeroLayout layout;  // the engine's partitions (zero_layout)
  DType compute = DType::f32, reduce = DType::f32;
  int prefetch = 1;
  bool offload = false;  // --offload-optimizer: the model state differs, not what a step allocates
  bool cuda = false;     // the ring's scratch comes from the device allocator with a 256-byte minimum on CUDA
};

class EngineTrace {
 public:
  using Id = MemoryTrace::Id;
  EngineTrace(MemoryTrace& m, EngineSpec spec);

  // Flat index of a parameter ("stages.0.blocks.1.mlp.fc1.weight"); the unit (partition) of a stage-3 module
  // ("stages.0.blocks.1"), or -1 when the module is not a unit or the stage is not 3.
  size_t param_index(const std::string& name) const;
  int unit_of_module(const std::string& module) const;

  // ZeroEngine::backward: before loss.backward() and after it (flush: what is still in flight ends).
  void backward_begin(bool last_micro_step);
  void backward_end();
  // Stage-3 module hooks of unit `u` (Note [Stage-3 units]); no-ops for u < 0.
  void forward_pre(int u);
  void forward_post(int u);
  void backward_pre(int u);
  // AccumulateGrad of parameter `param` got `grad`: the engine's grad-ready hook runs, then the gradient is
  // freed (released here).
  void grad_ready(size_t param, Id grad);
  // ProcessGroup::all_reduce of a scalar (a one-element f64 tensor and its all-reduce) and ZeroEngine::step.
  void all_reduce_scalar();
  void optimizer_step();

 private:
  struct InFlight {
    size_t partition;
    Id cast;  // stages 0-1: the gradient cast to the reduce dtype, when it differs
  };
  void launch(size_t p);
  void finish_oldest();
  void gather(size_t p);
  void release(size_t p);
  void prefetch_after(size_t p, bool backward);
  enum Comm { world_comm, shard_comm, replicate_comm };
  void ring_scratch(Comm c, int64_t count, int64_t elem_bytes);
  int shards() const { return s_.shard > 0 ? s_.shard : s_.world; }
  void all_reduce_scalar_in(Comm c);

  MemoryTrace& m_;
  EngineSpec s_;
  std::unordered_map<std::string, size_t> param_index_;
  std::vector<size_t> param_partition_;
  std::vector<int> remaining_;
  std::vector<bool> launched_;
  std::vector<Id> bucket_;    // stages 2-3
  std::vector<Id> gathered_;  // stage 3: kNone while released
  std::deque<InFlight> in_flight_;
  bool last_micro_ = true;
  bool backward_ = false;
  bool recording_ = true;  // stage 3: the first forward records the unit order
  std::vector<size_t> order_, position_;
  Id scratch_[3] = {-1, -1, -1};
  int64_t scratch_bytes_[3] = {0, 0, 0};
};

}  // namespace cz::plan
