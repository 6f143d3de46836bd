// Stage 3's parameter gatherer: each unit is gathered before its use, prefetched ahead, and released after
// (Note [Stage-3 units] in unit_gatherer.cpp; Note [hpZ]).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dist/zero/param_gatherer.h"
#include "dist/zero/step_plan.h"

namespace cz::zero {

// It carries out UnitSchedule's events (Note [One schedule]) on the units' buffers and all-gathers; its
// module hooks drive the step's schedule (Note [Step plan]), which also releases a unit once its gradients'
// reduction is launched and all of them at the end of backward.
class UnitGatherer final : public ParamGatherer, private UnitSchedule::Sink {
 public:
  // `shard`: this rank's chunks of the compute copy (compute dtype); `params`: the model's parameters in
  // layout order, repointed into each unit's releasable buffer. Every partition is a unit, a module of
  // `model`. `host`: hpZ's host group (Note [hpZ]); none: every gather is over `group`.
  // Not direct: the records are gathered into a releasable wire buffer per unit, decoded into the unit when
  // it is first used (hpZ's host gathers stay in the compute dtype).
  UnitGatherer(const ZeroLayout& layout, nn::Module& model, const std::vector<Tensor>& params, Tensor shard,
               StepSchedule& schedule, dist::ProcessGroup group, CommMeter& meter, const GatherCodec& codec,
               std::optional<dist::ProcessGroup> host = std::nullopt);
  void after_update() override;  // hpZ: the secondary copies are stale; the records encoded again
  ~UnitGatherer() override;
  bool resident(size_t p) const override { return schedule_.resident(p); }
  UnitSchedule::Sink& sink() { return *this; }
  int64_t gathered_bytes() const override;
  int64_t state_bytes() const override;

 private:
  // UnitSchedule::Sink
  void gather(size_t p) override;
  void use(size_t p) override;
  void release(size_t p) override;

  StepSchedule& schedule_;
  Tensor shard_;
  void drop_wire(size_t p);
  std::vector<Tensor> gathered_;  // per unit: the full unit, its storage released between uses
  std::vector<Tensor> wire_;      // per unit, not direct: the gathered records, held from gather to use
  std::vector<bool> wired_;
  std::vector<dist::WorkHandle> work_;  // per unit: its all-gather, from gather to use
  // hpZ (Note [hpZ]): the host group, the secondary copies (this rank's host-local slice of every unit, back
  // to back, one allocation), each unit's slice of them, whether it holds the current weights, and whether
  // the unit's gather in flight is the host one.
  std::optional<dist::ProcessGroup> host_;
  Tensor secondary_;
  std::vector<Tensor> slice_;
  std::vector<bool> slice_valid_, from_host_;
};

// hpZ's secondary copies: the elements of partition numel / ranks per host for every unit (Note [hpZ]).
int64_t hpz_secondary_numel(const ZeroLayout& layout, int ranks_per_host);

}  // namespace cz::zero
