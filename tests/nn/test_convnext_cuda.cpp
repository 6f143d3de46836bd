// ConvNeXt forward and backward on CUDA against the CPU backend, from the same weights and batch: in f32
// (cuDNN and cuBLAS without TF32, so the two differ by accumulation order only) and with bf16 compute (a bf16
// copy of the weights, as the trainer's Note [Mixed precision]: the logits, the loss and every parameter's
// gradient must agree with the f32 CPU run to bf16 accuracy). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "nn/convnext.h"
#include "tensor/autograd/engine.h"
#include "tensor/cuda_test_util.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz::nn {
namespace {

using cz::testing::gpu;

// Small enough to run fast anywhere, deep enough to cover every op: all four stages, a stage with two
// blocks, layer scale large enough that the blocks matter, drop path off (its masks are host-drawn and the
// same on both backends, but it would hide blocks).
ConvNeXtConfig small_config() {
  ConvNeXtConfig c;
  c.depths = {1, 1, 2, 1};
  c.dims = {16, 32, 48, 64};
  c.num_classes = 10;
  c.layer_scale_init = 0.5;
  return c;
}

struct Result {
  std::vector<float> logits;
  double loss = 0;
  std::vector<std::pair<std::string, std::vector<float>>> grads;  // f32, on the host
};

// One forward and backward of a model on `device` with parameters of `dtype`, its weights copied from `src`.
Result run(const ConvNeXtConfig& cfg, const ConvNeXt& src, Device device, DType dtype, const Tensor& images,
           const Tensor& labels) {
  ConvNeXt m(cfg, ParamOptions{dtype, device});
  const NamedParameters from = src.named_parameters(), to = m.named_parameters();
  EXPECT_EQ(from.size(), to.size());
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < to.size(); ++i) Tensor(to[i].second).copy_(from[i].second);
  }
  m.train();
  Tensor logits = m(images.to(device).to(dtype)).to(DType::f32);
  Tensor loss = cross_entropy(logits, labels.to(device), 0.1);
  loss.backward();
  Result r;
  r.logits = logits.cpu().to_vector<float>();
  r.loss = loss.item();
  for (const auto& [name, p] : to) {
    const Tensor g = p.grad();
    EXPECT_TRUE(g.defined()) << name << " got no gradient on " << device.str();
    r.grads.emplace_back(name,
                         g.defined() ? g.to(DType::f32).cpu().to_vector<float>() : std::vector<float>());
  }
  return r;
}

// |a - b| / |b| in the 2-norm (0 when both are zero).
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

class ConvNeXtCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    CZ_REQUIRE_GPU();
    model_.init_weights(5);
    Generator gen(11);
    images_ = randn({4, 32, 32, 3}, gen);
    labels_ = randint(cfg_.num_classes, {4}, gen, DType::i64);
    cpu_ = run(cfg_, model_, Device::cpu(), DType::f32, images_, labels_);
  }

  ConvNeXtConfig cfg_ = small_config();
  ConvNeXt model_{small_config()};
  Tensor images_, labels_;
  Result cpu_;
};

TEST_F(ConvNeXtCuda, F32ForwardAndBackwardMatchTheCpu) {
  const Result g = run(cfg_, model_, gpu(), DType::f32, images_, labels_);
  for (size_t i = 0; i < g.logits.size(); ++i)
    ASSERT_NEAR(g.logits[i], cpu_.logits[i], 1e-5 + 1e-4 * std::abs(cpu_.logits[i])) << "logit " << i;
  EXPECT_NEAR(g.loss, cpu_.loss, 1e-5 * std::abs(cpu_.loss));
  ASSERT_EQ(g.grads.size(), cpu_.grads.size());
  for (size_t i = 0; i < g.grads.size(); ++i) {
    const auto& [name, gg] = g.grads[i];
    const auto& cg = cpu_.grads[i].second;
    ASSERT_EQ(gg.size(), cg.size()) << name;
    // Against the tensor's largest entry: an element near zero carries the others' rounding.
    const double tol = 1e-4 * max_abs(cg) + 1e-7;
    double worst = 0;
    for (size_t j = 0; j < gg.size(); ++j) worst = std::max(worst, std::abs(double(gg[j]) - cg[j]));
    EXPECT_LE(worst, tol) << name << ": max |gpu - cpu| " << worst << ", max |cpu| " << max_abs(cg);
  }
}

TEST_F(ConvNeXtCuda, F32RunsRepeatBitForBit) {
  const Result a = run(cfg_, model_, gpu(), DType::f32, images_, labels_);
  const Result b = run(cfg_, model_, gpu(), DType::f32, images_, labels_);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.loss, b.loss);
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_EQ(a.grads[i].second, b.grads[i].second) << a.grads[i].first;
}

TEST_F(ConvNeXtCuda, Bf16ForwardAndBackwardFollowTheF32Cpu) {
  const Result g = run(cfg_, model_, gpu(), DType::bf16, images_, labels_);
  EXPECT_LT(relative_l2(g.logits, cpu_.logits), 3e-2);
  EXPECT_NEAR(g.loss, cpu_.loss, 2e-2 * std::abs(cpu_.loss));
  ASSERT_EQ(g.grads.size(), cpu_.grads.size());
  for (size_t i = 0; i < g.grads.size(); ++i)
    EXPECT_LT(relative_l2(g.grads[i].second, cpu_.grads[i].second), 8e-2) << g.grads[i].first;
}

}  // namespace
}  // namespace cz::nn
