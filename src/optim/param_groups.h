// Shards of the flat parameter space and the per-parameter hyper-parameters optimizers apply to them: timm's
// weight-decay rule, and the pieces (local runs of equal hyper-parameters) each shard precomputes.
// See Note [Flat buffers] (tensor/flat.h) and Note [Shard pieces] below.
#pragma once

#include <string>
#include <vector>

#include "tensor/flat.h"

namespace cz {

// A contiguous range [begin, end) of the flat space, in elements. Non-ZeRO use: {0, layout.numel}.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t numel() const { return end - begin; }
  static ShardRange whole(const FlatLayout& layout) { return {0, layout.numel}; }
  bool operator==(const ShardRange&) const = default;
};

// Throws ValueError naming `who` unless 0 <= begin <= end <= layout.numel.
void check_shard_range(const char* who, const FlatLayout& layout, ShardRange shard);

// Hyper-parameters of one parameter (one FlatSegment). lr_scale multiplies the scheduled lr (layer-wise lr
// decay); weight_decay is AdamW's decoupled or SGD's coupled coefficient.
struct ParamHyper {
  double weight_decay = 0.0;
  double lr_scale = 1.0;
  bool operator==(const ParamHyper&) const = default;
};

// timm's rule (`param_groups_weight_decay`): no decay on parameters with at most one dimension (norm weights
// and biases, layer-scale `gamma`), on names ending in ".bias", and on names listed in `no_decay_names`;
// `weight_decay` on everything else. One entry per segment of `layout`, in layout order.
bool timm_decays(const FlatSegment& segment, const std::vector<std::string>& no_decay_names = {});
std::vector<ParamHyper> timm_weight_decay(const FlatLayout& layout, double weight_decay,
                                          const std::vector<std::string>& no_decay_names = {});

// Layer-wise lr decay (BEiT, ConvNeXt fine-tuning): multiplies hyper[i].lr_scale by
// decay^(num_layers + 1 - layer_ids[i]), so the last layer id (num_layers + 1, the head) keeps its lr and
// each id below it gets one more factor of `decay`. layer_ids: one per entry of `hyper`, in [0, num_layers
// + 1]. decay > 0; 1 changes nothing.
void apply_layer_decay(std::vector<ParamHyper>& hyper, const std::vector<int64_t>& layer_ids,
                       int64_t num_layers, double decay);

// Note [Shard pieces]: a shard is cut into pieces, maximal runs of elements whose parameters share one
// ParamHyper, in shard-local offsets. Each segment owns its padded extent [offset, next segment's offset) —
// the alignment padding after a parameter is updated with that parameter's hyper-parameters, which keeps it
// zero as long as its gradient padding is zero — so the pieces tile the shard exactly: the first begins at
// 0, each begins where the previous ends, the last ends at shard.numel(). A parameter straddling a shard
// boundary contributes a piece to both shards. Kernels (CPU and CUDA) take the shard plus its pieces.
struct ShardPiece {
  int64_t begin = 0;  // shard-local, inclusive
  int64_t end = 0;    // shard-local, exclusive
  double weight_decay = 0.0;
  double lr_scale = 1.0;
};

// `hyper` has one entry per segment of `layout`. An empty shard gives no pieces.
std::vector<ShardPiece> shard_pieces(const FlatLayout& layout, ShardRange shard,
                                     const std::vector<ParamHyper>& hyper);

}  // namespace cz
