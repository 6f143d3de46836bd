// The flag table (src/dist/train/flags.h): what checkpoints record from it stays byte for byte what they
// recorded before the table existed, the rank-agreement set is the one the trainer checked, and the derived
// configurations read the flags they should.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "dist/train/flags.h"

namespace cz::train {
namespace {

using ::testing::HasSubstr;

TrainConfig custom_config() {
  TrainConfig c;
  c.depths = {1, 1, 1, 1};
  c.dims = {8, 16, 24, 32};
  c.num_classes = 4;
  c.data = "synthetic:n=256,eval_n=64,classes=4";
  c.ema_decay = 0.99;
  c.seed = 18446744073709551615ull;
  c.shuffle = false;
  c.augment = true;
  c.bucket_mb = 0.01;
  c.lr = 3e-3;
  return c;
}

// As checkpoints saved before the table record them (the keys are read by people and tools), plus the
// augmentation flags (aa, interpolation, recount, remode, reprob: added with them).
TEST(Flags, ConfigJsonIsWhatCheckpointsRecorded) {
  EXPECT_EQ(
      config_json(custom_config(), 2),
      R"({"aa":"","augment":true,"bucket_mb":0.01,"clip_grad":0.0,"data":"synthetic:n=256,eval_n=64,classes=4",)"
      R"("depths":[1,1,1,1],"dims":[8,16,24,32],"drop_path":0.0,"ema_decay":0.99,"epochs":0,"eval_split":0.0,)"
      R"("gather_dtype":"fp32","grad_accum":1,"hpz":false,"image_size":64,"interpolation":"bilinear",)"
      R"("label_smoothing":0.0,"lr":0.003,"micro_batch":32,)"
      R"("min_lr":1e-06,"model":"atto","num_classes":4,"offload_optimizer":false,"optimizer":"adamw",)"
      R"("precision":"fp32","recount":1,"reduce_dtype":"fp32","remode":"pixel","reprob":0.0,)"
      R"("schedule":"cosine","seed":18446744073709551615,)"
      R"("shard_group":"world","shuffle":false,"stage":0,)"
      R"("steps":0,"warmup_steps":0,"weight_decay":0.05,"world_size":2})");
}

// Resuming compares these with the strings a checkpoint holds ("flag--dims" = "8,16,24,32").
TEST(Flags, ResumeIdentityIsWhatCheckpointsRecorded) {
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(resume_identity(custom_config()), (Pairs{{"--model", "custom"},
                                                     {"--depths", "1,1,1,1"},
                                                     {"--dims", "8,16,24,32"},
                                                     {"--num-classes", "4"},
                                                     {"--data", "synthetic:n=256,eval_n=64,classes=4"},
                                                     {"--eval-split", "0"},
                                                     {"--optimizer", "adamw"},
                                                     {"--ema-decay", "on"},
                                                     {"--seed", "18446744073709551615"}}));
  TrainConfig c;
  c.model = "tiny";
  c.optimizer = "sgd";
  c.seed = 7;
  EXPECT_EQ(resume_identity(c), (Pairs{{"--model", "tiny"},
                                       {"--depths", ""},
                                       {"--dims", ""},
                                       {"--num-classes", "10"},
                                       {"--data", "synthetic"},
                                       {"--eval-split", "0"},
                                       {"--optimizer", "sgd"},
                                       {"--ema-decay", "off"},
                                       {"--seed", "7"}}));
}

TEST(Flags, RanksAgreeOnTheFlagsTheTrainerChecked) {
  std::set<std::string> agreed;
  for (const Flag& f : flags())
    if (f.ranks_agree) agreed.insert(f.name);
  EXPECT_EQ(agreed, (std::set<std::string>{"--model",
                                           "--depths",
                                           "--dims",
                                           "--num-classes",
                                           "--image-size",
                                           "--stage",
                                           "--shard-group",
                                           "--hpz",
                                           "--bucket-mb",
                                           "--prefetch",
                                           "--reduce-dtype",
                                           "--gather-dtype",
                                           "--offload-optimizer",
                                           "--offload-overlap-step",
                                           "--precision",
                                           "--micro-batch",
                                           "--grad-accum",
                                           "--optimizer",
                                           "--activation-checkpointing",
                                           "--drop-path",
                                           "--data",
                                           "--eval-split",
                                           "--steps",
                                           "--epochs",
                                           "--seed",
                                           "--lr",
                                           "--clip-grad",
                                           "--ema-decay",
                                           "--init-weights",
                                           "--comm-impl",
                                           "--comm-backend",
                                           "--interpolation",
                                           "--aa",
                                           "--reprob",
                                           "--remode",
                                           "--recount"}));
}

TEST(Flags, NamesAndKeysAreUniqueAndFound) {
  std::set<std::string> names, keys;
  for (const Flag& f : flags()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_EQ(std::string(f.name).rfind("--", 0), 0u) << f.name;
    if (f.json_key) {
      EXPECT_TRUE(keys.insert(f.json_key).second) << f.json_key;
    }
    EXPECT_EQ(&flag_of(f.field), &f) << f.name;  // one flag per field
    EXPECT_FALSE(f.inverted && !std::holds_alternative<bool TrainConfig::*>(f.field)) << f.name;
  }
  EXPECT_STREQ(flag_name(&TrainConfig::shuffle), "--no-shuffle");
  EXPECT_STREQ(flag_name(&TrainConfig::bucket_mb), "--bucket-mb");
}

TEST(Flags, FlagValueAsTheRanksCompareIt) {
  const TrainConfig c = custom_config();
  EXPECT_EQ(flag_value(c, flag_of(&TrainConfig::dims)), "8,16,24,32");
  EXPECT_EQ(flag_value(c, flag_of(&TrainConfig::bucket_mb)), "0.01");
  EXPECT_EQ(flag_value(c, flag_of(&TrainConfig::micro_batch)), "32");
  EXPECT_EQ(flag_value(c, flag_of(&TrainConfig::data)), c.data);
}

TEST(Flags, ValidateNamesTheFlagWithItsMessage) {
  TrainConfig c;
  c.stage = 4;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--stage must be 0, 1, 2 or 3, got 4");
  c = {};
  c.bucket_mb = 0;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--bucket-mb must be in (0, 65536], got 0");
  c = {};
  c.offload_overlap_step = true;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--offload-overlap-step needs --offload-optimizer");
  c = {};
  c.dims = {8};
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--depths and --dims go together (got 0 depths and 1 dims)");
  c = {};
  c.min_lr = 1;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--min-lr must be in [0, --lr], got 1");
  c = {};
  c.checkpoint_every = 5;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--checkpoint-every needs --checkpoint-dir");
  c = {};
  c.shard_group = "0";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--shard-group must be world, host or a number of ranks >= 1, got '0'");
  c = {};
  c.hpz = true;
  c.stage = 2;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--hpz is for --stage 3, got --stage 2");
  c.stage = 3;
  c.shard_group = "host";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--hpz shards over the world; with --shard-group host the shard already stays within its group");
  c = {};
  c.comm_impl = "tree";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--comm-impl must be flat, hier or auto, got 'tree'");
  c = {};
  c.interpolation = "lanczos";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--interpolation must be bilinear or bicubic, got 'lanczos'");
  c = {};
  c.aa = "rand-m9-x3";
  EXPECT_THAT(error_of<std::exception>([&] { c.validate(); }),
              HasSubstr("--aa 'rand-m9-x3': unknown key 'x' in section 'x3'"));
  c = {};
  c.reprob = 1.5;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--reprob must be a probability in [0, 1], got 1.5");
  c = {};
  c.remode = "zero";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--remode must be const, rand or pixel, got 'zero'");
  c = {};
  c.recount = 0;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--recount must be in [1, 64], got 0");
  EXPECT_EQ(error_of<std::exception>([] { TrainConfig{}.validate(); }), "(no error)");
}

TEST(Flags, DerivedConfigurations) {
  EXPECT_EQ(bucket_bytes(25), int64_t(25) << 20);
  EXPECT_EQ(bucket_bytes(1e-9), 1);  // at least one byte
  TrainConfig c = custom_config();
  c.stage = 2;
  c.prefetch = 3;
  c.reduce_dtype = "bf16";
  c.offload_optimizer = c.offload_overlap_step = true;
  const zero::ZeroConfig z = zero_config(c, Device::cpu());
  EXPECT_EQ(z.stage, 2);
  EXPECT_EQ(z.bucket_bytes, bucket_bytes(0.01));
  EXPECT_EQ(z.prefetch, 3);
  EXPECT_EQ(z.compute_dtype, DType::f32);
  EXPECT_EQ(z.reduce_dtype, DType::bf16);
  EXPECT_TRUE(z.offload && z.offload_overlap_step);
  EXPECT_EQ(world_algorithm(TrainConfig{}), dist::Algorithm::automatic);  // the ring on one host
  c.comm_impl = "flat";
  EXPECT_EQ(world_algorithm(c), dist::Algorithm::ring);
  c.comm_impl = "hier";
  EXPECT_EQ(world_algorithm(c), dist::Algorithm::hier);
  c.precision = "bf16";
  EXPECT_EQ(compute_dtype(c, true), DType::bf16);
  EXPECT_THAT(error_of<std::exception>([&] { compute_dtype(c, false); }),
              HasSubstr("--precision bf16 needs --device cuda (the CPU backend computes in fp32)"));
}

// --checkpoint-sync publishes the periodic checkpoints: without them it has nothing to do.
TEST(Flags, CheckpointSyncNeedsPeriodicCheckpoints) {
  TrainConfig c;
  c.checkpoint_sync = true;
  c.checkpoint_dir = "ck";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }), "--checkpoint-sync needs --checkpoint-every");
  c.checkpoint_every = 5;
  EXPECT_NO_THROW(c.validate());
}

}  // namespace
}  // namespace cz::train
