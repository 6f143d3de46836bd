// Note [Step plan]
// Which schedules a stage runs, how they are linked and which buffers each rank keeps are decided once, here,
// from the engine's config and the mesh (make_step_plan), for the three programs that carry a step out: the
// engine, the planner's replay and the what-if (Note [One schedule]). None of them tests the stage number.
// StepSchedule owns the three schedules and their links:
//  * the reductions (ReduceSchedule): bucketed every micro-step at stages 2-3, else on the last micro-step;
//    every partition's reduction of one kind (reduce_kind);
//  * stage 3's units (UnitSchedule): a unit's gradients launched means the unit is not needed again this
//    step, so the launch releases it; backward ends by ending the units' backward, flushing what is left of
//    the reductions, then releasing every unit;
//  * stages 1-2's gathers (ChunkSchedule): after the update, waited for at each unit's forward;
//  * hpZ: backward's gathers inside the host, in the compute dtype, whatever --gather-dtype says.
// A carrier binds its sinks and calls StepSchedule at its hook points; the order of the events the schedules
// emit is then the same in all three, which StepEvents (tests/dist/plan/test_step_events.cpp) checks.
//
// Note [What each rank keeps]
// The model-state buffers (Note [ZeRO step] in engine.cpp, Note [ZeRO memory model] in zero_memory.h):
//  * parameters: the full compute copy at stages 0-2 (full_params), else this rank's shard of it, hpZ's
//    secondary copies and the units gathered around their use;
//  * fp32 master chunks of their own (own_master) under mixed precision or offload, and at stages 1-2 when
//    gathers move records, whose decoded values land in every chunk of the compute copy; else the master
//    weights are the compute copy's chunks;
//  * the full gradient buffer the .grads view (full_grads, stages 0-1), and fp32 gradient chunks
//    (grad_chunks) with buckets, mixed precision or offload;
//  * the records of this rank's chunks when gathers are quantized or cast (gather_records);
//  * the optimizer state over this rank's chunks (the whole model at stage 0), and under offload the master,
//    the gradient chunks and the state in pinned host memory.
#include "dist/zero/step_plan.h"

#include "dist/zero/zero_config.h"
#include "tensor/check.h"

