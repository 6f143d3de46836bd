// Weight decay and layer-wise lr decay per parameter, and the groups they form.
#include "dist/train/param_groups.h"

#include <algorithm>

#include <fmt/format.h>

#include "dist/train/flags.h"
#include "nn/convnext.h"

namespace cz::train {
namespace {

// The model's parameters as a layout of segments (offsets play no part in the hyper-parameters).
FlatLayout model_layout(const TrainConfig& c) {
  FlatLayout layout;
  for (const nn::ParamInfo& p : nn::convnext_parameters(c.model_config())) {
    layout.segments.push_back({p.name, layout.numel, p.numel, p.shape});
    layout.numel += p.numel;
  }
  return layout;
}

}  // namespace

std::vector<ParamHyper> param_hyper(const TrainConfig& c, const FlatLayout& layout) {
  std::vector<ParamHyper> hyper = timm_weight_decay(layout, c.weight_decay);
  if (c.layer_decay == 1.0) return hyper;
  nn::check_layer_decay_numbering(c.model_config());
  std::vector<int64_t> ids;
  for (const FlatSegment& s : layout.segments) ids.push_back(nn::convnext_layer_id(s.name));
  apply_layer_decay(hyper, ids, nn::kConvNeXtDecayLayers, c.layer_decay);
  return hyper;
}

std::vector<ParamGroup> param_groups(const TrainConfig& c) {
  const FlatLayout layout = model_layout(c);
  const std::vector<ParamHyper> hyper = param_hyper(c, layout);
  const bool layered = c.layer_decay != 1.0;
  std::vector<ParamGroup> groups;
  for (size_t i = 0; i < hyper.size(); ++i) {
    const FlatSegment& s = layout.segments[i];
    const bool decays = timm_decays(s);
    const int64_t layer = layered ? nn::convnext_layer_id(s.name) : -1;
    const std::string kind = decays ? "decay" : "no_decay";
    const std::string name = layered ? fmt::format("layer_{}_{}", layer, kind) : kind;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const ParamGroup& g) { return g.name == name; });
    if (it == groups.end()) {
      groups.push_back({name, layer, hyper[i].lr_scale, hyper[i].weight_decay, {}, 0});
      it = groups.end() - 1;
    }
    it->params.push_back(s.name);
    it->numel += s.numel;
  }
  return groups;
}

std::string format_param_groups(const TrainConfig& c, const std::vector<ParamGroup>& groups) {
  std::string out = fmt::format("parameter groups of {} ({} {}, {} {}):\n", c.model_config().name,
                                flag_name(&TrainConfig::weight_decay), c.weight_decay,
                                flag_name(&TrainConfig::layer_decay), c.layer_decay);
  out += fmt::format("{:<20} {:>14} {:>12} {:>7} {:>12}  parameters\n", "group", "lr scale", "weight decay",
                     "tensors", "elements");
  for (const ParamGroup& g : groups) {
    const std::string span =
        g.params.size() == 1 ? g.params.front() : fmt::format("{} .. {}", g.params.front(), g.params.back());
    out += fmt::format("{:<20} {:>14.8g} {:>12g} {:>7} {:>12}  {}\n", g.name, g.lr_scale, g.weight_decay,
                       g.params.size(), g.numel, span);
  }
  return out;
}

nlohmann::json param_groups_json(const TrainConfig& c, const std::vector<ParamGroup>& groups) {
  nlohmann::json j = {{"model", c.model_config().name},
                      {"weight_decay", c.weight_decay},
                      {"layer_decay", c.layer_decay},
                      {"num_layers", nn::kConvNeXtDecayLayers},
                      {"groups", nlohmann::json::array()}};
  for (const ParamGroup& g : groups)
    j["groups"].push_back({{"name", g.name},
                           {"layer", g.layer},
                           {"lr_scale", g.lr_scale},
                           {"weight_decay", g.weight_decay},
                           {"numel", g.numel},
                           {"params", g.params}});
  return j;
}

}  // namespace cz::train
