// The flag table (src/dist/train/flags.h): what checkpoints record from it stays byte for byte what they
// recorded before the table existed, the rank-agreement set is the one the trainer checked, and the derived
// configurations read the flags they should.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "dist/train/cli.h"
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
// Mixup/CutMix and augmentation flags (added with them).
TEST(Flags, ConfigJsonIsWhatCheckpointsRecorded) {
  EXPECT_EQ(
      config_json(custom_config(), 2),
      R"({"aa":"","augment":true,"bucket_mb":0.01,"clip_grad":0.0,"cutmix":0.0,"cutmix_minmax":"",)"
      R"("data":"synthetic:n=256,eval_n=64,classes=4",)"
      R"("depths":[1,1,1,1],"dims":[8,16,24,32],"drop_path":0.0,"ema_decay":0.99,"epochs":0,"eval_split":0.0,)"
      R"("gather_dtype":"fp32","grad_accum":1,"grn":false,"hpz":false,"image_size":64,)"
      R"("interpolation":"bilinear",)"
      R"("label_smoothing":0.0,"layer_decay":1.0,)"
      R"("lr":0.003,"micro_batch":32,)"
      R"("min_lr":1e-06,"mixup":0.0,"mixup_mode":"batch","mixup_prob":1.0,"mixup_switch_prob":0.5,)"
      R"("model":"atto","num_classes":4,"offload_optimizer":false,"optimizer":"adamw",)"
      R"("precision":"fp32","recipe":"","recount":1,"reduce_dtype":"fp32","remode":"pixel","reprob":0.0,)"
      R"("schedule":"cosine","seed":18446744073709551615,)"
      R"("shard_group":"world","shuffle":false,"stage":0,)"
      R"("steps":0,"warmup_epochs":0.0,"warmup_steps":0,"weight_decay":0.05,"world_size":2})");
}

// Resuming compares these with the strings a checkpoint holds ("flag--dims" = "8,16,24,32"), by name; the
// order is the table's (its --help sections), in which a resume names the first that differs.
TEST(Flags, ResumeIdentityIsWhatCheckpointsRecorded) {
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(resume_identity(custom_config()), (Pairs{{"--model", "custom"},
                                                     {"--depths", "1,1,1,1"},
                                                     {"--dims", "8,16,24,32"},
                                                     {"--grn", "false"},
                                                     {"--num-classes", "4"},
                                                     {"--data", "synthetic:n=256,eval_n=64,classes=4"},
                                                     {"--eval-split", "0"},
                                                     {"--seed", "18446744073709551615"},
                                                     {"--ema-decay", "on"},
                                                     {"--optimizer", "adamw"},
                                                     {"--layer-decay", "1"}}));
  TrainConfig c;
  c.model = "tiny";
  c.optimizer = "sgd";
  c.layer_decay = 0.75;
  c.seed = 7;
  EXPECT_EQ(resume_identity(c), (Pairs{{"--model", "tiny"},
                                       {"--depths", ""},
                                       {"--dims", ""},
                                       {"--grn", "false"},
                                       {"--num-classes", "10"},
                                       {"--data", "synthetic"},
                                       {"--eval-split", "0"},
                                       {"--seed", "7"},
                                       {"--ema-decay", "off"},
                                       {"--optimizer", "sgd"},
                                       {"--layer-decay", "0.75"}}));
}

