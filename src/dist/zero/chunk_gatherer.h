// Stages 1-2's parameter gatherer: after each update, this rank's updated chunks are all-gathered into the
// full compute copy, and each unit's forward waits for the partitions it reads (Note [Overlapped parameter
// all-gather] in engine.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dist/zero/param_gatherer.h"
#include "dist/zero/step_plan.h"

namespace cz::zero {

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

}  // namespace cz::zero
