// The training loop end to end on one process: it learns, gradient accumulation equals a bigger batch, the
// log carries what the issue names, weights export and re-import, and bad configurations are refused by flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "dist/comm/bootstrap.h"
#include "dist/train/trainer.h"
#include "io/checkpoint/weights.h"
#include "tensor/check.h"
#include "trainer_testing.h"

namespace cz::train {
namespace {

namespace fs = std::filesystem;
using namespace testing;

const auto* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new WorldEnvironment);

TEST(Trainer, LearnsTheSyntheticTaskWellAboveChance) {
  Trainer t(learning_config(), dist::World::get());
  const EvalResult before = t.evaluate();
  const TrainSummary s = t.run();
  ASSERT_TRUE(s.eval.has_value());
  EXPECT_EQ(s.eval->examples, 64);
  EXPECT_NEAR(before.top1, 0.25, 0.2);  // 4 classes: about chance before training
  EXPECT_GT(s.eval->top1, 0.6) << "eval loss " << s.eval->loss;
  EXPECT_LT(s.eval->loss, before.loss);
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  // Drop-path masks follow the sample's index in the global batch, so they agree too.
  TrainConfig big = tiny_config();
  big.drop_path = 0.2;
  TrainConfig accum = big;
  accum.micro_batch = 8;
  accum.grad_accum = 2;
  Trainer a(big, dist::World::get()), b(accum, dist::World::get());
  for (int i = 0; i < 3; ++i) {
    const StepStats sa = a.step(), sb = b.step();
    EXPECT_NEAR(sa.loss, sb.loss, 1e-5 * std::abs(sa.loss)) << "step " << i + 1;
    EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-4 * sa.grad_norm) << "step " << i + 1;
  }
  EXPECT_LT(max_abs_diff(master_values(a), master_values(b)), 1e-5);
}

TEST(Trainer, SameSeedSameRunAndClippingBoundsTheUpdate) {
  TrainConfig c = tiny_config();
  Trainer a(c, dist::World::get()), b(c, dist::World::get());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(a.step().loss, b.step().loss);
  EXPECT_EQ(max_abs_diff(master_values(a), master_values(b)), 0.0);

  // With SGD, no momentum history on step 1 and clip at a tiny norm, the step is lr * clip / norm * grad: its
  // size is lr * clip whatever the gradient.
  TrainConfig s = tiny_config();
  s.optimizer = "sgd";
  s.weight_decay = 0;
  s.schedule = "constant";
  s.clip_grad = 1e-3;
  s.lr = 0.5;
  Trainer t(s, dist::World::get());
  const std::vector<float> w0 = master_values(t);
  const StepStats st = t.step();
  EXPECT_GT(st.grad_norm, s.clip_grad);
  const std::vector<float> w1 = master_values(t);
  double sq = 0;
  for (size_t i = 0; i < w0.size(); ++i) sq += (double(w1[i]) - w0[i]) * (double(w1[i]) - w0[i]);
  EXPECT_NEAR(std::sqrt(sq), s.lr * s.clip_grad, 1e-3 * s.lr * s.clip_grad);
}

TEST(Trainer, LogHasOneRecordPerStepAndPerEvaluation) {
  const fs::path log = temp_dir() / "log.jsonl";
  TrainConfig c = tiny_config();
  c.steps = 4;
  c.eval_every = 2;
  c.ema_decay = 0.9;
  c.log = log.string();
  {
    Trainer t(c, dist::World::get());
    t.run();
  }
  std::ifstream in(log);
  std::string line;
  std::vector<nlohmann::json> steps, evals;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") == "start") continue;  // the run's start record (trainer_log.cpp)
    (j.at("split") == "eval" ? evals : steps).push_back(j);
  }
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& j = steps[i];
    EXPECT_EQ(j.at("step").get<int64_t>(), int64_t(i) + 1);
    for (const char* key : {"loss", "lr", "grad_norm", "step_time_s", "img_per_s"})
      EXPECT_TRUE(j.at(key).is_number_float() && std::isfinite(j.at(key).get<double>())) << key;
    EXPECT_GT(j.at("peak_mem_bytes").get<int64_t>(), 0);
    EXPECT_GT(j.at("grad_norm").get<double>(), 0);
  }
  // Cosine from 2e-3 to min-lr over 4 steps: strictly falling.
  EXPECT_GT(steps[0].at("lr").get<double>(), steps[3].at("lr").get<double>());
  ASSERT_EQ(evals.size(), 2u);  // at step 2 (--eval-every) and at the end
  EXPECT_EQ(evals[0].at("step").get<int64_t>(), 2);
  EXPECT_EQ(evals[1].at("step").get<int64_t>(), 4);
  for (const auto& j : evals) {
    EXPECT_EQ(j.at("split").get<std::string>(), "eval");
    EXPECT_GE(j.at("top1").get<double>(), 0.0);
    EXPECT_LE(j.at("top1").get<double>(), 1.0);
    EXPECT_TRUE(j.contains("ema_top1"));
  }
  fs::remove_all(log.parent_path());
}