TEST(Flags, RanksAgreeOnTheFlagsTheTrainerChecked) {
  std::set<std::string> agreed;
  for (const Flag& f : flags())
    if (f.ranks_agree) agreed.insert(f.name);
  EXPECT_EQ(agreed, (std::set<std::string>{"--model",
                                           "--depths",
                                           "--dims",
                                           "--grn",
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
                                           "--cuda-graphs",
                                           "--cpu-gemm",
                                           "--cpu-row-split",
                                           "--rank-stats-every",
                                           "--trace-steps",
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
                                           "--recipe",
                                           "--layer-decay",
                                           "--layer-scale-init",
                                           "--head-init-scale",
                                           "--warmup-epochs",
                                           "--mixup",
                                           "--cutmix",
                                           "--cutmix-minmax",
                                           "--mixup-prob",
                                           "--mixup-switch-prob",
                                           "--mixup-mode",

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
  c.cpu_gemm = "mkl";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--cpu-gemm must be one of auto, openblas, onednn, blis, libxsmm, got 'mkl'");
  for (const char* ok : {"auto", "openblas", "onednn", "blis", "libxsmm"}) {
    c.cpu_gemm = ok;
    EXPECT_NO_THROW(c.validate()) << ok;
  }
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
  c.mixup_mode = "rows";
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--mixup-mode must be batch, pair or elem, got 'rows'");
  c = {};
  c.cutmix = 1;
  c.micro_batch = 7;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--micro-batch 7: Mixup/CutMix mixes image i with image n-1-i of each rank's micro-batch, which "
            "must be "
            "even");
  c.micro_batch = 8;
  c.cutmix_minmax = "0.3,0.31";
  c.image_size = 32;
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--cutmix-minmax 0.3,0.31 with --image-size 32: box sides are drawn from [9, 9) pixels, which is "
            "empty");
  c = {};
  c.dump_batches = "b.txt";
  EXPECT_THAT(error_of<std::exception>([&] { c.validate(); }),
              HasSubstr("--dump-batches b.txt: the file must end"));
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

// The loader's mixing from the flags: timm's meanings, smoothing and classes from the run's own flags.
TEST(Flags, MixConfigFromTheFlags) {
  TrainConfig c;
  EXPECT_FALSE(c.mix_config().active());
  c.cutmix_minmax = "0.2,0.8";
  c.mixup_mode = "pair";
  c.label_smoothing = 0.1;
  c.num_classes = 37;
  const MixConfig m = c.mix_config();
  EXPECT_TRUE(m.active());
  EXPECT_EQ(m.cutmix_minmax, std::make_pair(0.2, 0.8));
  EXPECT_EQ(m.mode, MixMode::pair);
  EXPECT_EQ(m.label_smoothing, 0.1);
  EXPECT_EQ(m.num_classes, 37);
  EXPECT_EQ(m.prob, 1.0);
  EXPECT_EQ(m.switch_prob, 0.5);
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
  EXPECT_FALSE(cpu_bf16_gemms(c, true));
  // On the CPU bf16 is the GEMMs' precision in an fp32 model (Note [bf16 on the CPU]); fp16 is refused.
  EXPECT_EQ(compute_dtype(c, false), DType::f32);
  EXPECT_TRUE(cpu_bf16_gemms(c, false));
  c.precision = "fp16";
  EXPECT_EQ(compute_dtype(c, true), DType::f16);
  EXPECT_FALSE(cpu_bf16_gemms(c, false));
  EXPECT_THAT(error_of<std::exception>([&] { compute_dtype(c, false); }),
              HasSubstr("--precision fp16 needs --device cuda (the CPU backend has no fp16 compute"));
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

// The command line as convnext_zero registers it (cli.h): parses `words` into a TrainConfig.
TrainConfig parse(std::vector<std::string> words) {
  TrainConfig c;
  CLI::App app;
  take_last_values(app);
  add_flags(app, c);
  words.insert(words.begin(), "convnext_zero");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  app.parse(int(argv.size()), argv.data());
  return c;
}

// Note [Flags given twice]: the last value wins, as with argparse, so that `--steps N` appended to a printed
// resume command takes effect; lists too, and switches may be repeated.
TEST(Flags, AFlagGivenTwiceTakesTheLastValue) {
  const TrainConfig c = parse(
      {"--steps", "30",        "--lr",      "1e-3",         "--steps",      "50",         "--data=synthetic",
       "--data",  "h5:x.h5",   "--depths",  "1,1,1,1",      "--dims",       "8,16,24,32", "--depths",
       "2,2,6,2", "--augment", "--augment", "--no-shuffle", "--no-shuffle", "--lr=2e-3"});
  EXPECT_EQ(c.steps, 50);
  EXPECT_EQ(c.lr, 2e-3);
  EXPECT_EQ(c.data, "h5:x.h5");
  EXPECT_EQ(c.depths, (std::vector<int64_t>{2, 2, 6, 2}));
  EXPECT_EQ(c.dims, (std::vector<int64_t>{8, 16, 24, 32}));
  EXPECT_TRUE(c.augment);
  EXPECT_FALSE(c.shuffle);
  EXPECT_THAT(error_of<CLI::ParseError>([] {
                parse({"--depths", "2,x,6,2"});
              }),
              HasSubstr("expected integers separated by commas, got '2,x,6,2'"));
}

TEST(Flags, ModelNamesTheValidVariants) {
  TrainConfig c;
  c.model = "tinyy";
  EXPECT_EQ(
      error_of<std::exception>([&] { c.validate(); }),
      "--model must be one of atto, femto, pico, nano, tiny, small, base, large, xlarge, convnextv2_atto, "
      "convnextv2_femto, convnextv2_pico, convnextv2_nano, convnextv2_tiny, convnextv2_small, "
      "convnextv2_base, convnextv2_large, convnextv2_huge, got 'tinyy'");
  // V2: by name, or --grn with --depths/--dims; either way no layer scale.
  c = parse({"--model", "convnextv2_pico"});
  EXPECT_TRUE(c.model_config().grn);
  EXPECT_EQ(c.model_config().layer_scale_init, 0);
  c = parse({"--depths", "1,1,1,1", "--dims", "8,16,24,32", "--grn"});
  EXPECT_TRUE(c.model_config().grn);
  EXPECT_EQ(c.model_config().layer_scale_init, 0);
  c = parse({"--grn"});
  EXPECT_EQ(error_of<std::exception>([&] { c.validate(); }),
            "--grn goes with --depths (a --model convnextv2_* has GRN already)");
}

// --help: each flag in one of the sections, in the sections' order; every line within the width.
TEST(Flags, HelpIsGroupedAndWrapped) {
  for (const Flag& f : flags())
    EXPECT_TRUE(f.group && std::find(std::begin(kFlagGroups), std::end(kFlagGroups),
                                     std::string_view(f.group)) != std::end(kFlagGroups))
        << f.name << " has no --help section";
  for (size_t width : {60, 80, 132}) {
    TrainConfig c;
    CLI::App app{"convnext_zero: a description long enough to need wrapping at sixty columns, which it gets"};
    app.formatter(std::make_shared<WrappingFormatter>(width));
    add_flags(app, c);
    app.footer(
        "Exit codes: 0 done; 1 failed (the error is printed); 2 bad command line; 75 stopped on request");
    const std::string help = app.help();
    size_t longest = 0, lines = 0, at = 0;
    std::stringstream in(help);
    for (std::string line; std::getline(in, line);) longest = std::max(longest, line.size()), ++lines;
    EXPECT_LE(longest, width) << help;
    EXPECT_GT(lines, flags().size());
    for (const char* group : kFlagGroups) {
      const size_t pos = help.find(std::string("\n") + group + ":\n");
      EXPECT_NE(pos, std::string::npos) << group;
      EXPECT_GT(pos, at) << group << " out of order";
      at = pos;
    }
    EXPECT_THAT(help, HasSubstr("cpu | cuda[:N]"));
  }
  EXPECT_EQ(wrap_words("a bb ccc dddd", 6), (std::vector<std::string>{"a bb", "ccc", "dddd"}));
  EXPECT_EQ(wrap_words("averyveryverylongword x", 6),
            (std::vector<std::string>{"averyveryverylongword", "x"}));
  EXPECT_EQ(wrap_words("ab: atto|femto|pico|nano", 12),
            (std::vector<std::string>{"ab:", "atto|femto|", "pico|nano"}));
}

// The log's start record: every flag by its name, a switch as given.
TEST(Flags, FlagsJsonHasEveryFlag) {
  const nlohmann::json j = flags_json(custom_config());
  EXPECT_EQ(j.size(), flags().size());
  EXPECT_EQ(j.at("dims"), (std::vector<int64_t>{8, 16, 24, 32}));
  EXPECT_EQ(j.at("no-shuffle"), true);
  EXPECT_EQ(j.at("no-progress"), false);
  EXPECT_EQ(j.at("lr"), 3e-3);
  EXPECT_EQ(j.at("model"), "atto");
}

}  // namespace
}  // namespace cz::train
