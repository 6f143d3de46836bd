// Named recipes (`--recipe convnext-in1k`): the official ConvNeXt training and fine-tuning settings as
// (flag, value) pairs over the flag table, applied before the command line's own flags, which win.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/train/config.h"

namespace cz::train {

// Note [Recipes]: a recipe is data, keyed by flag name: every value of the published recipe is listed, so
// the table reads as the source does, and each names a flag of the table (test_recipe). Applying it sets
// each listed flag that the command line does not give. --lr is not a fixed value but `lr` at global batch
// `lr_batch`, scaled linearly to the run's global batch (the official README's rule), once the world size is
// known.
struct RecipeValue {
  const char* flag;
  const char* value;
  const char* unless = nullptr;  // skipped when this other flag is given (--warmup-epochs for --warmup-steps)
};

struct Recipe {
  const char* name;
  const char* source;  // where the values come from, for the header and --help
  double lr = 0;       // --lr at global batch lr_batch
  int64_t lr_batch = 1;
  bool needs_weights = false;  // a fine-tune: --init-weights (or --resume) is required
  std::vector<RecipeValue> values;
};

const std::vector<Recipe>& recipes();
const Recipe* find_recipe(const std::string& name);
std::string recipe_names();  // "convnext-in1k | convnext-finetune | convnextv2-finetune"

// What applying a recipe did, for the header.
struct RecipeReport {
  std::string name;
  std::vector<std::pair<std::string, std::string>> applied;  // (flag, value) set from the recipe
  std::vector<std::string> overridden;  // "--epochs 2 (recipe: 300)": what the command line gave instead
  std::string lr_note;                  // how --lr came about
  bool sets(const std::string& flag) const;
};

// Applies c.recipe (if any) to `c` for every flag `given` says the command line did not set; --lr waits
// for apply_recipe_lr. Throws ValueError naming --recipe when the recipe needs what the run lacks.
RecipeReport apply_recipe(TrainConfig& c, const std::function<bool(const std::string& flag)>& given);
// --lr = recipe lr x global batch at `world` ranks / its batch, unless --lr was given.
void apply_recipe_lr(TrainConfig& c, int world, bool lr_given, RecipeReport& report);
// One line per part: what the recipe set, what the command line overrode, what this build lacks.
std::string format_recipe(const RecipeReport& report);

}  // namespace cz::train