namespace cz::zero {

namespace {
TwoHop choose_two_hop(const ZeroConfig& cfg, bool flat_mesh, const MeshFacts& m) {
  if (!cfg.reduce_int8 || m.flat_impl) return TwoHop::no;
  if (m.hosts < 2 || m.ranks_per_host < 2) return TwoHop::no;           // one host, or a rank a host: flat
  if (stage_rules(cfg.stage).sharded && !flat_mesh) return TwoHop::no;  // a shard group keeps it inside
  return cfg.device.is_cuda() ? TwoHop::cpu_only : TwoHop::yes;
}
}  // namespace

StepPlan make_step_plan(const ZeroConfig& cfg, const MeshFacts& mesh) {
  // The flag table checks --stage and --shard-group; this is the one place a stage number becomes a plan.
  CZ_CHECK(cfg.stage >= 0 && cfg.stage <= kMaxStage, "ZeRO: stage {} outside 0-{}", cfg.stage, kMaxStage);
  CZ_CHECK(mesh.world >= 1, "ZeRO: world size must be >= 1, got {}", mesh.world);
  const StageRules rules = stage_rules(cfg.stage);
  const bool flat_mesh = mesh.shard_group <= 0 || mesh.shard_group == mesh.world;
  const int shards = rules.sharded && !flat_mesh ? mesh.shard_group : mesh.world;
  const bool hpz = cfg.hpz && rules.unit_gathers && mesh.hosts > 1;
  return StepPlan(cfg, mesh.world, shards, choose_two_hop(cfg, flat_mesh, mesh), hpz, mesh.ranks_per_host);
}

StepPlan::StepPlan(const ZeroConfig& cfg, int world, int shards, TwoHop two_hop, bool hpz, int hpz_ranks)
    : cfg_(cfg),
      rules_(stage_rules(cfg.stage)),
      world_(world),
      shards_(shards),
      reduce_int8_(cfg.reduce_int8),
      two_hop_(two_hop),
      hpz_(hpz),
      hpz_ranks_(hpz_ranks),
      quant_block_(cfg.quant_block),
      compute_(cfg.compute_dtype),
      bucket_(cfg.reduce_dtype),
      codec_(cfg.compute_dtype, cfg.gather_dtype, cfg.quant_block) {
  CZ_ASSERT(world_ >= 1 && shards_ >= 1 && world_ % shards_ == 0, "step plan: shard groups of {} in {} ranks",
            shards_, world_);
}

StepPlan::StepPlan() : StepPlan(make_step_plan(ZeroConfig{}, MeshFacts{})) {}

ReduceKind StepPlan::reduce_kind() const {
  return zero::reduce_kind(sharded(), reduce_int8_ ? quant_block_ : 0, reduce_group(), two_hop());
}

LayoutRule StepPlan::layout_rule() const {
  return zero::layout_rule(sharded(), reduce_int8_, quant_block_, codec_, world_);
}

int64_t StepPlan::bucket_elems(int64_t params) const {
  return zero::bucket_elems(double(cfg_.bucket_bytes), dtype_size(cfg_.reduce_dtype), params);
}

int64_t StepPlan::gather_records_bytes(const ZeroLayout& layout, size_t p, bool backward) const {
  if (codec_.direct() || host_local_gather(backward)) return 0;
  return int64_t(shards_) * codec_.record_bytes(layout.chunk(p));
}

int64_t StepPlan::gather_bytes(const ZeroLayout& layout, size_t p, bool backward) const {
  if (const int64_t records = gather_records_bytes(layout, p, backward)) return records;
  return layout.partitions[p].numel * int64_t(dtype_size(compute_));
}

StepSchedule::StepSchedule(const StepPlan& plan, const ZeroLayout& layout, int prefetch,
                           const std::vector<std::string>& units)
    : plan_(plan),
      reduce_(layout, plan.buckets()),
      units_(layout.partitions.size(), prefetch),
      chunks_(layout.partitions.size(), !plan.codec().direct()),
      unit_parts_(plan.chunk_gathers() ? unit_partitions(layout, units)
                                       : std::vector<std::vector<size_t>>{}) {}

void StepSchedule::bind(ReduceSchedule::Sink* reduce, UnitSchedule::Sink* units,
                        ChunkSchedule::Sink* chunks) {
  CZ_ASSERT(reduce != nullptr, "step schedule: no reduction sink");
  CZ_ASSERT(units != nullptr || !plan_.unit_gathers(), "step schedule: stage 3 without a unit sink");
  CZ_ASSERT(chunks != nullptr || !plan_.chunk_gathers(), "step schedule: stages 1-2 without a chunk sink");
  reduce_sink_ = reduce;
  unit_sink_ = units;
  chunk_sink_ = chunks;
}

void StepSchedule::begin_backward(bool last_micro_step) {
  reduce_.begin_backward(last_micro_step);
  if (plan_.unit_gathers()) units_.begin_backward();
}

void StepSchedule::grad_ready(size_t param) {
  reduce_.grad_ready(param, *this);
}

void StepSchedule::end_backward(bool finished) {
  if (plan_.unit_gathers()) units_.end_backward(finished);
  if (!finished) return;
  reduce_.flush(*this);
  if (plan_.unit_gathers()) units_.release_all(*unit_sink_);
}

void StepSchedule::prepare(size_t p) {
  reduce_sink_->prepare(p);
}

void StepSchedule::launch(size_t p) {
  reduce_sink_->launch(p);
  if (plan_.unit_gathers()) units_.release(p, *unit_sink_);  // its gradients are on their way
}

void StepSchedule::finish(size_t p) {
  reduce_sink_->finish(p);
}

void StepSchedule::unit_forward_pre(size_t u) {
  if (plan_.unit_gathers()) units_.forward_pre(u, *unit_sink_);
}

void StepSchedule::unit_forward_post(size_t u) {
  if (plan_.unit_gathers()) units_.forward_post(u, *unit_sink_);
}

void StepSchedule::unit_backward_pre(size_t u) {
  if (plan_.unit_gathers()) units_.backward_pre(u, *unit_sink_);
}

void StepSchedule::unit_forward_pre_chunks(size_t u) {
  if (plan_.chunk_gathers()) chunks_.forward_pre(unit_parts_.at(u), *chunk_sink_);
}

void StepSchedule::after_update() {
  if (plan_.chunk_gathers()) chunks_.after_update(*chunk_sink_);
}

void StepSchedule::use_all() {
  if (plan_.chunk_gathers()) chunks_.use_all(*chunk_sink_);
}

}  // namespace cz::zero
