// Module base: hierarchical names, train/eval, hook order and counts, execution order.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "nn/convnext.h"
#include "tensor/ops.h"

namespace cz::nn {
namespace {

ConvNeXtConfig tiny_net() {
  ConvNeXtConfig cfg;
  cfg.depths = {1, 1};
  cfg.dims = {4, 8};
  cfg.num_classes = 3;
  return cfg;
}

TEST(Module, TrainEvalPropagates) {
  ConvNeXt m(tiny_net());
  m.eval();
  for (auto& [n, mod] : m.named_modules()) EXPECT_FALSE(mod->is_training()) << n;
  m.train();
  EXPECT_TRUE(m.find_module("stages.1.blocks.0.mlp.fc1")->is_training());
}

TEST(Module, ForwardHooksRunAroundForwardInOrder) {
  ConvNeXt m(tiny_net());
  m.init_weights(1);
  std::vector<std::string> events;
  // The head's fc (a block's fc1 and fc2 run fused inside the block: Note [Fused epilogues on the CPU]).
  Module* fc = m.find_module("head.fc");
  fc->register_forward_pre_hook(
      [&](Module&, const Tensor& in) { events.push_back("pre " + shape_str(in.sizes())); });
  const int id = fc->register_forward_hook(
      [&](Module&, const Tensor&, const Tensor& out) { events.push_back("post " + shape_str(out.sizes())); });
  m(testing::random_tensor({2, 8, 8, 3}, 2, DType::f32));
  EXPECT_EQ(events, (std::vector<std::string>{"pre (2, 8)", "post (2, 3)"}));
  fc->remove_hook(id);
  m(testing::random_tensor({2, 8, 8, 3}, 3, DType::f32));
  EXPECT_EQ(events.size(), 3u);
}

TEST(Module, BackwardHooksFireOncePerPassAfterTheModulesGradients) {
  ConvNeXt m(tiny_net());
  m.init_weights(2);
  Module* block = m.find_module("stages.1.blocks.0");
  std::vector<std::string> events;
  int pre = 0, post = 0;
  block->register_backward_pre_hook([&](Module&) {
    ++pre;
    events.push_back("block pre-backward");
  });
  block->register_backward_hook([&](Module& b) {
    ++post;
    // Every parameter of the block has its final gradient by now.
    for (auto& [n, p] : b.named_parameters()) EXPECT_TRUE(p.grad().defined()) << n;
    events.push_back("block backward");
  });
  for (auto& [n, p] : block->named_parameters())
    Tensor(p).register_grad_ready_hook([&, n = n](Tensor&) { events.push_back("ready " + n); });
  Tensor x = testing::random_tensor({2, 8, 8, 3}, 4, DType::f32);
  Tensor labels = from_vector<int64_t>({0, 2}, {2});
  cross_entropy(m(x), labels).backward();
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front(), "block pre-backward");
  EXPECT_EQ(events.back(), "block backward");
  cross_entropy(m(x), labels).backward();
  EXPECT_EQ(pre, 2);
  EXPECT_EQ(post, 2);
}

TEST(Module, ExecutionOrderIsRecordedByForward) {
  ConvNeXt m(tiny_net());
  ExecutionOrderRecorder rec(m);
  m(testing::random_tensor({1, 8, 8, 3}, 5, DType::f32));
  const auto& o = rec.order();
  auto pos = [&](const std::string& n) { return std::find(o.begin(), o.end(), n) - o.begin(); };
  ASSERT_LT(size_t(pos("head.fc")), o.size());
  EXPECT_EQ(o.front(), "");
  EXPECT_LT(pos("stem.0"), pos("stages.0.blocks.0.conv_dw"));
  EXPECT_LT(pos("stages.0.blocks.0.norm"), pos("stages.1.downsample.0"));
  EXPECT_LT(pos("stages.1.blocks.0.norm"), pos("head.norm"));
  // The blocks call their MLP's ops fused, not the mlp modules (Note [Fused epilogues on the CPU]).
  EXPECT_EQ(size_t(pos("stages.0.blocks.0.mlp.fc1")), o.size());
}

}  // namespace
}  // namespace cz::nn
