// Named recipes (src/dist/train/recipe.h, Note [Recipes]): every value keyed by a flag of the table (or by
// one other work is adding), given flags win, --lr follows the global batch, and the values are the
// official ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "common/error_of.h"
#include "dist/train/flags.h"
#include "dist/train/recipe.h"

namespace cz::train {
namespace {

using ::testing::HasSubstr;

TEST(Recipes, EveryValueNamesAFlagOfTheTable) {
  for (const Recipe& r : recipes()) {
    std::set<std::string> seen;
    for (const RecipeValue& v : r.values) {
      EXPECT_NE(find_flag(v.flag), nullptr) << r.name << " names " << v.flag << ", which is not a flag";
      EXPECT_TRUE(seen.insert(v.flag).second) << r.name << " names " << v.flag << " twice";
      if (v.unless) {
        EXPECT_NE(find_flag(v.unless), nullptr) << r.name << ": " << v.unless;
      }
    }
  }
}

TEST(Recipes, In1kSetsTheOfficialValuesAndGivenFlagsWin) {
  TrainConfig c;
  c.recipe = "convnext-in1k";
  c.weight_decay = 0.01;  // as if given
  const std::set<std::string> given = {"--weight-decay"};
  RecipeReport r = apply_recipe(c, [&](const std::string& f) { return given.count(f) > 0; });
  EXPECT_EQ(c.weight_decay, 0.01);
  EXPECT_EQ(c.epochs, 300);
  EXPECT_EQ(c.warmup_epochs, 20);
  EXPECT_EQ(c.min_lr, 1e-6);
  EXPECT_EQ(c.drop_path, 0.1);
  EXPECT_EQ(c.ema_decay, 0.9999);
  EXPECT_EQ(c.label_smoothing, 0.1);
  EXPECT_EQ(c.layer_scale_init, 1e-6);
  EXPECT_EQ(c.image_size, 224);
  EXPECT_TRUE(c.augment);
  EXPECT_EQ(c.optimizer, "adamw");
  EXPECT_EQ(c.schedule, "cosine");
  EXPECT_EQ(c.layer_decay, 1.0);
  EXPECT_TRUE(r.sets("--epochs"));
  EXPECT_FALSE(r.sets("--weight-decay"));
  EXPECT_THAT(r.overridden, ::testing::ElementsAre("--weight-decay 0.01 (recipe: --weight-decay 0.05)"));
  // The whole recipe is applied: the augmentations and mixing too.
  EXPECT_EQ(c.aa, "rand-m9-mstd0.5-inc1");
  EXPECT_EQ(c.interpolation, "bicubic");
  EXPECT_EQ(c.reprob, 0.25);
  EXPECT_EQ(c.remode, "pixel");
  EXPECT_EQ(c.mixup, 0.8);
  EXPECT_EQ(c.cutmix, 1.0);
  // 4e-3 at 4096, linearly: 2 ranks x 32 x 2 = 128 -> 1.25e-4.
  c.micro_batch = 32;
  c.grad_accum = 2;
  apply_recipe_lr(c, 2, false, r);
  EXPECT_DOUBLE_EQ(c.lr, 4e-3 * 128 / 4096);
  EXPECT_THAT(r.lr_note, HasSubstr("global batch 4096, scaled to 128"));
  c.validate();
  const std::string header = format_recipe(r);
  EXPECT_THAT(header, HasSubstr("recipe convnext-in1k: --lr 0.000125"));
  EXPECT_THAT(header, HasSubstr("--epochs 300"));
  EXPECT_THAT(header, HasSubstr("given instead: --weight-decay 0.01"));
}

TEST(Recipes, WarmupStepsGivenDisplaceTheRecipesWarmupEpochs) {
  TrainConfig c;
  c.recipe = "convnext-in1k";
  c.warmup_steps = 5;
  RecipeReport r = apply_recipe(c, [](const std::string& f) { return f == "--warmup-steps"; });
  EXPECT_EQ(c.warmup_epochs, 0);
  EXPECT_THAT(r.overridden, ::testing::Contains("--warmup-steps 5 (recipe: --warmup-epochs 20)"));
  c.validate();
  c.lr = 1e-3;
  apply_recipe_lr(c, 1, true, r);  // --lr given: kept
  EXPECT_EQ(c.lr, 1e-3);
}

TEST(Recipes, FinetuneIsTheOfficialFineTuningAndNeedsWeights) {
  TrainConfig c;
  c.recipe = "convnext-finetune";
  const auto none = [](const std::string&) { return false; };
  EXPECT_THAT(error_of<ValueError>([&] { apply_recipe(c, none); }),
              HasSubstr("--recipe convnext-finetune fine-tunes trained weights: give --init-weights FILE"));
  c = TrainConfig{};
  c.recipe = "convnext-finetune";
  c.init_weights = "w.h5";
  RecipeReport r = apply_recipe(c, none);
  EXPECT_EQ(c.layer_decay, 0.8);
  EXPECT_EQ(c.head_init_scale, 0.001);
  EXPECT_EQ(c.weight_decay, 1e-8);
  EXPECT_EQ(c.epochs, 30);
  EXPECT_EQ(c.warmup_epochs, 0);
  EXPECT_EQ(c.ema_decay, 0);
  c.micro_batch = 32;
  apply_recipe_lr(c, 16, false, r);  // 16 x 32 = 512: the documented batch, the documented lr
  EXPECT_DOUBLE_EQ(c.lr, 5e-5);
}

TEST(Recipes, V2FinetuneIsTheFcmaeFineTuningOfConvNeXtV2Base) {
  TrainConfig c;
  c.recipe = "convnextv2-finetune";
  c.model = "convnextv2_base";
  const auto none = [](const std::string&) { return false; };
  EXPECT_THAT(error_of<ValueError>([&] { apply_recipe(c, none); }),
              HasSubstr("--recipe convnextv2-finetune fine-tunes trained weights: give --init-weights FILE"));
  c.init_weights = "w.h5";
  RecipeReport r = apply_recipe(c, none);
  EXPECT_EQ(c.layer_decay, 0.6);
  EXPECT_EQ(c.head_init_scale, 0.001);
  EXPECT_EQ(c.weight_decay, 0.05);
  EXPECT_EQ(c.epochs, 100);
  EXPECT_EQ(c.warmup_epochs, 20);
  EXPECT_EQ(c.drop_path, 0.1);
  EXPECT_EQ(c.ema_decay, 0.9999);
  EXPECT_EQ(c.label_smoothing, 0.1);
  EXPECT_EQ(c.mixup, 0.8);
  EXPECT_EQ(c.cutmix, 1.0);
  EXPECT_EQ(c.reprob, 0.25);
  EXPECT_FALSE(r.sets("--layer-scale-init"));  // V2 blocks have none
  c.micro_batch = 32;
  apply_recipe_lr(c, 32, false, r);  // TRAINING.md: 32 GPUs x 32 = 1024 -> 6.25e-4 x 1024 / 256
  EXPECT_DOUBLE_EQ(c.lr, 2.5e-3);
  c.validate();
  EXPECT_TRUE(c.model_config().grn);
  EXPECT_EQ(c.model_config().layer_scale_init, 0);
}

TEST(Recipes, UnknownNamesAreRefusedWithTheKnownOnes) {
  TrainConfig c;
  c.recipe = "convnext-in22k";
  EXPECT_THAT(
      error_of<ValueError>([&] { c.validate(); }),
      HasSubstr("--recipe must be one of convnext-in1k | convnext-finetune | convnextv2-finetune, got "
                "'convnext-in22k'"));
}

TEST(Flags, SetFlagValueParsesEachKindAndNamesTheFlag) {
  TrainConfig c;
  set_flag_value(c, *find_flag("--lr"), "2.5e-3");
  EXPECT_EQ(c.lr, 2.5e-3);
  set_flag_value(c, *find_flag("--epochs"), "12");
  EXPECT_EQ(c.epochs, 12);
  set_flag_value(c, *find_flag("--depths"), "1,2,3,4");
  EXPECT_EQ(c.depths, (std::vector<int64_t>{1, 2, 3, 4}));
  set_flag_value(c, *find_flag("--augment"), "true");
  EXPECT_TRUE(c.augment);
  set_flag_value(c, *find_flag("--seed"), "18446744073709551615");
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  EXPECT_THAT(error_of<ValueError>([&] { set_flag_value(c, *find_flag("--lr"), "4e-3x"); }),
              HasSubstr("--lr: '4e-3x' is not a number"));
  EXPECT_THAT(error_of<ValueError>([&] { set_flag_value(c, *find_flag("--depths"), "1,,2"); }),
              HasSubstr("--depths: '' is not a number"));
  EXPECT_THAT(error_of<ValueError>([&] { set_flag_value(c, *find_flag("--augment"), "yes"); }),
              HasSubstr("--augment: expected true or false"));
}

}  // namespace
}  // namespace cz::train
