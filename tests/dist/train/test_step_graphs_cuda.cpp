// --cuda-graphs on a GPU (Note [CUDA graphs for the step]): a run whose micro-steps and optimizer update are
// replayed from CUDA graphs gives the same losses, gradient norms, weights and optimizer state, to the bit,
// as the same run without graphs (whose update takes its scalars as kernel arguments and decides on the host:
// Note [The optimizer's device scalars]): fp32 and bf16 at one rank, with gradient accumulation, AdamW and
// SGD with clipping on every step, fp16 with overflowing steps skipped on the device and the scale halved
// between replays, with evaluations and the EMA between replays, with a micro-batch of another shape
// falling back to an eager micro-step, and with the device out of memory after the capture. The ZeRO stages
// 1-3 are not captured: auto runs them eagerly, on is refused. Skips without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "dist/train/trainer.h"
#include "tensor/cuda/allocator.h"
#include "tensor/cuda_test_util.h"
#include "tensor/random.h"
#include "trainer_testing.h"

namespace cz::train {
namespace {

using namespace testing;
using ::testing::HasSubstr;

const auto* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new WorldEnvironment);

// What a run leaves: each step's loss, gradient norm and skip, then every master weight and the optimizer's
// state.
struct Outcome {
  std::vector<double> values;
  int64_t replays = 0, uncaptured = 0, update_replays = 0;
};

size_t bits_differing(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    n += std::memcmp(&a[i], &b[i], sizeof(double)) != 0;
  return n;
}

TrainConfig gpu_config(const char* precision, const char* graphs) {
  TrainConfig c = tiny_config();
  c.device = "cuda";
  c.precision = precision;
  c.cuda_graphs = graphs;
  c.steps = 6;
  return c;
}

// The optimizer's state (exp_avg, exp_avg_sq or momentum_buffer; the EMA) and its step count.
void push_optimizer_state(Trainer& t, std::vector<double>& out) {
  for (const auto& [name, chunks] : t.engine().owned_state(true)) {
    if (name == "params") continue;
    for (const auto& chunk : chunks)
      for (float x : chunk.values.to(Device::cpu()).contiguous().to_vector<float>()) out.push_back(x);
  }
  out.push_back(double(t.engine().optimizer().step_count()));
}

Outcome run_steps(const TrainConfig& c) {
  Trainer t(c, dist::World::get());
  Outcome o;
  for (int64_t s = 0; s < c.steps; ++s) {
    const StepStats st = t.step();
    o.values.push_back(st.loss);
    o.values.push_back(st.grad_norm);
    o.values.push_back(st.skipped);
  }
  for (float w : master_values(t)) o.values.push_back(w);
  push_optimizer_state(t, o.values);
  o.replays = t.graph_replays();
  o.uncaptured = t.graph_uncaptured();
  o.update_replays = t.graph_update_replays();
  return o;
}

TEST(StepGraphs, ReplaysMatchTheEagerStepBitForBit) {
  CZ_REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16"})
    for (int64_t accum : {1, 3}) {
      TrainConfig off = gpu_config(precision, "off"), on = gpu_config(precision, "on");
      off.grad_accum = on.grad_accum = accum;
      const Outcome a = run_steps(off), b = run_steps(on);
      EXPECT_EQ(a.replays, 0);
      // Steps after the warm-up: every micro-step replayed (the capture's step replays too).
      EXPECT_EQ(b.replays, (on.steps - kGraphWarmupSteps) * accum) << precision << " accum " << accum;
      EXPECT_EQ(a.update_replays, 0);
      EXPECT_EQ(b.update_replays, on.steps - kGraphWarmupSteps) << precision << " accum " << accum;
      EXPECT_EQ(bits_differing(a.values, b.values), 0u) << precision << " accum " << accum;
    }
}

// The replayed update clips on the device: a max norm below every step's gradient norm, so each step's
// coefficient (computed on the device from the device's norm) scales the gradients; AdamW (bias corrections
// from the host's step count, lr from the schedule's warm-up) and SGD with momentum (the first-step flag),
// with layer decay's per-piece lr scales.
TEST(StepGraphs, ReplayedUpdateClipsLikeTheEagerOne) {
  CZ_REQUIRE_GPU();
  for (const char* optimizer : {"adamw", "sgd"})
    for (const char* precision : {"fp32", "bf16"}) {
      auto config = [&](const char* graphs) {
        TrainConfig c = gpu_config(precision, graphs);
        c.optimizer = optimizer;
        c.clip_grad = 1e-3;
        c.layer_decay = 0.8;
        c.warmup_steps = 3;
        c.steps = 7;
        return c;
      };
      const Outcome a = run_steps(config("off")), b = run_steps(config("on"));
      EXPECT_EQ(b.update_replays, 7 - kGraphWarmupSteps) << optimizer << " " << precision;
      EXPECT_EQ(bits_differing(a.values, b.values), 0u) << optimizer << " " << precision;
      // The norm is logged from the device buffer after each step: above the max norm, so every step clipped.
      for (size_t i = 1; i < b.values.size() && i < 3 * 7; i += 3) EXPECT_GT(b.values[i], 1e-3) << i;
    }
}

// fp16 from a loss scale far too large: the first steps overflow and are skipped, also after the capture, and
// each replay scales by its step's value (read from device memory).
TEST(StepGraphs, Fp16LossScaleChangesBetweenReplays) {
  CZ_REQUIRE_GPU();
  auto run = [](const char* graphs) {
    TrainConfig c = gpu_config("fp16", graphs);
    c.initial_loss_scale = std::ldexp(1.0, 30);  // over fp16's range for several steps, then in it
    c.steps = 24;
    c.clip_grad = 0.5;  // the device's clip coefficient, and its skip on an overflow
    c.ema_decay = 0.9;  // the EMA's skip on an overflow
    Trainer t(c, dist::World::get());
    std::vector<double> v;
    int skipped_after_capture = 0;
    for (int64_t s = 0; s < c.steps; ++s) {
      const StepStats st = t.step();
      v.push_back(st.loss);
      v.push_back(st.grad_norm);
      v.push_back(st.loss_scale);
      skipped_after_capture += st.skipped && s >= kGraphWarmupSteps;
    }
    for (float w : master_values(t)) v.push_back(w);
    push_optimizer_state(t, v);  // the step count: skipped steps are not counted
    v.push_back(double(t.graph_update_replays()));
    return std::tuple(v, t.graph_replays(), skipped_after_capture);
  };
  const auto [a, a_replays, a_skipped] = run("off");
  const auto [b, b_replays, b_skipped] = run("on");
  EXPECT_EQ(b_replays, 24 - kGraphWarmupSteps);
  EXPECT_EQ(b.back(), 24 - kGraphWarmupSteps) << "updates replayed, the skipped ones included";
  EXPECT_EQ(a.back(), 0);
  EXPECT_GE(b_skipped, 1) << "no overflow after the capture: the test does not test the scale's update";
  EXPECT_LT(b_skipped, 24 - kGraphWarmupSteps) << "every step overflowed";
  EXPECT_EQ(a_skipped, b_skipped);
  EXPECT_EQ(bits_differing(std::vector<double>(a.begin(), a.end() - 1),
                           std::vector<double>(b.begin(), b.end() - 1)),
            0u);
}

// Evaluations and the EMA's swaps between replays change no address the graph uses.
TEST(StepGraphs, EvaluationAndEmaBetweenReplays) {
  CZ_REQUIRE_GPU();
  auto run = [](const char* graphs) {
    TrainConfig c = gpu_config("bf16", graphs);
    c.steps = 8;
    c.eval_every = 3;
    c.ema_decay = 0.9;
    c.clip_grad = 1.0;
    Trainer t(c, dist::World::get());
    const TrainSummary s = t.run();
    std::vector<double> v{s.final_loss, s.eval->loss, s.eval->top1, s.eval_ema->loss};
    for (float w : master_values(t)) v.push_back(w);
    return std::pair(v, t.graph_replays());
  };
  const auto [a, a_replays] = run("off");
  const auto [b, b_replays] = run("auto");
  EXPECT_EQ(a_replays, 0);
  EXPECT_EQ(b_replays, 8 - kGraphWarmupSteps);
  EXPECT_EQ(bits_differing(a, b), 0u);
}

// A micro-batch of another size (an epoch's partial last batch, given here through Trainer::step) runs
// eagerly; the full-size steps around it are replayed, and every value matches the run without graphs.
TEST(StepGraphs, AnotherShapeRunsEagerly) {
  CZ_REQUIRE_GPU();
  auto run = [](const char* graphs) {
    TrainConfig c = gpu_config("fp32", graphs);
    c.steps = 8;
    Trainer t(c, dist::World::get());
    Generator gen(3);
    std::vector<double> v;
    for (int s = 0; s < c.steps; ++s) {
      const int64_t n = s == 5 ? 9 : c.micro_batch;  // after the capture (step 3) and a replay
      Batch b;
      b.images = randn({n, c.image_size, c.image_size, 3}, gen, DType::f32, Device::cuda(0));
      b.labels = randint(c.num_classes, {n}, gen, DType::i64, Device::cuda(0));
      const std::vector<Batch> batches{b};
      const StepStats st = t.step(batches);
      v.push_back(st.loss);
      v.push_back(st.grad_norm);
    }
    for (float w : master_values(t)) v.push_back(w);
    return std::tuple(v, t.graph_replays(), t.graph_uncaptured());
  };
  const auto [a, a_replays, a_eager] = run("off");
  const auto [b, b_replays, b_eager] = run("on");
  EXPECT_EQ(b_eager, 1);
  EXPECT_EQ(b_replays, 8 - kGraphWarmupSteps - 1);
  EXPECT_EQ(bits_differing(a, b), 0u);
}

// Note [Graph pools outlive memory pressure] (tensor/cuda/block_pool.h): after the capture, a request the
// device cannot serve makes the allocator return its cache to the driver, but for the graph stream's pool,
// whose addresses the replays write. Other work then takes what was returned and fills it; it must keep its
// contents through the replays, and every step, weight and optimizer state must match the run without graphs
// forced out of memory at the same step, bit for bit.
TEST(StepGraphs, OutOfMemoryAfterTheCaptureKeepsTheGraphsBlocks) {
  CZ_REQUIRE_GPU();
  constexpr int64_t kSquat = 64 << 10;  // bytes per block of the other work
  auto run = [](const char* graphs) {
    TrainConfig c = gpu_config("bf16", graphs);
    c.steps = 8;
    c.clip_grad = 1.0;
    Trainer t(c, dist::World::get());
    Allocator& device = allocator_for(Device::cuda(0));
    Outcome o;
    std::vector<Tensor> squatters;
    int64_t kept = -1;
    for (int64_t s = 0; s < c.steps; ++s) {
      if (s == kGraphWarmupSteps + 1) {  // after the capture's step, before the replays that follow
        const MemoryStats before = device.stats();
        try {
          empty({int64_t(1) << 50}, DType::u8, Device::cuda(0));  // a pebibyte
          ADD_FAILURE() << "1 PiB was allocated";
        } catch (const cuda::OutOfMemoryError& e) {
          if (std::string(graphs) == "on") {
            EXPECT_THAT(e.what(), HasSubstr("for live CUDA graphs"));
          }
        }
        const MemoryStats after = device.stats();
        kept = after.reserved_bytes - after.allocated_bytes;
        const int64_t returned = before.reserved_bytes - after.reserved_bytes;
        for (int64_t b = 0; b < returned + kept && squatters.size() < 4096; b += kSquat)
          squatters.push_back(full({kSquat / 4}, 7.0, DType::f32, Device::cuda(0)));
      }
      const StepStats st = t.step();
      o.values.push_back(st.loss);
      o.values.push_back(st.grad_norm);
    }
    for (float w : master_values(t)) o.values.push_back(w);
    push_optimizer_state(t, o.values);
    o.replays = t.graph_replays();
    size_t overwritten = 0;
    for (const Tensor& q : squatters)
      for (float x : q.to(Device::cpu()).to_vector<float>()) overwritten += x != 7.0f;
    EXPECT_EQ(overwritten, 0u) << graphs
                               << ": a replay wrote memory the allocator had returned to the driver";
    return std::pair(o, kept);
  };
  const auto [a, a_kept] = run("off");
  const auto [b, b_kept] = run("on");
  EXPECT_EQ(a_kept, 0) << "without graphs the retry returns every cached block";
  EXPECT_GT(b_kept, 0) << "the graph stream's pool was returned to the driver";
  EXPECT_EQ(b.replays, 8 - kGraphWarmupSteps);
  EXPECT_EQ(bits_differing(a.values, b.values), 0u);
}

// Not captured: auto runs eagerly and says why; on is refused with the same reason.
TEST(StepGraphs, ShardedStagesAndTracingAreNotCaptured) {
  CZ_REQUIRE_GPU();
  for (int stage = 1; stage <= 3; ++stage) {
    TrainConfig c = gpu_config("bf16", "auto");
    c.stage = stage;
    {
      Trainer t(c, dist::World::get());
      EXPECT_FALSE(t.cuda_graph_plan().capture);
      EXPECT_THAT(t.cuda_graph_plan().note(), HasSubstr(fmt::format("--stage {}", stage)));
      for (int s = 0; s < 4; ++s) t.step();
      EXPECT_EQ(t.graph_replays(), 0);
    }
    c.cuda_graphs = "on";
    try {
      Trainer t(c, dist::World::get());
      ADD_FAILURE() << "--cuda-graphs on at stage " << stage << " was accepted";
    } catch (const ValueError& e) {
      EXPECT_THAT(e.what(), HasSubstr("--cuda-graphs on"));
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("--stage {}", stage)));
    }
  }
  TrainConfig c = gpu_config("bf16", "on");
  c.trace = (temp_dir() / "graphs_trace.json").string();
  EXPECT_THROW(Trainer(c, dist::World::get()), ValueError);
}

}  // namespace
}  // namespace cz::train
