// The step plan (Note [Step plan]): what a ZeRO stage runs and how its schedules are linked, decided once
// from the engine's config and the mesh. The engine, the planner's replay and the what-if build one and only
// carry out its events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/zero/gather_codec.h"
#include "dist/zero/partition.h"
#include "dist/zero/schedule.h"
#include "dist/zero/zero_config.h"

namespace cz::zero {

// Note [ZeRO step] as predicates of the stage, written once: what a stage keeps and runs. Every other file
// asks StepPlan, which holds them, never the stage number.
struct StageRules {
  bool sharded;        // stages 1-3: optimizer state (and more) in chunks over the shard group
  bool buckets;        // stages 2-3: gradients copied into buckets every micro-step, no full gradient buffer
  bool unit_gathers;   // stage 3: parameters sharded too, units gathered around their use (UnitSchedule)
  bool chunk_gathers;  // stages 1-2: the updated chunks all-gathered after the update (ChunkSchedule)
};
constexpr StageRules stage_rules(int stage) {
  return {stage > 0, stage >= 2, stage == 3, stage == 1 || stage == 2};
}

// Note [Two-hop choice]: whether --reduce-dtype int8 reduces in two hops, host then cross (Note [Two-hop
// quantized reduction], Note [Two-hop quantized all-reduce]). They apply to int8 sharded over the world at
// stages 1-3 (with --shard-group the reduce-scatter already stays in its shard group) or stage 0's
// all-reduce, on several hosts of the same number (> 1) of CPU ranks, with --comm-impl hier or auto. Why auto
// takes them: the two hops send as many records in all as the flat all-to-all (R H - 1 = N - 1 per rank), but
// only H - 1 of them cross hosts instead of (H - 1) R, and the cost model's links across hosts are never
// faster than those inside a host (Note [Two-level cost model]), so by its bytes the two hops are never
// slower. flat keeps the all-to-all; one host or one rank per host is the flat path, as for the fp32
// collectives. `cpu_only`: two hops would apply but the ranks are CUDA ranks, whose two-hop kernels have not
// run: the flat path is taken (and --comm-impl hier refused by the trainer, which says why).
enum class TwoHop { no, yes, cpu_only };

// What the step plan needs to know of the mesh (Note [2-D mesh] in dist/comm/mesh.h).
struct MeshFacts {
  int world = 1;           // the ranks trained across
  int shard_group = 0;     // the ranks of a shard group (--shard-group; "host": the ranks of a host); 0: the
                           // world. Stage 0 shards nothing, whatever it says.
  int hosts = 1;           // hosts of the world
  int ranks_per_host = 0;  // ranks on every host when they are equal, else 0
  bool flat_impl = false;  // --comm-impl flat: the world's collectives, and int8 reductions, in one hop
};

class StepPlan;
// The one place a step plan is made (the trainer, the planner's rows and the what-if's rows call it): the
// shard group's size at stages 1-3 (the world at stage 0), hpZ (stage 3 on several hosts), the two-hop
// choice.
StepPlan make_step_plan(const ZeroConfig& cfg, const MeshFacts& mesh);

class StepPlan {
 public:
  StepPlan();  // stage 0 on one rank
  const ZeroConfig& config() const { return cfg_; }
  int stage() const { return cfg_.stage; }  // for messages and records; decisions ask the predicates below
  bool sharded() const { return rules_.sharded; }
  bool buckets() const { return rules_.buckets; }
  bool unit_gathers() const { return rules_.unit_gathers; }
  bool chunk_gathers() const { return rules_.chunk_gathers; }

  // Note [What each rank keeps]: the model-state buffers of this stage, dtypes and mesh, which the engine
  // allocates (engine.cpp build_*), the memory model counts (plan/zero_memory.cpp) and the replay allocates
  // (plan/step_replay.cpp).
  bool full_params() const { return !rules_.unit_gathers; }  // the full compute copy; else its shard
  // fp32 master chunks of their own: under mixed precision or offload, and at stages 1-2 when what is
  // gathered is not the compute copy itself (its values land in every chunk of the copy).
  bool own_master() const { return mixed() || offload() || (rules_.chunk_gathers && !codec_.direct()); }
  bool full_grads() const { return !rules_.buckets; }  // the full gradient buffer (compute dtype) .grads view
  // fp32 gradient chunks: with buckets, and under mixed precision or offload.
  bool grad_chunks() const { return rules_.buckets || mixed() || offload(); }
  // The records of this rank's chunks that a gather encodes (Note [Quantized gathers]).
  bool gather_records() const { return rules_.sharded && !codec_.direct(); }
  // Master chunks, gradient chunks and optimizer state in pinned host memory (Note [CPU offload]).
  bool offload() const { return cfg_.offload; }
  bool mixed() const { return compute_ != DType::f32; }

