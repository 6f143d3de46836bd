// How ZeRO cuts the flat parameter space into partitions and each partition into per-rank chunks: pure
// arithmetic, shared by the engine, checkpoints and the memory planner, testable without MPI.
//
// Note [ZeRO partitioning]: parameters are laid out in registration order in one flat space, each at an
// offset aligned to `align` elements (Note [Flat buffers]). The flat space is cut into partitions of whole
// parameters: at stages 0-2 gradient buckets (consecutive parameters up to the bucket size; a larger
// parameter is a bucket of its own), at stage 3 units (a module whose parameters are gathered and released
// together: the stem, each downsample layer, each block, the head). Each partition is padded to a multiple of
// shards x align elements and split into `shards` equal chunks (shards = 1 at stage 0, the world size at
// stages 1-3): rank r owns chunk r of every partition, [begin + r*chunk, begin + (r+1)*chunk). So every
// collective is a true reduce-scatter or all-gather of equal chunks over one contiguous partition, and a
// rank's shard is its chunks of all partitions, stored back to back in partition order in its shard buffers
// (optimizer state, gradient shard, master weights, EMA): chunk p starts at local_offset(p). A parameter may
// straddle chunk boundaries, so one parameter's elements may live on several ranks; padding elements are
// zero and stay zero (their gradients are zero, and AdamW keeps a zero weight with a zero gradient at zero).
// `align` is 16, or the block size B with quantized gathers (Note [Quantized gathers] in gather_codec.h):
// then every parameter and every chunk starts a block, and no block holds two tensors.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "optim/param_groups.h"
#include "tensor/flat.h"

namespace cz::zero {

class StepPlan;

struct Partition {
  std::string name;        // a unit's module name ("stages.1.blocks.0"), or "bucket K"
  int64_t begin = 0;       // flat offset of the first element
  int64_t numel = 0;       // a multiple of shards x align (padding included)
  size_t first_param = 0;  // segments [first_param, end_param) of the layout
  size_t end_param = 0;
};

struct ZeroLayout {
  FlatLayout flat;
  std::vector<Partition> partitions;  // in flat order; they tile [0, flat.numel)
  int shards = 1;                     // StepPlan::layout_shards: 1 at stage 0, else the shard group

  int64_t chunk(size_t p) const { return partitions[p].numel / shards; }
  // Rank r's chunk of partition p, in flat offsets.
  ShardRange chunk_range(size_t p, int rank) const;
  // All of rank r's chunks, in partition order (the ranges of its optimizer).
  std::vector<ShardRange> ranges(int rank) const;
  // Where partition p's chunk starts in a rank's shard buffers, and their total size.
  int64_t local_offset(size_t p) const { return local_offsets_[p]; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t params_numel() const;  // real parameter elements (no padding): Psi
  void finish();                 // computes the local offsets (plan_layout calls it)

 private:
  std::vector<int64_t> local_offsets_;
  int64_t shard_numel_ = 0;
};

struct ParamShape {
  std::string name;
  Shape shape;
};

// The bucket size the engine uses, in elements: `bucket_bytes` (--bucket-mb) in the reduce dtype, but at most
// a quarter of the model's parameters (and at least 64 Ki elements). A bucket is reduced only once backward
// has filled it, so a model smaller than one bucket would have nothing to overlap: ConvNeXt-atto's 14.8 MB
// of fp32 gradients in one 25 MiB bucket hid 0-16% of the communication at 2 CPU ranks, in four buckets
// 91-97%.
int64_t bucket_elems(double bucket_bytes, size_t reduce_dtype_size, int64_t params);

// The partitions `plan` makes of these parameters (Note [ZeRO partitioning]): buckets of at most
// `bucket_elems` elements (StepPlan::bucket_elems) where the plan reduces buckets, units where it gathers
// units, `unit_of[i]` naming parameter i's unit (consecutive parameters of one unit; a unit may not reappear
// after another one started); the plan's shards, alignment and padding (StepPlan::layout_rule: INT8
// all-reduces pad each partition to a multiple of the world's records, Note [Quantized all-reduce]).
ZeroLayout plan_layout(const std::vector<ParamShape>& params, const StepPlan& plan, int64_t bucket_elems,
                       const std::vector<std::string>& unit_of);

// The unit of each parameter: the longest of `units` that is a dotted prefix of its name (ValueError naming
// the parameter when none is).
std::vector<std::string> assign_units(const std::vector<ParamShape>& params,
                                      const std::vector<std::string>& units);

// The partitions holding each unit's parameters (a unit: a module name; its parameters: that name and all
// below it), ascending; every partition in some unit. The engine, the planner's replay and the what-if ask
// the same (StepSchedule).
std::vector<std::vector<size_t>> unit_partitions(const ZeroLayout& layout,
                                                 const std::vector<std::string>& units);

}  // namespace cz::zero
