// The optimizer's per-parameter hyper-parameters for a run (timm's weight-decay rule, ConvNeXt's layer-wise
// lr decay) and their groups as the official ConvNeXt code names and prints them (`--print-param-groups`).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/train/config.h"
#include "optim/param_groups.h"

namespace cz::train {

// One entry per segment of `layout` (named as the model names its parameters): --weight-decay on what
// timm_decays, times nothing else; with --layer-decay D != 1 each lr_scale is D^(13 - layer id) (Note
// [Layer-wise lr decay numbering] in nn/convnext.h). Every ZeRO stage and offload build their optimizer
// from this over the whole layout, so a shard's pieces carry the scales of the parameters they cut.
std::vector<ParamHyper> param_hyper(const TrainConfig& c, const FlatLayout& layout);

// Parameters of equal (layer, weight decay), as the official code groups them: "layer_<id>_decay" /
// "layer_<id>_no_decay" with --layer-decay, "decay" / "no_decay" without. In order of first appearance.
struct ParamGroup {
  std::string name;
  int64_t layer = -1;  // -1 without --layer-decay
  double lr_scale = 1;
  double weight_decay = 0;
  std::vector<std::string> params;
  int64_t numel = 0;
};
std::vector<ParamGroup> param_groups(const TrainConfig& c);

// A table for people (each group's scale, decay, size and first..last parameter), and the same as JSON
// (every parameter named) for tools and tests.
std::string format_param_groups(const TrainConfig& c, const std::vector<ParamGroup>& groups);
nlohmann::json param_groups_json(const TrainConfig& c, const std::vector<ParamGroup>& groups);

}  // namespace cz::train
