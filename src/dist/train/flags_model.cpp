// The model and weights entries of the flag table (flags.h): the architecture, weights to start from and to
// export, the classifier.
#include "dist/train/flags_table.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/comm/mesh.h"
#include "dist/train/recipe.h"
#include "dist/train/step_tracer.h"
#include "dist/zero/schedule.h"
#include "tensor/check.h"

namespace cz::train {

std::vector<Flag> model_flags() {
  using C = const TrainConfig&;
  using F = const Flag&;
  using T = TrainConfig;
  const std::string variants = fmt::format("{}", fmt::join(nn::convnext_variant_names(), "|"));
  return {
      {.name = "--model",
       .field = &T::model,
       .group = kModelGroup,
       .help = "ConvNeXt variant: " + variants,
       .check =
           [](C c, F f) {
             const auto names = nn::convnext_variant_names();
             CZ_CHECK(std::find(names.begin(), names.end(), c.model) != names.end(),
                      "{} must be one of {}, got '{}'", f.name, fmt::join(names, ", "), c.model);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .resume_spelling = [](C c) { return c.depths.empty() ? c.model : std::string("custom"); },
       .json_key = "model"},
      {.name = "--depths",
       .field = &T::depths,
       .group = kModelGroup,
       .help = "custom blocks per stage, e.g. 2,2,6,2 (with --dims)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.depths.empty() == c.dims.empty(), "{} and {} go together (got {} depths and {} dims)",
                      f.name, flag_name(&T::dims), c.depths.size(), c.dims.size());
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "depths"},
      {.name = "--dims",
       .field = &T::dims,
       .group = kModelGroup,
       .help = "custom channels per stage, e.g. 40,80,160,320 (with --depths)",
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "dims"},
      {.name = "--grn",
       .field = &T::grn,
       .group = kModelGroup,
       .help = "with --depths/--dims: ConvNeXt V2 blocks (GRN after the MLP's GELU, no layer scale), as "
               "--model convnextv2_* have",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.grn || !c.depths.empty(), "{} goes with {} (a --model convnextv2_* has GRN already)",
                      f.name, flag_name(&T::depths));
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "grn"},
      {.name = "--num-classes",
       .field = &T::num_classes,
       .group = kModelGroup,
       .help = "classifier outputs; 0: the training data's classes (a folder's class folders, cifar10's 10, "
               "an h5 file's num_classes attribute or largest label + 1, synthetic's classes=)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.num_classes > 0 || c.num_classes == kClassesOfTheData,
                      "{} must be positive (or 0: the data's classes), got {}", f.name, c.num_classes);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "num_classes"},
      {.name = "--image-size",
       .field = &T::image_size,
       .group = kModelGroup,
       .help = "square input size in pixels",
       .check = [](C c,
                   F f) { CZ_CHECK(c.image_size > 0, "{} must be positive, got {}", f.name, c.image_size); },
       .ranks_agree = true,
       .json_key = "image_size"},
      {.name = "--layer-scale-init",
       .field = &T::layer_scale_init,
       .group = kModelGroup,
       .help = "initial value of each block's layer scale gamma (0: no layer scale; V2 blocks have none)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.layer_scale_init) && c.layer_scale_init >= 0, "{} must be >= 0, got {}",
                      f.name, c.layer_scale_init);
           },
       .ranks_agree = true},
      {.name = "--head-init-scale",
       .field = &T::head_init_scale,
       .group = kModelGroup,
       .help = "multiply the classifier's initial weight and bias by this (fine-tuning: 0.001; applies to a "
               "head initialised here, not to one read with --init-weights)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.head_init_scale) && c.head_init_scale >= 0, "{} must be >= 0, got {}",
                      f.name, c.head_init_scale);
           },
       .ranks_agree = true},
      {.name = "--init-weights",
       .field = &T::init_weights,
       .group = kModelGroup,
       .help = "HDF5 weights to start from (timm or original ConvNeXt keys)",
       .ranks_agree = true},
      {.name = "--reset-head",
       .field = &T::reset_head,
       .group = kModelGroup,
       .help =
           "with --init-weights: a new classifier of --num-classes outputs (the data's classes by default)",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.reset_head || !c.init_weights.empty(), "{} needs {}", f.name,
                      flag_name(&T::init_weights));
           }},
  };
}

}  // namespace cz::train
