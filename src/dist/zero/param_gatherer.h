// The parameter gatherers: what brings the full parameters to every rank of the process group they are given.
// Stages 1-2 (ChunkGatherer): after each update, this rank's updated chunks are all-gathered into the full
// compute copy, and each unit's forward waits for the partitions it reads (Note [Overlapped parameter
// all-gather] in engine.cpp). Stage 3 (UnitGatherer, engine_units.cpp): each unit is gathered before its
// use, prefetched ahead, and released after (Note [Stage-3 units]). Stage 0 needs none.
#pragma once

#include <optional>
#include <vector>

#include "dist/comm/process_group.h"
#include "dist/zero/comm_meter.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/partition.h"
#include "dist/zero/step_plan.h"
#include "nn/module.h"

namespace cz::zero {

class ParamGatherer {
 public:
  virtual ~ParamGatherer();  // removes its hooks, waits for what is in flight; never throws
  // After an update of this rank's compute chunks.
  virtual void after_update() {}
  // Everything launched by after_update() waited for (before anything else reads or writes parameters).
  virtual void wait_all() {}
  virtual bool resident(size_t p) const {
    (void)p;
    return false;
  }
  virtual int64_t gathered_bytes() const { return 0; }
  // What it holds between steps: the records of this rank's chunks (when the codec is not direct), and at
  // stage 3 the shard (and hpZ's secondary copies).
  virtual int64_t state_bytes() const;
  // What each partition's record is encoded from (per partition, this rank's chunk): given once the
  // engine's state exists.
  void set_sources(std::vector<Tensor> sources) { sources_ = std::move(sources); }

 protected:
  ParamGatherer(const ZeroLayout& layout, dist::ProcessGroup group, CommMeter& meter,
                const GatherCodec& codec)
      : layout_(layout), group_(std::move(group)), meter_(meter), codec_(codec) {}
  // Not direct: one buffer of the records of all of this rank's chunks (Note [Quantized gathers]).
  void allocate_records();
  Tensor record(size_t p) const;
  void encode_all();  // every record from its source
  const ZeroLayout& layout_;
  dist::ProcessGroup group_;
  CommMeter& meter_;
  const GatherCodec& codec_;
  std::vector<Tensor> sources_;
  Tensor records_;
  std::vector<int64_t> record_offset_;
  std::vector<std::pair<nn::Module*, int>> hooks_;  // (module, hook id)
};

// It carries out ChunkSchedule's events (Note [One schedule]) on the compute copy and all-gathers; its hooks
// drive the step's schedule (Note [Step plan]).
class ChunkGatherer final : public ParamGatherer, private ChunkSchedule::Sink {
 public:
  // `full`: the full compute copy; `chunks`: this rank's chunk of each partition in it; `units`: module names
  // of `model` holding every parameter (ConvNeXt::units()), whose forwards wait for their partitions.
  // Not direct (Note [Quantized gathers]): each update encodes the sources into the records, all-gathers
  // them and decodes every partition into `full` at once, on the training thread; so these gathers are not
  // overlapped with the next forward.
  ChunkGatherer(const ZeroLayout& layout, nn::Module& model, const std::vector<std::string>& units,
                Tensor full, std::vector<Tensor> chunks, dist::ProcessGroup group, CommMeter& meter,
                const GatherCodec& codec, StepSchedule& schedule);
  ~ChunkGatherer() override;
  void after_update() override;
  void wait_all() override { schedule_.use_all(); }
  ChunkSchedule::Sink& sink() { return *this; }

 private:
  // ChunkSchedule::Sink
  void gather_partition(size_t p) override;
  void use_partition(size_t p) override;
  Tensor full_;
  std::vector<Tensor> chunks_;
  StepSchedule& schedule_;
  std::vector<dist::WorkHandle> work_;  // per partition
  std::vector<Tensor> wire_;            // not direct: per partition, its gathered records until decoded
};

// The partitions holding each unit's parameters (a unit: a module name; its parameters: that name and all
// below it), ascending; every partition in some unit. The planner's replay asks the same (engine_trace.cpp).
std::vector<std::vector<size_t>> unit_partitions(const ZeroLayout& layout,
                                                 const std::vector<std::string>& units);

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
