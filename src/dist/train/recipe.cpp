// The recipe table (Note [Recipes]) and applying it over the flag table.
#include "dist/train/recipe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include "dist/train/flags.h"
#include "tensor/check.h"

namespace cz::train {
namespace {

// The recipes' common part: facebookresearch/ConvNeXt main.py's defaults (timm's Mixup with smoothing
// folded in, RandAugment, random erasing, bicubic resize of the random-resized crop, cosine to 1e-6, AdamW).
std::vector<RecipeValue> official_defaults() {
  return {{"--optimizer", "adamw"},
          {"--schedule", "cosine"},
          {"--min-lr", "1e-6"},
          {"--image-size", "224"},
          {"--augment", "true"},
          {"--interpolation", "bicubic"},
          {"--aa", "rand-m9-mstd0.5-inc1"},
          {"--reprob", "0.25"},
          {"--remode", "pixel"},
          {"--recount", "1"},
          {"--label-smoothing", "0.1"},
          {"--mixup-prob", "1.0"},
          {"--mixup-switch-prob", "0.5"},
          {"--mixup-mode", "batch"},
          {"--layer-scale-init", "1e-6"}};
}

std::vector<Recipe> make_recipes() {
  Recipe in1k{
      .name = "convnext-in1k",
      .source = "ConvNeXt-T on ImageNet-1k: facebookresearch/ConvNeXt main.py defaults and TRAINING.md",
      .lr = 4e-3,
      .lr_batch = 4096,
      .values = official_defaults()};
  for (RecipeValue v : std::vector<RecipeValue>{{"--weight-decay", "0.05"},
                                                {"--epochs", "300"},
                                                {"--warmup-epochs", "20", "--warmup-steps"},
                                                {"--mixup", "0.8"},
                                                {"--cutmix", "1.0"},
                                                {"--drop-path", "0.1"},
                                                {"--ema-decay", "0.9999"}})
    in1k.values.push_back(v);
  // TRAINING.md's fine-tuning of ImageNet-22k weights on ImageNet-1k at 224 (ConvNeXt-B: drop path 0.2;
  // L 0.3, XL 0.4), 2 nodes x 8 GPUs x 32 images: lr 5e-5 at 512.
  Recipe finetune{.name = "convnext-finetune",
                  .source =
                      "ConvNeXt-B fine-tuning, ImageNet-22k to 1k at 224: facebookresearch/ConvNeXt "
                      "TRAINING.md over main.py's defaults",
                  .lr = 5e-5,
                  .lr_batch = 512,
                  .needs_weights = true,
                  .values = official_defaults()};
  for (RecipeValue v : std::vector<RecipeValue>{{"--weight-decay", "1e-8"},
                                                {"--epochs", "30"},
                                                {"--warmup-epochs", "0", "--warmup-steps"},
                                                {"--layer-decay", "0.8"},
                                                {"--head-init-scale", "0.001"},
                                                {"--mixup", "0"},
                                                {"--cutmix", "0"},
                                                {"--drop-path", "0.2"},
                                                {"--ema-decay", "0"}})
    finetune.values.push_back(v);
  // ConvNeXt V2-Base fine-tuning of FCMAE-pretrained weights on ImageNet-1k at 224: the published settings
  // (facebookresearch/ConvNeXt-V2 TRAINING.md, over main_finetune.py's defaults, which share V1's
  // augmentation and schedule): lr = 6.25e-4 x batch / 256 ("blr"), 100 epochs, 20 of warmup, layer decay
  // 0.6 over the 12 grouped layers (its 'group' type, Note [Layer-wise lr decay numbering]), weight decay
  // 0.05, drop path 0.1, Mixup 0.8 / CutMix 1.0, label smoothing 0.1, EMA (0.9999) and the head drawn at
  // std 2e-5 (timm's 0.02 x 0.001). V2 blocks have no layer scale, so that default is left out.
  Recipe v2{.name = "convnextv2-finetune",
            .source =
                "ConvNeXt V2-Base fine-tuning of FCMAE weights on ImageNet-1k at 224: "
                "facebookresearch/ConvNeXt-V2 TRAINING.md over main_finetune.py's defaults",
            .lr = 6.25e-4,
            .lr_batch = 256,
            .needs_weights = true,
            .values = {}};
  for (const RecipeValue& v : official_defaults())
    if (std::string(v.flag) != "--layer-scale-init") v2.values.push_back(v);
  for (RecipeValue v : std::vector<RecipeValue>{{"--weight-decay", "0.05"},
                                                {"--epochs", "100"},
                                                {"--warmup-epochs", "20", "--warmup-steps"},
                                                {"--layer-decay", "0.6"},
                                                {"--head-init-scale", "0.001"},
                                                {"--mixup", "0.8"},
                                                {"--cutmix", "1.0"},
                                                {"--drop-path", "0.1"},
                                                {"--ema-decay", "0.9999"}})
    v2.values.push_back(v);
  return {in1k, finetune, v2};
}

std::string joined(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string out;
  for (const auto& [flag, value] : pairs) out += fmt::format("{}{} {}", out.empty() ? "" : " ", flag, value);
  return out;
}

}  // namespace

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> table = make_recipes();
  return table;
}