TEST(Trainer, ExportedWeightsStartAnIdenticalModel) {
  const fs::path dir = temp_dir();
  TrainConfig c = tiny_config();
  c.export_weights = (dir / "w.h5").string();
  std::vector<float> trained;
  {
    Trainer t(c, dist::World::get());
    t.run();
    trained = master_values(t);
  }
  TrainConfig d = tiny_config();
  d.init_weights = c.export_weights;
  d.seed = 99;  // another initialisation, overwritten by the file
  Trainer u(d, dist::World::get());
  EXPECT_EQ(max_abs_diff(master_values(u), trained), 0.0);

  // Fine-tuning on more classes: the file's head is skipped and a new one initialised.
  TrainConfig e = d;
  e.num_classes = 6;
  e.reset_head = true;
  Trainer v(e, dist::World::get());
  size_t same = 0;
  for (const auto& [name, p] : v.master_parameters()) {
    if (name.rfind("head.fc.", 0) == 0) {
      EXPECT_EQ(p.size(0), 6);
      continue;
    }
    for (const auto& [uname, up] : u.master_parameters())
      if (uname == name) same += max_abs_diff(p.to_vector<float>(), up.to_vector<float>()) == 0.0;
  }
  EXPECT_EQ(same, v.master_parameters().size() - 2);
  fs::remove_all(dir);
}

std::string error_of(const TrainConfig& c) {
  try {
    Trainer t(c, dist::World::get());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// --num-classes left at kClassesOfTheData (the app's default) takes the training data's count, for the model,
// the config a checkpoint records and resume_identity; a given count is kept. resolve_num_classes (--plan,
// --print-param-groups) gives the same; a data set it cannot open names --num-classes as the way round.
TEST(Trainer, NumClassesDefaultsToTheData) {
  TrainConfig c = tiny_config();
  c.data = "synthetic:n=64,eval_n=16,classes=6";
  c.num_classes = kClassesOfTheData;
  {
    Trainer t(c, dist::World::get());
    EXPECT_TRUE(t.classes_from_data());
    EXPECT_EQ(t.config().num_classes, 6);
    EXPECT_EQ(t.model().spec().num_classes(), 6);
  }
  TrainConfig r = c;
  resolve_num_classes(r);
  EXPECT_EQ(r.num_classes, 6);
  c.num_classes = 9;
  {
    Trainer t(c, dist::World::get());
    EXPECT_FALSE(t.classes_from_data());
    EXPECT_EQ(t.model().spec().num_classes(), 9);
  }
  TrainConfig missing = tiny_config();
  missing.num_classes = kClassesOfTheData;
  missing.data = "h5:/no/such/file.h5";
  try {
    resolve_num_classes(missing);
    ADD_FAILURE() << "no error for an unreadable --data";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--num-classes is not given, so it is the classes of --data "
                                               "h5:/no/such/file.h5, which cannot be read"));
  }
}

TEST(Trainer, BadConfigurationsNameTheFlag) {
  TrainConfig c = tiny_config();
  c.model = "gigantic";
  c.depths.clear();
  c.dims.clear();
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("gigantic"));
  c = tiny_config();
  c.micro_batch = 0;
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--micro-batch"));
  c = tiny_config();
  c.dims = {8, 16};
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--dims"));
  c = tiny_config();
  c.data = "h5:/no/such/file.h5";
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("/no/such/file.h5"));
  c = tiny_config();
  c.num_classes = 2;  // the synthetic set has 4
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--num-classes"));
  c = tiny_config();
  c.precision = "fp16";  // the CPU has bf16 GEMMs at most
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--precision fp16 needs --device cuda"));
  c = tiny_config();
  c.initial_loss_scale = 0.5;
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--initial-loss-scale"));
  c = tiny_config();
  c.init_weights = "/no/such/weights.h5";
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("/no/such/weights.h5"));
}

// --cuda-graphs on a CPU run (in a build with or without CUDA, with or without a GPU): auto and off train as
// before and say nothing is captured; on is refused naming --device.
TEST(Trainer, CudaGraphsOnTheCpu) {
  for (const char* graphs : {"auto", "off"}) {
    TrainConfig c = tiny_config();
    c.cuda_graphs = graphs;
    Trainer t(c, dist::World::get());
    EXPECT_FALSE(t.cuda_graph_plan().capture) << graphs;
    EXPECT_TRUE(t.cuda_graph_plan().segments.empty()) << graphs;
    EXPECT_TRUE(std::isfinite(t.step().loss)) << graphs;
    EXPECT_EQ(t.graph_replays(), 0) << graphs;
  }
  EXPECT_EQ(Trainer(tiny_config(), dist::World::get()).cuda_graph_plan().reason, "the run is on the CPU");
  TrainConfig c = tiny_config();
  c.cuda_graphs = "on";
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--cuda-graphs on needs --device cuda"));
  c.cuda_graphs = "yes";
  EXPECT_THAT(error_of(c), ::testing::HasSubstr("--cuda-graphs must be auto, on or off, got 'yes'"));
}

}  // namespace
}  // namespace cz::train