  int world() const { return world_; }
  int shards() const { return shards_; }  // the shard group at stages 1-3, else the world
  // The chunks each partition is cut into (Note [ZeRO partitioning]): the shard group's, or 1 at stage 0.
  int layout_shards() const { return rules_.sharded ? shards_ : 1; }
  // The ranks a partition's reduction runs over: the world at stage 0, else the shard group.
  int reduce_group() const { return sharded() ? shards_ : world_; }
  DType compute() const { return compute_; }
  DType bucket_dtype() const { return bucket_; }  // what gradient buckets hold (f32 for INT8 reductions)
  bool reduce_int8() const { return reduce_int8_; }
  int64_t quant_block() const { return quant_block_; }
  bool two_hop() const { return two_hop_ == TwoHop::yes; }
  TwoHop two_hop_choice() const { return two_hop_; }
  ReduceKind reduce_kind() const;
  // Note [Flat buffers]: the layout's alignment and padding; the bucket size in elements for a model of
  // `params` elements (bucket_elems).
  LayoutRule layout_rule() const;
  int64_t bucket_elems(int64_t params) const;

  const GatherCodec& codec() const { return codec_; }
  // Note [hpZ]: stage 3 on several hosts; backward's gathers stay inside the host, from the slices forward
  // kept (the secondary copies: a slice of every unit over `hpz_ranks` ranks), in the compute dtype.
  bool hpz() const { return hpz_; }
  int hpz_ranks() const { return hpz_ ? hpz_ranks_ : 0; }
  bool host_local_gather(bool backward) const { return hpz_ && backward; }
  // What a gather of partition p moves, per rank: the records of its chunks when the codec is not direct
  // (Note [Quantized gathers]), else the partition in the compute dtype; hpZ's backward gathers always the
  // latter. `records_bytes` is 0 where the compute copy itself travels.
  int64_t gather_records_bytes(const ZeroLayout& layout, size_t p, bool backward) const;
  int64_t gather_bytes(const ZeroLayout& layout, size_t p, bool backward) const;

 private:
  friend StepPlan make_step_plan(const ZeroConfig& cfg, const MeshFacts& mesh);
  StepPlan(const ZeroConfig& cfg, int world, int shards, TwoHop two_hop, bool hpz, int hpz_ranks);

  ZeroConfig cfg_;
  StageRules rules_;
  int world_, shards_;
  bool reduce_int8_;
  TwoHop two_hop_;
  bool hpz_;
  int hpz_ranks_;
  int64_t quant_block_;
  DType compute_, bucket_;
  GatherCodec codec_;
};

// The schedules of a step, linked as Note [Step plan] says: a stage-3 unit is released when its gradients'
// reduction is launched; backward ends by ending the units' backward, flushing the reductions and releasing
// every unit; stages 1-2's gathers follow the update. Each carrier binds its sinks (the engine: its reducer
// and gatherer; the replay and the what-if: their own) and drives it from the same points: the gradients'
// ready hooks, the units' module hooks, the update.
class StepSchedule final : private ReduceSchedule::Sink {
 public:
  // `units`: the model's units (ConvNeXt::units()), whose forwards wait for their partitions at stages 1-2
  // (unit_partitions); not read at other stages.
  StepSchedule(const StepPlan& plan, const ZeroLayout& layout, int prefetch,
               const std::vector<std::string>& units);
  StepSchedule(const StepSchedule&) = delete;
  StepSchedule& operator=(const StepSchedule&) = delete;
  // The sinks that carry out the events; a stage's unused ones may be null.
  void bind(ReduceSchedule::Sink* reduce, UnitSchedule::Sink* units, ChunkSchedule::Sink* chunks);
  const StepPlan& plan() const { return plan_; }

  // Backward of one micro-step.
  void begin_backward(bool last_micro_step);
  void grad_ready(size_t param);
  // `finished`: backward ran to its end (not an exception): the reductions are flushed and every unit
  // released.
  void end_backward(bool finished);
  bool last_micro_step() const { return reduce_.last_micro_step(); }
  size_t partition_of(size_t param) const { return reduce_.partition_of(param); }

  // Stage 3, a unit's module hooks (no-ops at other stages); the what-if's steady state.
  void unit_forward_pre(size_t u);
  void unit_forward_post(size_t u);
  void unit_backward_pre(size_t u);
  bool in_backward() const { return units_.backward(); }
  bool resident(size_t u) const { return plan_.unit_gathers() && units_.resident(u); }
  void assume_unit_order(std::vector<size_t> order) { units_.assume_order(std::move(order)); }

  // Stages 1-2 (no-ops at other stages): unit `u`'s forward is about to run; after an update; everything in
  // flight waited for.
  void unit_forward_pre_chunks(size_t u);
  void after_update();
  void use_all();

 private:
  // ReduceSchedule::Sink: the carrier's, plus the link to the units.
  void prepare(size_t p) override;
  void launch(size_t p) override;
  void finish(size_t p) override;

  StepPlan plan_;
  ReduceSchedule reduce_;
  UnitSchedule units_;
  ChunkSchedule chunks_;
  std::vector<std::vector<size_t>> unit_parts_;
  ReduceSchedule::Sink* reduce_sink_ = nullptr;
  UnitSchedule::Sink* unit_sink_ = nullptr;
  ChunkSchedule::Sink* chunk_sink_ = nullptr;
};

}  // namespace cz::zero