const Recipe* find_recipe(const std::string& name) {
  for (const Recipe& r : recipes())
    if (name == r.name) return &r;
  return nullptr;
}

std::string recipe_names() {
  std::string out;
  for (const Recipe& r : recipes()) out += fmt::format("{}{}", out.empty() ? "" : " | ", r.name);
  return out;
}

bool RecipeReport::sets(const std::string& flag) const {
  for (const auto& [f, v] : applied)
    if (f == flag) return true;
  return false;
}

RecipeReport apply_recipe(TrainConfig& c, const std::function<bool(const std::string& flag)>& given) {
  RecipeReport r;
  if (c.recipe.empty()) return r;
  const Recipe* recipe = find_recipe(c.recipe);
  CZ_CHECK(recipe != nullptr, "{} must be one of {}, got '{}'", flag_name(&TrainConfig::recipe),
           recipe_names(), c.recipe);
  r.name = recipe->name;
  for (const RecipeValue& v : recipe->values) {
    const Flag* f = find_flag(v.flag);
    const char* instead = given(v.flag) ? v.flag : v.unless && given(v.unless) ? v.unless : nullptr;
    if (instead != nullptr) {
      const Flag* g = find_flag(instead);
      r.overridden.push_back(
          fmt::format("{} {} (recipe: {} {})", instead, g ? flag_value(c, *g) : "?", v.flag, v.value));
      continue;
    }
    CZ_CHECK(f != nullptr, "recipe {} names {}, which is not a flag", recipe->name, v.flag);  // a bug
    set_flag_value(c, *f, v.value);
    r.applied.emplace_back(v.flag, v.value);
  }
  CZ_CHECK(!recipe->needs_weights || !c.init_weights.empty() || !c.resume.empty(),
           "{} {} fine-tunes trained weights: give {} FILE (or {} a checkpoint of this fine-tune)",
           flag_name(&TrainConfig::recipe), c.recipe, flag_name(&TrainConfig::init_weights),
           flag_name(&TrainConfig::resume));
  return r;
}

void apply_recipe_lr(TrainConfig& c, int world, bool lr_given, RecipeReport& r) {
  const Recipe* recipe = find_recipe(c.recipe);
  if (recipe == nullptr) return;
  const std::string lr = flag_name(&TrainConfig::lr);
  if (lr_given) {
    r.lr_note = fmt::format("{} {} given ({} {:g} at global batch {})", lr, c.lr, recipe->name, recipe->lr,
                            recipe->lr_batch);
    return;
  }
  const int64_t batch = c.global_batch(world);
  c.lr = recipe->lr * double(batch) / double(recipe->lr_batch);
  r.lr_note = fmt::format("{} {:g} ({:g} at global batch {}, scaled to {})", lr, c.lr, recipe->lr,
                          recipe->lr_batch, batch);
}

std::string format_recipe(const RecipeReport& r) {
  if (r.name.empty()) return "";
  std::string out =
      fmt::format("recipe {}: {}{}{}\n", r.name, r.lr_note, r.applied.empty() ? "" : " ", joined(r.applied));
  if (!r.overridden.empty())
    out += fmt::format("recipe {}: given instead: {}\n", r.name, fmt::join(r.overridden, ", "));
  return out;
}

}  // namespace cz::train
