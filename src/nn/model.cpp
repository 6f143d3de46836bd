// The units a model's parameters fall into (model.h).
#include "nn/model.h"

namespace cz::nn {

std::vector<std::string> ModelSpec::units() const {
  std::vector<std::string> units;
  for (const ParamInfo& p : parameters())
    if (units.empty() || units.back() != p.unit) units.push_back(p.unit);
  return units;
}

}  // namespace cz::nn
