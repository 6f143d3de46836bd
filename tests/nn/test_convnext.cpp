// ConvNeXt structure: timm's parameter counts and names, shapes, init, train/eval, checkpointing, drop-path.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/gradcheck.h"
#include "nn/convnext.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz::nn {
namespace {

using testing::all_close;

TEST(ConvNeXt, ParameterCountsEqualTimms) {
  // From timm 1.0: sum(p.numel()) and len(named_parameters()) of timm.create_model("convnext_<v>").
  const std::map<std::string, std::pair<int64_t, size_t>> timm = {
      {"atto", {3695520, 128}},  {"femto", {5217784, 128}},   {"pico", {9045672, 128}},
      {"nano", {15593560, 146}}, {"tiny", {28589128, 182}},   {"small", {50223688, 344}},
      {"base", {88591464, 344}}, {"large", {197767336, 344}},
  };
  for (const auto& [name, expected] : timm) {
    ConvNeXt m(convnext_variant(name));
    EXPECT_EQ(m.num_parameters(), expected.first) << name;
    EXPECT_EQ(m.named_parameters().size(), expected.second) << name;
  }
}

// Reference: torch.utils.flop_counter.FlopCounterMode over timm 1.0.31's models (FLOPs / 2), batch 1:
// convolutions plus the classifier's addmm. 97 px checks the stem's and the downsamplings' floors.
TEST(ConvNeXt, ForwardMacsEqualPyTorchsFlopCounter) {
  EXPECT_EQ(convnext_forward_macs(convnext_variant("atto"), 224), 547332480);
  EXPECT_EQ(convnext_forward_macs(convnext_variant("tiny"), 224), 4455531264);
  EXPECT_EQ(convnext_forward_macs(convnext_variant("base"), 224), 15354729472);
  EXPECT_EQ(convnext_forward_macs(convnext_variant("atto"), 64), 44974080);
  EXPECT_EQ(convnext_forward_macs(convnext_variant("tiny"), 97), 818989824);
  EXPECT_THROW(convnext_forward_macs(convnext_variant("tiny"), 3), ValueError);
}

TEST(ConvNeXt, NamesFollowTimmsStateDict) {
  ConvNeXtConfig cfg = convnext_variant("atto");
  ConvNeXt m(cfg);
  std::set<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.insert(n);
  for (const char* key :
       {"stem.0.weight", "stem.0.bias", "stem.1.weight", "stem.1.bias", "stages.0.blocks.0.conv_dw.weight",
        "stages.0.blocks.1.mlp.fc1.weight", "stages.0.blocks.1.mlp.fc2.bias", "stages.0.blocks.0.gamma",
        "stages.0.blocks.0.norm.weight", "stages.1.downsample.0.weight", "stages.1.downsample.1.weight",
        "stages.3.blocks.1.gamma", "head.norm.weight", "head.fc.weight", "head.fc.bias"})
    EXPECT_TRUE(names.count(key)) << key;
  EXPECT_FALSE(names.count("stages.0.downsample.0.weight"));
  EXPECT_EQ(m.find_module("stages.1.downsample.1")->type_name(), "PatchifyConv2d");
  EXPECT_EQ(m.find_module("stages.2.blocks.5.mlp.act")->type_name(), "GELU");
  EXPECT_EQ(m.find_module("stages.2.blocks.6"), nullptr);
}

// Note [ConvNeXt structure]: the units ZeRO stage 3 gathers are modules of the built model, in forward order,
// and every parameter lies in exactly one of them.
TEST(ConvNeXt, UnitsAreTheStemDownsamplesBlocksAndHead) {
  ConvNeXtConfig cfg;
  cfg.depths = {2, 1, 3};
  cfg.dims = {8, 16, 24};
  cfg.num_classes = 5;
  ConvNeXt m(cfg);
  const std::vector<std::string> units = m.units();
  EXPECT_EQ(units,
            (std::vector<std::string>{"stem", "stages.0.blocks.0", "stages.0.blocks.1", "stages.1.downsample",
                                      "stages.1.blocks.0", "stages.2.downsample", "stages.2.blocks.0",
                                      "stages.2.blocks.1", "stages.2.blocks.2", "head"}));
  for (const std::string& u : units) EXPECT_NE(m.find_module(u), nullptr) << u;
  for (const auto& [name, p] : m.named_parameters()) {
    const auto holds = [&name](const std::string& u) { return name.rfind(u + ".", 0) == 0; };
    EXPECT_EQ(std::count_if(units.begin(), units.end(), holds), 1) << name;
  }
  EXPECT_EQ(convnext_units(convnext_variant("atto")).size(), 1u + 3u + 12u + 1u);
}

TEST(ConvNeXt, UnknownVariantsAndBadConfigsAreRejectedByName) {
  try {
    convnext_variant("convnext_mega");
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("convnext_mega"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("atto"), std::string::npos);
  }
  ConvNeXtConfig cfg;
  cfg.depths = {1, 1};
  cfg.dims = {8, 16, 32};
  EXPECT_THROW(ConvNeXt{cfg}, ValueError);
  cfg.dims = {8, 0};
  EXPECT_THROW(ConvNeXt{cfg}, ValueError);
}

ConvNeXtConfig small_config(double drop_path = 0.0) {
  ConvNeXtConfig cfg;
  cfg.depths = {1, 2};
  cfg.dims = {8, 12};
  cfg.num_classes = 5;
  cfg.drop_path_rate = drop_path;
  cfg.layer_scale_init = 0.5;
  return cfg;
}

TEST(ConvNeXt, ForwardShapesAndInitStatistics) {
  ConvNeXt m(convnext_variant("atto"));
  m.init_weights(1);
  Tensor x = testing::random_tensor({2, 32, 32, 3}, 2, DType::f32);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = m(x);
  }
  EXPECT_EQ(y.sizes(), (Shape{2, 1000}));
  const auto w = m.find_module("stages.2.blocks.0.mlp.fc1")->local_parameters()[0].second.to_vector<double>();
  double s = 0, s2 = 0;
  for (double v : w) s += v, s2 += v * v;
  const double mean = s / double(w.size()), sd = std::sqrt(s2 / double(w.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(sd, 0.02, 1e-3);
  for (auto& [n, p] : m.named_parameters()) {
    // Braces: EXPECT_* expand to an if/else, which -Wdangling-else flags under a bare if.
    if (n.ends_with(".gamma")) {
      EXPECT_EQ(p.to_vector<float>()[0], 1e-6f) << n;
    }
    if (n.ends_with("fc1.bias")) {
      EXPECT_EQ(p.to_vector<float>()[3], 0.0f) << n;
    }
    if (n == "stem.1.weight") {
      EXPECT_EQ(p.to_vector<float>()[1], 1.0f);
    }
  }
  EXPECT_THROW(m(testing::random_tensor({2, 3, 32, 32}, 3, DType::f32)), ShapeError);  // NCHW by mistake
}

std::vector<Tensor> grads_of(ConvNeXt& m, const Tensor& x, const Tensor& labels, bool checkpointing) {
  for (Tensor& p : m.parameters()) p.set_grad(Tensor());
  m.set_activation_checkpointing(checkpointing);
  m.set_drop_path_context(7, 3, 0);
  cross_entropy(m(x), labels, 0.1).backward();
  std::vector<Tensor> g;
  for (Tensor& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

TEST(ConvNeXt, CheckpointedGradientsEqualPlainOnes) {
  for (double dp : {0.0, 0.5}) {
    ConvNeXt m(small_config(dp));
    m.init_weights(4);
    Tensor xf = testing::random_tensor({4, 16, 16, 3}, 5, DType::f32);
    Tensor labels = from_vector<int64_t>({0, 3, 1, 4}, {4});
    const auto plain = grads_of(m, xf, labels, false);
    const auto ckpt = grads_of(m, xf, labels, true);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_TRUE(all_close(ckpt[i], plain[i], 0, 0)) << "dp " << dp << " " << i;
  }
}

TEST(ConvNeXt, DropPathMasksDependOnGlobalSampleIndexOnly) {
  // One process with the whole batch equals two "ranks" with half each (Note [Drop-path masks]).
  ConvNeXt m(small_config(0.6));
  m.init_weights(6);
  Tensor x = testing::random_tensor({4, 16, 16, 3}, 7, DType::f32);
  NoGradGuard no_grad;
  m.set_drop_path_context(11, 5, 0);
  const Tensor full_batch = m(x);
  m.set_drop_path_context(11, 5, 0);
  const Tensor first = m(x.narrow(0, 0, 2).contiguous());
  m.set_drop_path_context(11, 5, 2);
  const Tensor second = m(x.narrow(0, 2, 2).contiguous());
  EXPECT_TRUE(all_close(first, full_batch.narrow(0, 0, 2), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(second, full_batch.narrow(0, 2, 2), 1e-6, 1e-6));
  // A different step draws different masks; eval mode draws none.
  m.set_drop_path_context(11, 6, 0);
  EXPECT_FALSE(all_close(m(x), full_batch, 1e-6, 1e-6));
  m.eval();
  const Tensor e1 = m(x);
  m.set_drop_path_context(11, 9, 0);
  EXPECT_TRUE(all_close(m(x), e1, 0, 0));
}

TEST(ConvNeXt, ResetHeadReinitialisesOnlyTheClassifier) {
  ConvNeXt m(small_config());
  m.init_weights(8);
  std::map<std::string, std::vector<float>> before;
  for (auto& [n, p] : m.named_parameters()) before[n] = p.to_vector<float>();
  m.reset_head(99);
  for (auto& [n, p] : m.named_parameters()) {
    if (n == "head.fc.weight")
      EXPECT_NE(p.to_vector<float>(), before[n]);
    else
      EXPECT_EQ(p.to_vector<float>(), before[n]) << n;
  }
}

// ConvNeXt V2: from timm 1.0.31, sum(p.numel()) and len(named_parameters()) of
// timm.create_model("convnextv2_<v>"); huge from the description alone (660M parameters).
TEST(ConvNeXtV2, ParameterCountsEqualTimms) {
  const std::map<std::string, std::pair<int64_t, size_t>> timm = {
      {"convnextv2_atto", {3708400, 140}},
      {"convnextv2_nano", {15623800, 160}},
      {"convnextv2_tiny", {28635496, 200}},
  };
  for (const auto& [name, expected] : timm) {
    ConvNeXt m(convnext_variant(name));
    EXPECT_EQ(m.num_parameters(), expected.first) << name;
    EXPECT_EQ(m.named_parameters().size(), expected.second) << name;
  }
  const std::map<std::string, int64_t> described = {
      {"convnextv2_femto", 5233240}, {"convnextv2_pico", 9066280},    {"convnextv2_small", 50318440},
      {"convnextv2_base", 88717800}, {"convnextv2_large", 197956840}, {"convnextv2_huge", 660289640}};
  for (const auto& [name, expected] : described) {
    int64_t n = 0;
    for (const ParamInfo& p : convnext_parameters(convnext_variant(name))) n += p.numel;
    EXPECT_EQ(n, expected) << name;
  }
}

// timm's registration order for a V2 block: no gamma, and the MLP's fc1, grn, fc2.
TEST(ConvNeXtV2, BlockParametersInTimmsOrder) {
  const ConvNeXtConfig cfg = convnext_variant("convnextv2_atto");
  EXPECT_TRUE(cfg.grn && cfg.conv_mlp);
  EXPECT_EQ(cfg.layer_scale_init, 0);
  EXPECT_EQ(cfg.name, "convnextv2_atto");
  ConvNeXt m(cfg);
  const NamedParameters params = m.named_parameters();
  std::vector<std::string> block;
  for (const auto& [n, p] : params)
    if (n.rfind("stages.0.blocks.0.", 0) == 0) block.push_back(n.substr(18));
  EXPECT_EQ(block, (std::vector<std::string>{"conv_dw.weight", "conv_dw.bias", "norm.weight", "norm.bias",
                                             "mlp.fc1.weight", "mlp.fc1.bias", "mlp.grn.weight",
                                             "mlp.grn.bias", "mlp.fc2.weight", "mlp.fc2.bias"}));
  EXPECT_EQ(m.find_module("stages.2.blocks.5.mlp.grn")->type_name(), "GlobalResponseNorm");
  EXPECT_EQ(convnext_layer_id("stages.2.blocks.4.mlp.grn.weight"), 4);
  EXPECT_EQ(convnext_layer_id("stages.1.blocks.0.mlp.grn.bias"), 2);
  m.init_weights(3);  // timm leaves GRN at zero
  for (const auto& [n, p] : params) {
    if (n.find(".grn.") == std::string::npos) continue;
    for (float v : p.to_vector<float>()) ASSERT_EQ(v, 0.0f) << n;
  }
  ConvNeXtConfig bad = cfg;
  bad.layer_scale_init = 1e-6;
  EXPECT_THROW(ConvNeXt{bad}, ValueError);
}

// A V2 block is x + fc2(grn(gelu(fc1(norm(conv_dw(x)))))), forward and backward, as its modules compose.
TEST(ConvNeXtV2, BlockIsItsModulesComposed) {
  ConvNeXtConfig cfg;
  cfg.depths = {1};
  cfg.dims = {8};
  cfg.grn = true;
  cfg.layer_scale_init = 0;
  ConvNeXtBlock block(8, cfg, 0.0, 0, std::make_shared<DropPathContext>(), {});
  uint64_t seed = 20;
  for (auto& [n, p] : block.named_parameters()) {
    NoGradGuard g;
    Tensor(p).copy_(testing::random_tensor(p.sizes(), ++seed, DType::f32, -0.5, 0.5));
  }
  Tensor x = testing::random_tensor({2, 5, 5, 8}, 11, DType::f32);
  x.set_requires_grad(true);
  const Tensor y = block(x);
  Tensor ref = x;
  for (const char* m : {"conv_dw", "norm", "mlp.fc1", "mlp.act", "mlp.grn", "mlp.fc2"})
    ref = (*block.find_module(m))(ref);
  ref = add(x, ref);
  EXPECT_TRUE(all_close(y, ref, 1e-5, 1e-6));
}

}  // namespace
}  // namespace cz::nn
