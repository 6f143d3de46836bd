// ConvNeXt's parameter list, mirroring the module tree of src/nn/convnext.cpp.
#include "dist/plan/model_shapes.h"

#include <fmt/format.h>

namespace cz::plan {
namespace {

void add(std::vector<ParamInfo>& out, std::string name, Shape shape, const std::string& unit) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  out.push_back({std::move(name), std::move(shape), n, unit});
}

}  // namespace

std::vector<ParamInfo> convnext_parameters(const nn::ConvNeXtConfig& cfg) {
  cfg.validate();
  std::vector<ParamInfo> p;
  const int64_t c0 = cfg.dims[0], k = cfg.kernel;
  add(p, "stem.0.weight", {c0, cfg.in_chans, 4, 4}, "stem");
  add(p, "stem.0.bias", {c0}, "stem");
  add(p, "stem.1.weight", {c0}, "stem");
  add(p, "stem.1.bias", {c0}, "stem");
  for (size_t i = 0; i < cfg.depths.size(); ++i) {
    const int64_t c = cfg.dims[i];
    const std::string stage = fmt::format("stages.{}.", i);
    if (i > 0) {
      const int64_t prev = cfg.dims[i - 1];
      const std::string unit = stage + "downsample";
      add(p, unit + ".0.weight", {prev}, unit);
      add(p, unit + ".0.bias", {prev}, unit);
      add(p, unit + ".1.weight", {c, prev, 2, 2}, unit);
      add(p, unit + ".1.bias", {c}, unit);
    }
    for (int64_t j = 0; j < cfg.depths[i]; ++j) {
      const std::string unit = fmt::format("{}blocks.{}", stage, j), b = unit + ".";
      if (cfg.layer_scale_init > 0) add(p, b + "gamma", {c}, unit);  // the block's own parameter comes first
      add(p, b + "conv_dw.weight", {c, 1, k, k}, unit);
      add(p, b + "conv_dw.bias", {c}, unit);
      add(p, b + "norm.weight", {c}, unit);
      add(p, b + "norm.bias", {c}, unit);
      add(p, b + "mlp.fc1.weight", {4 * c, c}, unit);
      add(p, b + "mlp.fc1.bias", {4 * c}, unit);
      add(p, b + "mlp.fc2.weight", {c, 4 * c}, unit);
      add(p, b + "mlp.fc2.bias", {c}, unit);
    }
  }
  const int64_t last = cfg.dims.back();
  add(p, "head.norm.weight", {last}, "head");
  add(p, "head.norm.bias", {last}, "head");
  add(p, "head.fc.weight", {cfg.num_classes, last}, "head");
  add(p, "head.fc.bias", {cfg.num_classes}, "head");
  return p;
}

int64_t flat_numel(const std::vector<ParamInfo>& params, int64_t align) {
  int64_t n = 0;
  for (const ParamInfo& p : params) n += (p.numel + align - 1) / align * align;
  return n;
}

}  // namespace cz::plan
