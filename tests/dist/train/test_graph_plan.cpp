// --cuda-graphs' decision (Note [CUDA graphs for the step], dist/train/graph_plan.h), on the CPU: which runs
// capture which segments, why the others do not, and `on` refused with the reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/train/config.h"
#include "dist/train/graph_plan.h"
#include "dist/train/step_graphs.h"
#include "tensor/check.h"

namespace cz::train {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

GraphPlanInput cuda_run(GraphMode mode = GraphMode::automatic) {
  GraphPlanInput in;
  in.mode = mode;
  in.cuda = true;
  in.micro_batch = 64;
  in.steps = 100;
  return in;
}

std::string message_of(const GraphPlanInput& in) {
  try {
    plan_cuda_graphs(in);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(GraphPlan, OneRankCapturesTheMicroStepAndTheUpdate) {
  for (GraphMode mode : {GraphMode::automatic, GraphMode::on}) {
    const GraphPlan p = plan_cuda_graphs(cuda_run(mode));
    ASSERT_TRUE(p.capture);
    EXPECT_EQ(p.graphs, 2);
    EXPECT_EQ(p.micro_step_graphs, 1);
    EXPECT_EQ(p.warmup_steps, kGraphWarmupSteps);
    ASSERT_EQ(p.segments.size(), 6u);
    const std::vector<std::pair<std::string, bool>> expected = {
        {"step scalars", false},
        {"input", false},
        {"micro-step (forward, loss, backward)", true},
        {"update (norm, clip, optimizer, EMA)", true},
        {"loss read", false},
        {"step result read", false}};
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(p.segments[i].name, expected[i].first) << i;
      EXPECT_EQ(p.segments[i].captured, expected[i].second) << p.segments[i].name;
      EXPECT_FALSE(p.segments[i].why.empty()) << p.segments[i].name;
    }
    // The update decides on the device; the host only writes the scalars before and reads the result after.
    EXPECT_THAT(p.segments[0].why, HasSubstr("lr and bias corrections"));
    EXPECT_THAT(p.segments[0].why, Not(HasSubstr("loss scale")));
    EXPECT_THAT(p.segments[3].why, HasSubstr("clip coefficient"));
    EXPECT_THAT(p.segments[3].why, HasSubstr("computed on the device"));
    EXPECT_THAT(p.segments[4].why, HasSubstr("once the update is queued"));
    EXPECT_THAT(p.segments[5].why, HasSubstr("after the step's closing synchronize"));
    EXPECT_THAT(p.note(), HasSubstr("on ("));
    EXPECT_THAT(p.note(), HasSubstr("forward, loss, backward and optimizer captured in 2 graphs [micro-step "
                                    "(forward, loss, backward), update (norm, clip, optimizer, EMA)]"));
    EXPECT_THAT(p.note(), HasSubstr("eager: step scalars, input, loss read, step result read"));
  }
}

TEST(GraphPlan, AccumulationCapturesTheLastMicroStepApart) {
  GraphPlanInput in = cuda_run();
  in.grad_accum = 4;
  const GraphPlan p = plan_cuda_graphs(in);
  ASSERT_TRUE(p.capture);
  EXPECT_EQ(p.graphs, 3);
  EXPECT_EQ(p.micro_step_graphs, 2);
  ASSERT_EQ(p.segments.size(), 7u);
  EXPECT_EQ(p.segments[2].name, "micro-steps 1-3 (forward, loss, backward)");
  EXPECT_TRUE(p.segments[2].captured);
  EXPECT_EQ(p.segments[3].name, "micro-step 4 (forward, loss, backward)");
  EXPECT_TRUE(p.segments[3].captured);
  EXPECT_THAT(p.segments[3].why, HasSubstr("reduction"));
  EXPECT_TRUE(p.segments[4].captured);
  EXPECT_THAT(p.segments[4].name, HasSubstr("optimizer"));
  EXPECT_THAT(p.note(), HasSubstr("3 graphs"));
}

// fp16: the loss scale and 1 / scale are written into device memory before the step; the overflow's skip is
// decided on the device, in the captured update.
TEST(GraphPlan, Fp16IsCapturedWithItsLossScaleInDeviceMemory) {
  GraphPlanInput in = cuda_run(GraphMode::on);
  in.loss_scaling = true;
  const GraphPlan p = plan_cuda_graphs(in);
  ASSERT_TRUE(p.capture);
  ASSERT_EQ(p.segments.size(), 7u);
  EXPECT_EQ(p.segments[0].name, "step scalars");
  EXPECT_THAT(p.segments[0].why, HasSubstr("1 / loss scale"));
  EXPECT_EQ(p.segments[1].name, "loss scale");
  EXPECT_FALSE(p.segments[1].captured);
  EXPECT_THAT(p.segments[1].why, HasSubstr("device memory"));
  EXPECT_EQ(p.segments[4].name, "update (unscale, norm, clip, optimizer, EMA)");
  EXPECT_TRUE(p.segments[4].captured);
  EXPECT_THAT(p.segments[4].why, HasSubstr("overflow skip computed on the device"));
  EXPECT_THAT(p.note(), HasSubstr("eager: step scalars, loss scale, input, loss read, step result read"));
}

TEST(GraphPlan, APartialLastBatchRunsEagerlyWithoutTurningGraphsOff) {
  GraphPlanInput in = cuda_run();
  in.last_micro_batch = 17;
  const GraphPlan p = plan_cuda_graphs(in);
  ASSERT_TRUE(p.capture);
  bool found = false;
  for (const GraphSegment& s : p.segments)
    if (s.name.find("last micro-batch of 17") != std::string::npos) {
      found = true;
      EXPECT_FALSE(s.captured);
      EXPECT_THAT(s.why, HasSubstr("64"));
    }
  EXPECT_TRUE(found);
  in.last_micro_batch = 64;  // a full last batch is no different
  EXPECT_EQ(plan_cuda_graphs(in).segments.size(), 6u);
}

// Each unsafe setting: auto turns graphs off naming it, on is refused naming it.
TEST(GraphPlan, AutoSaysWhyNotAndOnIsRefusedForTheSameReason) {
  struct Case {
    const char* what;
    std::function<void(GraphPlanInput&)> set;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"trace", [](GraphPlanInput& in) { in.trace = true; }, "--trace"},
      {"mpi", [](GraphPlanInput& in) { in.comm = "mpi", in.world = 4; }, "MPI backend"},
      {"nccl", [](GraphPlanInput& in) { in.comm = "nccl", in.world = 8; }, "event queries"},
      {"nccl of one", [](GraphPlanInput& in) { in.comm = "nccl"; }, "event queries"},
      {"stage 3", [](GraphPlanInput& in) { in.stage = 3; }, "--stage 3"},
      {"offload", [](GraphPlanInput& in) { in.offload = true; }, "--offload-optimizer"},
      {"drop-path", [](GraphPlanInput& in) { in.drop_path = 0.1; }, "--drop-path 0.1"},
      {"short run", [](GraphPlanInput& in) { in.steps = kGraphWarmupSteps; }, "warm-up"},
  };
  for (const Case& c : cases) {
    GraphPlanInput in = cuda_run();
    c.set(in);
    const GraphPlan p = plan_cuda_graphs(in);
    EXPECT_FALSE(p.capture) << c.what;
    EXPECT_TRUE(p.segments.empty()) << c.what;
    EXPECT_THAT(p.reason, HasSubstr(c.reason)) << c.what;
    EXPECT_THAT(p.note(), HasSubstr("off (")) << c.what;
    in.mode = GraphMode::on;
    const std::string error = message_of(in);
    EXPECT_THAT(error, HasSubstr("--cuda-graphs on")) << c.what;
    EXPECT_THAT(error, HasSubstr(c.reason)) << c.what;
    in.mode = GraphMode::off;
    EXPECT_EQ(plan_cuda_graphs(in).reason, "--cuda-graphs off") << c.what;
  }
  // The steps of a benchmark are not known ahead (0): no reason to say no.
  GraphPlanInput in = cuda_run();
  in.steps = 0;
  EXPECT_TRUE(plan_cuda_graphs(in).capture);
  in.steps = kGraphWarmupSteps + 1;
  EXPECT_TRUE(plan_cuda_graphs(in).capture);
}

TEST(GraphPlan, TheCpuHasNoGraphsAndRefusesOn) {
  GraphPlanInput in = cuda_run();
  in.cuda = false;
  const GraphPlan p = plan_cuda_graphs(in);
  EXPECT_FALSE(p.capture);
  EXPECT_EQ(p.reason, "the run is on the CPU");
  in.mode = GraphMode::on;
  EXPECT_THAT(message_of(in), HasSubstr("--cuda-graphs on needs --device cuda"));
}

// StepGraphs' choice per micro-step over a run: warm-up steps, the capture, replays, and a micro-batch of
// another shape run eagerly (before the capture it is a warm-up like any other).
TEST(GraphPlan, EachMicroStepsAction) {
  using A = GraphAction;
  constexpr int w = kGraphWarmupSteps;
  EXPECT_EQ(graph_action(false, false, 0, w), A::warmup);
  EXPECT_EQ(graph_action(false, false, w - 1, w), A::warmup);
  EXPECT_EQ(graph_action(false, false, w, w), A::capture);
  EXPECT_EQ(graph_action(false, false, w + 5, w), A::capture);  // a kind first met late (accumulation)
  EXPECT_EQ(graph_action(true, true, w, w), A::replay);
  EXPECT_EQ(graph_action(true, true, 1000, w), A::replay);
  EXPECT_EQ(graph_action(true, false, w + 1, w), A::eager);
  EXPECT_EQ(graph_action(false, false, 0, 0), A::capture);  // no warm-up asked: capture at once
}

TEST(GraphPlan, InputFromTheFlags) {
  TrainConfig c;
  c.device = "cuda:1";
  c.precision = "fp16";
  c.cuda_graphs = "on";
  c.stage = 2;
  c.grad_accum = 3;
  c.micro_batch = 32;
  c.drop_path = 0.2;
  c.trace = "t.json";
  const GraphPlanInput in = graph_plan_input(c, 4, "nccl", 50);
  EXPECT_EQ(in.mode, GraphMode::on);
  EXPECT_TRUE(in.cuda);
  EXPECT_EQ(in.world, 4);
  EXPECT_EQ(in.comm, "nccl");
  EXPECT_EQ(in.stage, 2);
  EXPECT_TRUE(in.loss_scaling);
  EXPECT_TRUE(in.trace);
  EXPECT_EQ(in.drop_path, 0.2);
  EXPECT_EQ(in.grad_accum, 3);
  EXPECT_EQ(in.micro_batch, 32);
  EXPECT_EQ(in.steps, 50);
  c.cuda_graphs = "sometimes";
  EXPECT_THROW(graph_plan_input(c, 1, "", 0), ValueError);
  EXPECT_EQ(parse_graph_mode("auto"), GraphMode::automatic);
  EXPECT_EQ(parse_graph_mode("off"), GraphMode::off);
}

}  // namespace
}  // namespace cz::train
