// The GEMM shapes of a ConvNeXt training step (convnext_gemms.h).
#include "nn/convnext_gemms.h"

#include <algorithm>

#include <fmt/format.h>

#include "tensor/check.h"

namespace cz::nn {
namespace {

// A layer mapping `rows` rows of `in` values to `out` values, as linear_forward/linear_backward and the
// patchify convolution run it.
void add_layer(std::vector<NamedGemm>& out, const std::string& name, int64_t rows, int64_t in, int64_t outs,
               int64_t calls, bool input_grad) {
  out.push_back({name + " forward", {false, true, rows, outs, in}, calls});
  if (input_grad) out.push_back({name + " input grad", {false, false, rows, in, outs}, calls});
  out.push_back({name + " weight grad", {true, false, outs, in, rows}, calls});
}

}  // namespace

std::vector<NamedGemm> convnext_step_gemms(const ConvNeXtConfig& cfg, int64_t image, int64_t batch) {
  cfg.validate();
  CZ_CHECK(image >= 4 * (int64_t(1) << (cfg.dims.size() - 1)),
           "convnext_step_gemms: image {} is too small for {} stages", image, cfg.dims.size());
  CZ_CHECK(batch >= 1, "convnext_step_gemms: batch must be positive, got {}", batch);
  std::vector<NamedGemm> g;
  int64_t side = image / 4;
  add_layer(g, "stem", batch * side * side, 16 * cfg.in_chans, cfg.dims[0], 1, false);
  for (size_t i = 0; i < cfg.dims.size(); ++i) {
    const int64_t c = cfg.dims[i];
    if (i > 0) {
      side /= 2;
      add_layer(g, fmt::format("stage {} downsample", i), batch * side * side, 4 * cfg.dims[i - 1], c, 1,
                true);
    }
    const int64_t rows = batch * side * side;
    add_layer(g, fmt::format("stage {} fc1", i), rows, c, 4 * c, cfg.depths[i], true);
    add_layer(g, fmt::format("stage {} fc2", i), rows, 4 * c, c, cfg.depths[i], true);
  }
  add_layer(g, "head", batch, cfg.dims.back(), cfg.num_classes, 1, true);
  return g;
}

std::vector<cpu::GemmShape> distinct_gemm_shapes(const std::vector<NamedGemm>& gemms) {
  std::vector<cpu::GemmShape> s;
  for (const NamedGemm& g : gemms) s.push_back(g.shape);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

}  // namespace cz::nn
