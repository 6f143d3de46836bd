// timm's weight-decay rule and the cutting of a shard into pieces of equal hyper-parameters.
#include "optim/param_groups.h"

#include <algorithm>
#include <cmath>

namespace cz {

void check_shard_range(const char* who, const FlatLayout& layout, ShardRange shard) {
  CZ_CHECK(shard.begin >= 0 && shard.begin <= shard.end && shard.end <= layout.numel,
           "{}: shard [{}, {}) is outside the flat layout of {} elements (need 0 <= begin <= end <= {})", who,
           shard.begin, shard.end, layout.numel, layout.numel);
}

bool timm_decays(const FlatSegment& segment, const std::vector<std::string>& no_decay_names) {
  const std::string& n = segment.name;
  const bool is_bias = n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
  const bool listed = std::find(no_decay_names.begin(), no_decay_names.end(), n) != no_decay_names.end();
  return segment.shape.size() > 1 && !is_bias && !listed;
}

std::vector<ParamHyper> timm_weight_decay(const FlatLayout& layout, double weight_decay,
                                          const std::vector<std::string>& no_decay_names) {
  CZ_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
           "timm_weight_decay: weight_decay must be >= 0, got {}", weight_decay);
  for (const std::string& name : no_decay_names) layout.find(name);  // a typo should not silently decay
  std::vector<ParamHyper> out;
  out.reserve(layout.segments.size());
  for (const FlatSegment& s : layout.segments)
    out.push_back({timm_decays(s, no_decay_names) ? weight_decay : 0.0, 1.0});
  return out;
}

void apply_layer_decay(std::vector<ParamHyper>& hyper, const std::vector<int64_t>& layer_ids,
                       int64_t num_layers, double decay) {
  CZ_CHECK(std::isfinite(decay) && decay > 0, "layer decay must be a finite value > 0, got {}", decay);
  CZ_CHECK(layer_ids.size() == hyper.size(), "apply_layer_decay: {} layer ids for {} parameters",
           layer_ids.size(), hyper.size());
  for (size_t i = 0; i < hyper.size(); ++i) {
    CZ_CHECK(layer_ids[i] >= 0 && layer_ids[i] <= num_layers + 1,
             "apply_layer_decay: layer id {} of parameter {} is outside [0, {}]", layer_ids[i], i,
             num_layers + 1);
    // pow of an integer exponent, as the official code's `decay ** (num_layers + 1 - i)` computes it.
    hyper[i].lr_scale *= std::pow(decay, double(num_layers + 1 - layer_ids[i]));
  }
}

std::vector<ShardPiece> shard_pieces(const FlatLayout& layout, ShardRange shard,
                                     const std::vector<ParamHyper>& hyper) {
  check_shard_range("shard_pieces", layout, shard);
  CZ_CHECK(hyper.size() == layout.segments.size(),
           "shard_pieces: {} hyper-parameter entries for a layout of {} parameters", hyper.size(),
           layout.segments.size());
  for (size_t i = 0; i < hyper.size(); ++i) {
    CZ_CHECK(std::isfinite(hyper[i].weight_decay) && hyper[i].weight_decay >= 0,
             "shard_pieces: weight_decay of '{}' must be >= 0, got {}", layout.segments[i].name,
             hyper[i].weight_decay);
    CZ_CHECK(std::isfinite(hyper[i].lr_scale) && hyper[i].lr_scale >= 0,
             "shard_pieces: lr_scale of '{}' must be >= 0, got {}", layout.segments[i].name,
             hyper[i].lr_scale);
  }
  std::vector<ShardPiece> pieces;
  const size_t n = layout.segments.size();
  for (size_t i = 0; i < n; ++i) {
    // The segment's padded extent; the first segment also owns anything before it (offset 0 in practice).
    const int64_t lo = i == 0 ? 0 : layout.segments[i].offset;
    const int64_t hi = i + 1 < n ? layout.segments[i + 1].offset : layout.numel;
    const int64_t b = std::max(lo, shard.begin), e = std::min(hi, shard.end);
    if (b >= e) continue;
    const ParamHyper& h = hyper[i];
    if (!pieces.empty() && pieces.back().weight_decay == h.weight_decay &&
        pieces.back().lr_scale == h.lr_scale) {
      pieces.back().end = e - shard.begin;
    } else {
      pieces.push_back({b - shard.begin, e - shard.begin, h.weight_decay, h.lr_scale});
    }
  }
  CZ_ASSERT(
      pieces.empty() ? shard.numel() == 0 : pieces.front().begin == 0 && pieces.back().end == shard.numel(),
      "shard pieces do not tile the shard [{}, {})", shard.begin, shard.end);
  return pieces;
}

}  // namespace cz
