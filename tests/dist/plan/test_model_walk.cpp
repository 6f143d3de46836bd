// The model's walk as the what-if times it (op_costs.h step_work over nn::ModelSpec::walk), for ConvNeXt V1
// and V2: every parameter's gradient is completed by exactly one op, in the model's units; V2's blocks run
// GRN between fc1 and fc2 (no fused fc2: no layer scale), with its cost; and a V2 what-if row is timed from
// that work (more compute than V1 at the same shape, more bytes on the wire for its GRN parameters).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "dist/plan/op_costs.h"
#include "dist/plan/what_if.h"
#include "dist/train/plan_request.h"
#include "nn/convnext.h"

namespace cz::plan {
namespace {

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(ModelWalk, EveryGradientIsCompletedOnceInItsUnit) {
  for (const char* name : {"atto", "convnextv2_atto"})
    for (double drop : {0.0, 0.1})
      for (bool checkpointing : {false, true})
        for (bool cuda : {false, true}) {
          nn::ConvNeXtConfig cfg = nn::convnext_variant(name);
          cfg.drop_path_rate = drop;
          const auto spec = nn::convnext_spec(cfg);
          const std::vector<ModuleCost> work = step_work(*spec, 64, 4, DType::f32, checkpointing, cuda);
          std::vector<std::string> modules, grads, want;
          for (const ModuleCost& m : work) {
            modules.push_back(m.module);
            for (const OpCost& op : m.backward)
              for (const std::string& g : op.grads) {
                EXPECT_EQ(g.rfind(m.module + ".", 0), 0u) << g << " completed in " << m.module;
                grads.push_back(g);
              }
          }
          for (const nn::ParamInfo& p : spec->parameters()) want.push_back(p.name);
          const std::string what = fmt::format("{} drop {} ckpt {} cuda {}", name, drop, checkpointing, cuda);
          EXPECT_EQ(modules, spec->units()) << what;
          EXPECT_EQ(sorted(grads), sorted(want)) << what;
        }
}

TEST(ModelWalk, V2BlocksRunGrnBetweenFc1AndFc2) {
  const auto v2 = nn::convnext_spec(nn::convnext_variant("convnextv2_atto"));
  const int64_t n = 4, image = 64;
  const std::vector<ModuleCost> work = step_work(*v2, image, n, DType::f32, false, false);
  int blocks = 0;
  for (const ModuleCost& m : work) {
    if (m.module.find(".blocks.") == std::string::npos) continue;
    ++blocks;
    std::vector<std::string> fwd, bwd;
    for (const OpCost& op : m.forward) fwd.push_back(op.name);
    for (const OpCost& op : m.backward) bwd.push_back(op.name);
    EXPECT_THAT(
        fwd, ::testing::ElementsAre("depthwise_conv2d", "layer_norm", "linear_gelu", "grn", "linear", "add"))
        << m.module;
    EXPECT_THAT(bwd,
                ::testing::ElementsAre("LinearBackward", "GrnBackward", "LinearGeluBackward",
                                       "LayerNormBackward", "DepthwiseConv2dBackward", "grad accumulate"))
        << m.module;
    // GRN over the 4C hidden channels: 6 flops an element forward, reading twice and writing once.
    const int stage = m.module[7] - '0';
    const int64_t side = image / 4 >> stage, c = 40 << stage, hidden = n * side * side * 4 * c;
    EXPECT_EQ(m.forward[3].flops, 6.0 * double(hidden)) << m.module;
    EXPECT_EQ(m.forward[3].bytes, 3.0 * double(hidden) * 4) << m.module;
    EXPECT_THAT(m.backward[1].grads,
                ::testing::ElementsAre(m.module + ".mlp.grn.bias", m.module + ".mlp.grn.weight"));
  }
  EXPECT_EQ(blocks, 2 + 2 + 6 + 2);
}

TEST(WhatIfV2, RowsAreTimedFromTheV2Walk) {
  const dist::Topology topo = dist::Topology::load(std::string(CZ_DIST_TEST_DATA) + "/dual_socket_8gpu.json");
  const auto run = [&](const char* model) {
    train::TrainConfig cfg;
    cfg.model = model;
    cfg.image_size = 64;
    cfg.micro_batch = 8;
    cfg.device = "cuda";
    WhatIfRequest req = train::what_if_request(cfg);
    req.topology = topo;
    req.compute = default_compute_table(DType::f32);
    req.ranks = {1, 8};
    req.memory = false;
    return what_if(req);
  };
  const WhatIf v1 = run("atto"), v2 = run("convnextv2_atto");
  EXPECT_EQ(v2.model, "convnextv2_atto");
  ASSERT_EQ(v2.rows.size(), 8u);  // stages 0-3 at 1 and 8 ranks
  ASSERT_EQ(v1.rows.size(), v2.rows.size());
  for (size_t i = 0; i < v2.rows.size(); ++i) {
    const WhatIfRow &a = v1.rows[i], &b = v2.rows[i];
    ASSERT_EQ(a.stage, b.stage);
    ASSERT_EQ(a.ranks, b.ranks);
    EXPECT_GT(b.compute_s, a.compute_s) << "stage " << b.stage << ", " << b.ranks << " ranks";
    EXPECT_GT(b.step_s, 0);
    if (b.ranks > 1) EXPECT_GT(b.comm_bytes, a.comm_bytes) << "stage " << b.stage;  // GRN's parameters
  }
  EXPECT_THAT(format_what_if(v2), ::testing::HasSubstr("convnextv2_atto"));
}

}  // namespace
}  // namespace cz::plan