namespace cz::train {
namespace {

// Every ZeRO stage at a world of one (the collectives become local copies) trains as stage 0, bit for bit,
// with activation checkpointing and gradient accumulation on.
TEST(Trainer, EveryZeroStageRunsAtWorldSizeOne) {
  std::vector<float> ref;
  std::vector<double> ref_losses;
  for (int stage = 0; stage <= 3; ++stage) {
    TrainConfig c = testing::tiny_config();
    c.stage = stage;
    c.grad_accum = 2;
    c.activation_checkpointing = true;
    c.ema_decay = 0.9;
    c.bucket_mb = 0.005;
    Trainer t(c, dist::World::get());
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(t.step().loss);
    const std::vector<float> w = testing::master_values(t);
    if (stage == 0) {
      ref = w;
      ref_losses = losses;
      continue;
    }
    EXPECT_EQ(losses, ref_losses) << "stage " << stage;
    EXPECT_EQ(testing::max_abs_diff(w, ref), 0.0) << "stage " << stage;
  }
}

}  // namespace
}  // namespace cz::train

namespace cz::train {
namespace {

// --layer-decay D: AdamW's first update moves each element by lr x scale x g / (|g| + eps), and the first
// gradients do not depend on the lr, so each parameter moves by its lr scale (D^(13 - layer), Note
// [Layer-wise lr decay numbering]) times what it moves without layer decay, element by element, with the
// replicated update and with stage 3's sharded update offloaded to the CPU alike.
TEST(Trainer, LayerDecayScalesEachParametersFirstUpdate) {
  // Per parameter: its name, each element's move, and its largest weight (whose f32 spacing bounds the
  // rounding of a move).
  struct Moves {
    std::string name;
    std::vector<float> move;
    double largest = 0;
  };
  using Values = std::vector<Moves>;
  const auto first_move = [](bool sharded, double layer_decay) {
    TrainConfig c = testing::tiny_config();
    c.depths = {1, 1, 4, 1};  // stage 2's blocks in layers 3 and 4
    c.layer_decay = layer_decay;
    c.weight_decay = 0;
    c.steps = 1;
    c.stage = sharded ? 3 : 0;
    c.offload_optimizer = sharded;
    Trainer t(c, dist::World::get());
    Values v;
    for (const auto& [name, p] : t.master_parameters()) {
      v.push_back({name, p.to(Device::cpu()).contiguous().to_vector<float>()});
      for (float x : v.back().move) v.back().largest = std::max(v.back().largest, double(std::abs(x)));
    }
    t.step();
    const nn::NamedParameters after = t.master_parameters();
    for (size_t i = 0; i < v.size(); ++i) {
      const std::vector<float> a = after[i].second.to(Device::cpu()).contiguous().to_vector<float>();
      for (size_t e = 0; e < a.size(); ++e) v[i].move[e] = a[e] - v[i].move[e];
    }
    return v;
  };
  for (const bool sharded : {false, true}) {
    const Values plain = first_move(sharded, 1.0), decayed = first_move(sharded, 0.6);
    ASSERT_EQ(plain.size(), decayed.size());
    std::set<int64_t> layers;
    for (size_t i = 0; i < plain.size(); ++i) {
      const std::string& name = plain[i].name;
      const int64_t layer = nn::convnext_layer_id(name);
      layers.insert(layer);
      const double scale = std::pow(0.6, double(13 - layer));
      double off = 0, size = 0;
      for (size_t e = 0; e < plain[i].move.size(); ++e) {
        off = std::max(off, std::abs(decayed[i].move[e] - scale * plain[i].move[e]));
        size = std::max(size, std::abs(scale * plain[i].move[e]));
      }
      EXPECT_GT(size, 0) << name;
      // The moves are differences of f32 weights: apart by the rounding of the weights at most.
      EXPECT_LE(off, 1e-4 * size + 2 * std::ldexp(plain[i].largest, -23))
          << name << (sharded ? " (stage 3, offload)" : "") << ": scale " << scale;
    }
    EXPECT_EQ(layers, (std::set<int64_t>{0, 1, 2, 3, 4, 12, 13}));
  }
}

}  // namespace
}  // namespace cz::train
