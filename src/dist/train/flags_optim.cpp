// The optimizer and schedule entries of the flag table (flags.h): the recipe, optimizer, learning rate and
// its schedule, clipping, accumulation, layer decay, steps and epochs.
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

std::vector<Flag> optim_flags() {
  using C = const TrainConfig&;
  using F = const Flag&;
  using T = TrainConfig;
  return {
      {.name = "--recipe",
       .field = &T::recipe,
       .group = kOptimGroup,
       .help = "a named recipe's values for every flag not given (the header lists them): " + recipe_names() +
               " (docs/training.md)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.recipe.empty() || find_recipe(c.recipe), "{} must be one of {}, got '{}'", f.name,
                      recipe_names(), c.recipe);
           },
       .ranks_agree = true,
       .json_key = "recipe"},
      {.name = "--steps",
       .field = &T::steps,
       .group = kOptimGroup,
       .help = "optimizer steps (0: use --epochs; without --steps and --epochs: the default run)",
       .check = [](C c, F f) { CZ_CHECK(c.steps >= 0, "{} must be >= 0, got {}", f.name, c.steps); },
       .ranks_agree = true,
       .json_key = "steps"},
      {.name = "--epochs",
       .field = &T::epochs,
       .group = kOptimGroup,
       .help = "passes over the training set (when --steps is 0)",
       .check = [](C c, F f) { CZ_CHECK(c.epochs >= 0, "{} must be >= 0, got {}", f.name, c.epochs); },
       .ranks_agree = true,
       .json_key = "epochs"},
      {.name = "--micro-batch",
       .field = &T::micro_batch,
       .group = kOptimGroup,
       .help = "images per rank per micro-step",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.micro_batch > 0, "{} must be positive, got {}", f.name, c.micro_batch);
           },
       .ranks_agree = true,
       .json_key = "micro_batch"},
      {.name = "--grad-accum",
       .field = &T::grad_accum,
       .group = kOptimGroup,
       .help = "micro-steps per optimizer step",
       .check = [](C c,
                   F f) { CZ_CHECK(c.grad_accum > 0, "{} must be positive, got {}", f.name, c.grad_accum); },
       .ranks_agree = true,
       .json_key = "grad_accum"},
      {.name = "--optimizer",
       .field = &T::optimizer,
       .group = kOptimGroup,
       .help = "adamw | sgd",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.optimizer == "adamw" || c.optimizer == "sgd", "{} must be adamw or sgd, got '{}'",
                      f.name, c.optimizer);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "optimizer"},
      {.name = "--lr",
       .field = &T::lr,
       .group = kOptimGroup,
       .help = "peak learning rate",
       .check = [](C c, F f) { CZ_CHECK(c.lr >= 0, "{} must be >= 0, got {}", f.name, c.lr); },
       .ranks_agree = true,
       .json_key = "lr"},
      {.name = "--min-lr",
       .field = &T::min_lr,
       .group = kOptimGroup,
       .help = "final learning rate of the cosine schedule",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.min_lr >= 0 && c.min_lr <= c.lr, "{} must be in [0, {}], got {}", f.name,
                      flag_name(&T::lr), c.min_lr);
           },
       .json_key = "min_lr"},
      {.name = "--weight-decay",
       .field = &T::weight_decay,
       .group = kOptimGroup,
       .help = "decoupled weight decay (not on biases and 1-D params)",
       .check = [](C c,
                   F f) { CZ_CHECK(c.weight_decay >= 0, "{} must be >= 0, got {}", f.name, c.weight_decay); },
       .json_key = "weight_decay"},
      {.name = "--layer-decay",
       .field = &T::layer_decay,
       .group = kOptimGroup,
       .help = "layer-wise lr decay D: each parameter's lr times D^(13 - its layer), ConvNeXt's official "
               "numbering (stem 0 .. head 13; --print-param-groups shows them; 1: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.layer_decay) && c.layer_decay > 0,
                      "{} must be a finite value > 0, got {}", f.name, c.layer_decay);
             if (c.layer_decay != 1.0) nn::check_layer_decay_numbering(c.model_config());
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "layer_decay"},
      {.name = "--momentum",
       .field = &T::momentum,
       .group = kOptimGroup,
       .help = "SGD momentum",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.momentum >= 0 && c.momentum < 1, "{} must be in [0, 1), got {}", f.name, c.momentum);
           }},
      {.name = "--warmup-steps",
       .field = &T::warmup_steps,
       .group = kOptimGroup,
       .help = "linear warmup steps",
       .check = [](C c,
                   F f) { CZ_CHECK(c.warmup_steps >= 0, "{} must be >= 0, got {}", f.name, c.warmup_steps); },
       .json_key = "warmup_steps"},
      {.name = "--warmup-epochs",
       .field = &T::warmup_epochs,
       .group = kOptimGroup,
       .help =
           "linear warmup in epochs of the training set (rounded to whole steps), instead of --warmup-steps",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.warmup_epochs) && c.warmup_epochs >= 0, "{} must be >= 0, got {}",
                      f.name, c.warmup_epochs);
             CZ_CHECK(c.warmup_epochs == 0 || c.warmup_steps == 0, "give {} or {}, not both (got {} and {})",
                      flag_name(&T::warmup_steps), f.name, c.warmup_steps, c.warmup_epochs);
           },
       .ranks_agree = true,
       .json_key = "warmup_epochs"},
      {.name = "--schedule",
       .field = &T::schedule,
       .group = kOptimGroup,
       .help = "cosine | constant",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.schedule == "cosine" || c.schedule == "constant",
                      "{} must be cosine or constant, got '{}'", f.name, c.schedule);
           },
       .json_key = "schedule"},
      {.name = "--clip-grad",
       .field = &T::clip_grad,
       .group = kOptimGroup,
       .help = "global gradient-norm clipping (0: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.clip_grad >= 0, "{} must be >= 0 (0 disables clipping), got {}", f.name, c.clip_grad);
           },
       .ranks_agree = true,
       .json_key = "clip_grad"},
  };
}

}  // namespace cz::train
