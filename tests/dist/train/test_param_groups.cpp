// --layer-decay and the parameter groups (src/dist/train/param_groups.h): every parameter's layer id, lr
// scale and weight decay against the official ConvNeXt code's for ConvNeXt-T, -S and -B (the fixture made by
// tools/make_layer_decay_fixture.py from facebookresearch/ConvNeXt's optim_factory.py), what a shard's pieces
// carry, and the checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "dist/train/flags.h"
#include "dist/train/param_groups.h"
#include "nn/convnext.h"

namespace cz::train {
namespace {

using ::testing::HasSubstr;

nlohmann::json fixture() {
  std::ifstream in(CZ_LAYER_DECAY_FIXTURE);
  EXPECT_TRUE(in.good()) << CZ_LAYER_DECAY_FIXTURE;
  return nlohmann::json::parse(in);
}

struct Assigned {
  int64_t layer;
  double lr_scale, weight_decay;
};

std::map<std::string, Assigned> assigned(const TrainConfig& c) {
  std::map<std::string, Assigned> out;
  for (const ParamGroup& g : param_groups(c))
    for (const std::string& p : g.params)
      EXPECT_TRUE(out.emplace(p, Assigned{g.layer, g.lr_scale, g.weight_decay}).second) << p;
  return out;
}

TEST(LayerDecay, EveryParameterAsTheOfficialCodeAssignsIt) {
  const nlohmann::json f = fixture();
  ASSERT_EQ(f["num_layers"].get<int64_t>(), nn::kConvNeXtDecayLayers);
  for (const auto& [model, m] : f["models"].items()) {
    for (const auto& [decay_text, scales] : f["lr_scales"].items()) {
      TrainConfig c;
      c.model = model;
      c.num_classes = 1000;
      c.weight_decay = 0.05;
      c.layer_decay = std::stod(decay_text);
      c.validate();
      const auto got = assigned(c);
      ASSERT_EQ(got.size(), m["params"].size()) << model;
      for (const auto& p : m["params"]) {
        const std::string name = p[0];
        const int64_t layer = p[2];
        const auto it = got.find(name);
        ASSERT_NE(it, got.end()) << model << ": " << name << " (official " << p[1] << ") is in no group";
        EXPECT_EQ(it->second.layer, layer) << model << " " << name;
        // Both sides compute decay^(13 - layer) with the C library's pow: equal to the bit.
        EXPECT_EQ(it->second.lr_scale, scales[size_t(layer)].get<double>()) << model << " " << name;
        EXPECT_EQ(it->second.weight_decay, p[3].get<bool>() ? 0.05 : 0.0) << model << " " << name;
      }
    }
  }
}

TEST(LayerDecay, OffIsTimmsTwoGroupsAtScaleOne) {
  TrainConfig c;
  c.model = "tiny";
  c.num_classes = 1000;
  const std::vector<ParamGroup> g = param_groups(c);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "decay");  // stem.0.weight comes first
  EXPECT_EQ(g[1].name, "no_decay");
  for (const ParamGroup& x : g) EXPECT_EQ(x.lr_scale, 1.0);
  EXPECT_EQ(g[0].numel + g[1].numel, 28589128);  // every parameter of ConvNeXt-T, once
}

// The engine's layout pads and cuts parameters into shards; each piece of a shard has its parameter's scale.
TEST(LayerDecay, ShardPiecesCarryEachParametersScale) {
  TrainConfig c;
  c.depths = {1, 1, 4, 1};
  c.dims = {8, 16, 24, 32};
  c.num_classes = 5;
  c.layer_decay = 0.5;
  FlatLayout layout;
  layout.align = 16;
  for (const nn::ParamInfo& p : nn::convnext_parameters(c.model_config())) {
    layout.segments.push_back({p.name, layout.numel, p.numel, p.shape});
    layout.numel += (p.numel + 15) / 16 * 16;
  }
  const std::vector<ParamHyper> hyper = param_hyper(c, layout);
  const int64_t cuts[] = {0, 1000, 1001, 4321, layout.numel / 2, layout.numel};
  for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
    const ShardRange shard{cuts[k], cuts[k + 1]};
    for (const ShardPiece& piece : shard_pieces(layout, shard, hyper)) {
      for (int64_t e = shard.begin + piece.begin; e < shard.begin + piece.end; ++e) {
        size_t s = 0;  // the segment whose padded extent holds flat element e
        while (s + 1 < layout.segments.size() && layout.segments[s + 1].offset <= e) ++s;
        const std::string& name = layout.segments[s].name;
        ASSERT_EQ(piece.lr_scale, std::pow(0.5, double(13 - nn::convnext_layer_id(name))))
            << name << " @" << e;
      }
    }
  }
}

TEST(LayerDecay, BadValuesAndModelsNameTheFlag) {
  TrainConfig c;
  for (double bad : {0.0, -0.5, double(NAN), double(INFINITY)}) {
    c.layer_decay = bad;
    EXPECT_THAT(error_of<ValueError>([&] { c.validate(); }),
                HasSubstr("--layer-decay must be a finite value > 0"));
  }
  c.layer_decay = 0.8;
  c.depths = {2, 2, 2};
  c.dims = {8, 16, 24};
  EXPECT_THAT(error_of<ValueError>([&] { c.validate(); }),
              HasSubstr("--layer-decay numbers ConvNeXt's four stages"));
  c.depths = {1, 1, 30, 1};
  c.dims = {8, 16, 24, 32};
  EXPECT_THAT(error_of<ValueError>([&] { c.validate(); }),
              HasSubstr("at most 27 blocks, but the model has 30"));
  c.depths = {1, 1, 27, 1};
  EXPECT_EQ(error_of<ValueError>([&] { c.validate(); }), "(no error)");
  c.head_init_scale = -1;
  EXPECT_THAT(error_of<ValueError>([&] { c.validate(); }), HasSubstr("--head-init-scale must be >= 0"));
}

}  // namespace
}  // namespace cz::train
