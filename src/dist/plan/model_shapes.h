// ConvNeXt's parameters (names, shapes, registration order) and ZeRO-3 units, derived from a ConvNeXtConfig
// without building the model: the planner must answer for xlarge in well under a second, and building it
// would allocate and initialise 350M parameters. tests/dist/test_planner.cpp checks the list against the
// real module tree (nn::ConvNeXt::named_parameters()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/convnext.h"

namespace cz::plan {

struct ParamInfo {
  std::string name;  // as in nn::ConvNeXt::named_parameters(), e.g. "stages.1.blocks.0.mlp.fc1.weight"
  Shape shape;       // PyTorch layout, as registered
  int64_t numel = 0;
  std::string unit;  // the ZeRO-3 unit holding it: "stem", "stages.i.downsample", "stages.i.blocks.j", "head"
};

// In registration order (the order of the flat buffer): stem, then each stage's downsample and blocks (a
// block registers gamma before its children), then head.norm and head.fc.
std::vector<ParamInfo> convnext_parameters(const nn::ConvNeXtConfig& cfg);

// Elements of the flat buffer: each parameter's offset aligned to `align` elements (Note [Flat buffers]).
int64_t flat_numel(const std::vector<ParamInfo>& params, int64_t align = 16);

}  // namespace cz::plan
