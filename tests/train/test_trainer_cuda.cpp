// The training loop on a GPU: f32 follows the CPU run step by step, bf16 learns, and fp16's dynamic loss
// scaling skips an overflowing step (weights untouched) and halves the scale. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/train/trainer.h"
#include "tensor/cuda_test_util.h"
#include "trainer_testing.h"

namespace cz::train {
namespace {

using namespace testing;

const auto* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new WorldEnvironment);

TEST(TrainerCuda, F32FollowsTheCpuRun) {
  CZ_REQUIRE_GPU();
  TrainConfig c = tiny_config();
  c.steps = 4;
  Trainer cpu(c, dist::World::get());
  c.device = "cuda";
  Trainer gpu(c, dist::World::get());
  for (int s = 0; s < c.steps; ++s) {
    const StepStats a = cpu.step(), b = gpu.step();
    // The same batch and weights: only accumulation order differs. Later steps drift a little (AdamW
    // normalises tiny gradient differences), hence the looser bound after the first.
    const double rtol = s == 0 ? 1e-5 : 1e-3;
    EXPECT_NEAR(b.loss, a.loss, rtol * std::abs(a.loss)) << "step " << s + 1;
    if (s == 0) {
      EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-4 * a.grad_norm);
    }
    EXPECT_FALSE(b.skipped);
  }
}

TEST(TrainerCuda, Bf16Learns) {
  CZ_REQUIRE_GPU();
  TrainConfig c = learning_config();
  c.device = "cuda";
  c.precision = "bf16";
  Trainer t(c, dist::World::get());
  const EvalResult before = t.evaluate();
  const TrainSummary s = t.run();
  ASSERT_TRUE(s.eval.has_value());
  EXPECT_GT(s.eval->top1, 0.6) << "eval loss " << s.eval->loss;
  EXPECT_LT(s.eval->loss, before.loss);
}

TEST(TrainerCuda, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  CZ_REQUIRE_GPU();
  TrainConfig c = tiny_config();
  c.device = "cuda";
  c.precision = "fp16";
  // The loss gradient times 2^40 is far beyond fp16's 65504: the first steps overflow for certain.
  c.initial_loss_scale = std::ldexp(1.0, 40);
  c.steps = 40;
  Trainer t(c, dist::World::get());
  double scale = c.initial_loss_scale;
  int skipped = 0, taken = 0;
  for (int s = 0; s < c.steps; ++s) {
    const std::vector<float> before = master_values(t);
    const StepStats st = t.step();
    EXPECT_EQ(st.loss_scale, scale) << "step " << s + 1;
    if (st.skipped) {
      ++skipped;
      EXPECT_EQ(max_abs_diff(master_values(t), before), 0.0) << "a skipped step changed the weights";
      scale /= 2;
    } else {
      ++taken;
      EXPECT_GT(max_abs_diff(master_values(t), before), 0.0) << "step " << s + 1 << " was not applied";
      EXPECT_TRUE(std::isfinite(st.grad_norm));
    }
  }
  EXPECT_GE(skipped, 1);
  EXPECT_GE(taken, 1) << "the scale never came down far enough to take a step";
}

}  // namespace
}  // namespace cz::train

namespace cz::train {
namespace {

// Every ZeRO stage on one GPU trains as stage 0, in f32 and bf16, with and without CPU offload. (Not to the
// bit: each Trainer times cuDNN's algorithms afresh and may pick another one.)
TEST(TrainerCuda, ZeroStagesAndOffloadAgreeOnOneGpu) {
  CZ_REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16"}) {
    std::vector<double> ref;
    for (int stage = 0; stage <= 3; ++stage)
      for (bool offload : {false, true}) {
        TrainConfig c = testing::tiny_config();
        c.device = "cuda";
        c.precision = precision;
        c.stage = stage;
        c.offload_optimizer = offload;
        c.bucket_mb = 0.01;
        Trainer t(c, dist::World::get());
        std::vector<double> losses;
        for (int i = 0; i < 3; ++i) losses.push_back(t.step().loss);
        if (ref.empty()) ref = losses;
        const double rtol = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
        for (size_t i = 0; i < losses.size(); ++i)
          EXPECT_NEAR(losses[i], ref[i], rtol * std::abs(ref[i]))
              << precision << " stage " << stage << " offload " << offload << " step " << i;
      }
  }
}

// Offload's host buffers are page-locked (CUDA's pinned allocator holds them) and the device keeps only the
// compute copy and the gradient buffer.
TEST(TrainerCuda, OffloadKeepsStateInPinnedHostMemory) {
  CZ_REQUIRE_GPU();
  TrainConfig c = testing::tiny_config();
  c.device = "cuda";
  c.precision = "bf16";
  Allocator& pinned = pinned_host_allocator();
  const int64_t before = pinned.stats().allocated_bytes;
  c.offload_optimizer = true;
  Trainer t(c, dist::World::get());
  EXPECT_GE(pinned.stats().allocated_bytes - before, t.engine().host_state_bytes());
  const double psi = double(t.model().num_parameters());
  // bf16 compute copy (2 psi) + bf16 gradients (2 psi) at stage 0, rounded by the allocator.
  EXPECT_LE(double(t.engine().model_state_bytes()), 4.5 * psi + (1 << 20));
  t.step();
}

}  // namespace
}  // namespace cz::train
