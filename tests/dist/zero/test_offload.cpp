// CPU offload's delayed update (--offload-overlap-step) in a world of one: with gradients that do not depend
// on the weights, every update is the same as without the delay, applied one step later, so the weights the
// forward of step t+1 sees are exactly those of the undelayed run after step t-1.
#include <gtest/gtest.h>

#include "dist/zero/engine.h"
#include "optim/adamw.h"
#include "tensor/ops.h"
#include "zero_testing.h"

namespace cz::zero {
namespace {

using train::testing::Scale;

class Toy : public nn::Module {
 public:
  Toy() : Module("Toy") {
    a_ = register_module("a", std::make_shared<Scale>(37));
    b_ = register_module("b", std::make_shared<Scale>(29));
  }
  Tensor forward(const Tensor& x) override {
    return add(sum((*a_)(x.narrow(0, 0, 37))), sum((*b_)(x.narrow(0, 37, 29))));
  }
  std::vector<float> weights() const {
    std::vector<float> v = a_->weight().to_vector<float>(), b = b_->weight().to_vector<float>();
    v.insert(v.end(), b.begin(), b.end());
    return v;
  }

 private:
  std::shared_ptr<Scale> a_, b_;
};

// The loss of step t: sum(c_t * w), whose gradient c_t does not depend on w.
Tensor coefficients(int t) {
  std::vector<float> c(66);
  for (size_t i = 0; i < c.size(); ++i) c[i] = float(std::sin(0.7 * double(i) + 1.3 * t));
  return from_vector(c, {66});
}

// The weights each step's forward saw, and the weights after the last step.
std::pair<std::vector<std::vector<float>>, std::vector<float>> train(int stage, bool offload, bool delayed,
                                                                     double clip) {
  Toy model;
  ZeroConfig cfg;
  cfg.stage = stage;
  cfg.bucket_bytes = 100;  // several buckets
  cfg.offload = offload;
  cfg.offload_overlap_step = delayed;
  auto adamw = [](const ShardSpec& shard) -> std::unique_ptr<Optimizer> {
    return std::make_unique<AdamW>(shard.flat, shard.ranges, timm_weight_decay(shard.flat, 0.05),
                                   AdamWConfig{}, DType::f32, shard.device, shard.pinned);
  };
  ZeroEngine engine(model, {"a", "b"}, dist::ProcessGroup(), cfg, adamw);
  LossScaler scaler = LossScaler::disabled();
  std::vector<std::vector<float>> seen;
  for (int t = 0; t < 6; ++t) {
    engine.begin_step(0.05, clip, scaler);
    seen.push_back(model.weights());  // what this step's forward computes with
    Tensor loss = model(coefficients(t));
    engine.backward(loss, true);
    StepStats stats;
    engine.step(scaler, stats);
  }
  engine.synchronize();
  return {seen, train::testing::flat_values(engine.master_parameters())};
}

TEST(Offload, ChangesNoBitInAWorldOfOne) {
  for (int stage = 0; stage <= 2; ++stage)
    for (double clip : {0.0, 0.1}) {
      const auto ref = train(stage, false, false, clip), off = train(stage, true, false, clip);
      EXPECT_EQ(off.first, ref.first) << "stage " << stage << " clip " << clip;
      EXPECT_EQ(off.second, ref.second) << "stage " << stage << " clip " << clip;
    }
}

TEST(Offload, DelayedUpdateIsExactlyOneStepStale) {
  for (int stage = 0; stage <= 2; ++stage) {
    const auto ref = train(stage, true, false, 0.0), late = train(stage, true, true, 0.0);
    ASSERT_EQ(late.first.size(), ref.first.size());
    // Step 0 and step 1 both see the initial weights; step t >= 1 sees the weights after step t-2's update.
    EXPECT_EQ(late.first[0], ref.first[0]);
    for (size_t t = 1; t < ref.first.size(); ++t) EXPECT_EQ(late.first[t], ref.first[t - 1]) << "step " << t;
    EXPECT_NE(late.first[2], ref.first[2]);  // and it really is behind
    EXPECT_EQ(late.second, ref.second);      // the same updates in the end
  }
}

}  // namespace
}  // namespace cz::zero
