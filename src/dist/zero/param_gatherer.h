// The parameter gatherers' common part: what brings the full parameters to every rank of the process group
// they are given. Stages 1-2: ChunkGatherer (chunk_gatherer.h); stage 3: UnitGatherer (unit_gatherer.h).
// Stage 0 needs none.
#pragma once

#include <optional>
#include <vector>

#include "dist/comm/process_group.h"
#include "dist/zero/comm_meter.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/partition.h"
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

}  // namespace cz::zero
