// Note [Deferred gradient zero] in the ZeRO engine, in a world of one: on the CPU no step fills the gradient
// buffer or a bucket, yet a parameter no gradient reached in a step (or in a micro-step) is reduced as zero,
// never as the gradient it had before.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/zero/engine.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "zero_testing.h"

namespace cz::zero {
namespace {

using train::testing::flat_values;
using train::testing::Scale;

// Two parameters of 37 and 29 values (segments padded to 48 and 32); the loss sum(c * w) uses b only when
// asked, so its gradient is c where used and nothing (no AccumulateGrad) where not.
class TwoScales : public nn::Module {
 public:
  TwoScales() : Module("TwoScales") {
    a_ = register_module("a", std::make_shared<Scale>(37));
    b_ = register_module("b", std::make_shared<Scale>(29));
  }
  Tensor forward(const Tensor&) override { throw ValueError("TwoScales: call loss()"); }
  Tensor loss(const Tensor& c, bool use_b) {
    Tensor l = sum((*a_)(c.narrow(0, 0, 37)));
    return use_b ? add(l, sum((*b_)(c.narrow(0, 37, 29)))) : l;
  }

 private:
  std::shared_ptr<Scale> a_, b_;
};

Tensor coefficients(int t) {
  std::vector<float> c(66);
  for (size_t i = 0; i < c.size(); ++i) c[i] = float(std::sin(0.7 * double(i) + 1.3 * t) + 2.0);
  return from_vector(c, {66});
}

// Plain SGD at lr 1: each step moves the weights by minus the step's summed gradient.
TEST(DeferredGradZero, AParameterWithoutAGradientIsReducedAsZero) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    TwoScales model;
    ZeroConfig cfg;
    cfg.stage = stage;
    cfg.bucket_bytes = 100;  // several buckets, padding in each
    auto sgd = [](const ShardSpec& shard) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Sgd>(shard.flat, shard.ranges,
                                   std::vector<ParamHyper>(shard.flat.segments.size()), SgdConfig{},
                                   DType::f32, shard.device, shard.pinned);
    };
    ZeroEngine engine(model, {"a", "b"}, dist::ProcessGroup(), cfg, sgd);
    LossScaler scaler = LossScaler::disabled();
    // Each step: the micro-steps' (coefficients, uses b).
    const std::vector<std::vector<std::pair<int, bool>>> steps = {
        {{0, true}},              // both get gradients
        {{1, false}},             // b none: it must not move
        {{2, true}, {3, false}},  // b in the first micro-step only: its gradient is that one's
        {{4, false}, {5, true}},  // b in the second only
        {{6, false}, {7, false}}};
    std::vector<float> w = flat_values(engine.master_parameters());
    for (const auto& micro : steps) {
      engine.begin_step(1.0, 0.0, scaler);
      std::vector<float> expected = w;
      for (size_t m = 0; m < micro.size(); ++m) {
        const auto [t, use_b] = micro[m];
        const std::vector<float> c = coefficients(t).to_vector<float>();
        for (size_t i = 0; i < 66; ++i)
          if (i < 37 || use_b) expected[i] -= c[i];
        engine.backward(model.loss(coefficients(t), use_b), m + 1 == micro.size());
      }
      StepStats stats;
      engine.step(scaler, stats);
      engine.synchronize();
      w = flat_values(engine.master_parameters());
      ASSERT_EQ(w.size(), expected.size());
      for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], expected[i], 1e-5) << "value " << i;
    }
  }
}

}  // namespace
}  // namespace cz::zero
