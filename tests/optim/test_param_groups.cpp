// timm's weight-decay rule and the pieces a shard is cut into.
#include "optim/param_groups.h"

#include "optim_testing.h"

namespace cz {
namespace {

FlatLayout convnext_like_layout() {
  return testing::random_flat({{"stem.0.weight", {8, 3, 4, 4}},
                               {"stem.1.weight", {8}},
                               {"stem.1.bias", {8}},
                               {"stages.0.blocks.0.dwconv.weight", {8, 1, 7, 7}},
                               {"stages.0.blocks.0.dwconv.bias", {8}},
                               {"stages.0.blocks.0.gamma", {8}},
                               {"head.fc.weight", {10, 8}},
                               {"head.fc.bias", {10}},
                               {"cls_token", {1, 1, 8}}},
                              1)
      .layout;
}

TEST(WeightDecayRule, DecaysMatricesAndConvKernelsNotVectorsOrBiases) {
  const FlatLayout layout = convnext_like_layout();
  const std::vector<ParamHyper> h = timm_weight_decay(layout, 0.05);
  ASSERT_EQ(h.size(), layout.segments.size());
  std::vector<std::string> decayed;
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i].weight_decay != 0) decayed.push_back(layout.segments[i].name);
  EXPECT_EQ(decayed, (std::vector<std::string>{"stem.0.weight", "stages.0.blocks.0.dwconv.weight",
                                               "head.fc.weight", "cls_token"}));
  for (const ParamHyper& p : h) {
    EXPECT_TRUE(p.weight_decay == 0.05 || p.weight_decay == 0.0);
    EXPECT_EQ(p.lr_scale, 1.0);
  }
  // An explicit no-decay list (timm's model.no_weight_decay()); an unknown name is an error, not a no-op.
  const auto h2 = timm_weight_decay(layout, 0.05, {"cls_token"});
  EXPECT_EQ(h2.back().weight_decay, 0.0);
  EXPECT_TRUE(
      testing::throws_with<ValueError>([&] { timm_weight_decay(layout, 0.05, {"cls_tokn"}); }, {"cls_tokn"}));
  EXPECT_TRUE(
      testing::throws_with<ValueError>([&] { timm_weight_decay(layout, -1.0); }, {"weight_decay", "-1"}));
}

TEST(ShardPieces, TileTheShardAndMergeEqualNeighbours) {
  // a.weight (decay) at [0, 20) padded to 32, a.bias [32, 37) -> 48, b.gamma [48, 51) -> 64, c.weight [64,
  // 76)
  // -> 80: numel 80.
  const FlatLayout layout =
      testing::random_flat({{"a.weight", {4, 5}}, {"a.bias", {5}}, {"b.gamma", {3}}, {"c.weight", {3, 4}}}, 2)
          .layout;
  ASSERT_EQ(layout.numel, 80);
  const auto h = timm_weight_decay(layout, 0.1);
  const auto whole = shard_pieces(layout, ShardRange::whole(layout), h);
  ASSERT_EQ(whole.size(), 3u);  // a.bias and b.gamma merge: same hyper-parameters
  EXPECT_EQ(whole[0].begin, 0);
  EXPECT_EQ(whole[0].end, 32);
  EXPECT_EQ(whole[0].weight_decay, 0.1);
  EXPECT_EQ(whole[1].begin, 32);
  EXPECT_EQ(whole[1].end, 64);
  EXPECT_EQ(whole[1].weight_decay, 0.0);
  EXPECT_EQ(whole[2].begin, 64);
  EXPECT_EQ(whole[2].end, 80);

  // A shard starting inside a.weight and ending inside c.weight: local offsets, both straddlers kept.
  const auto mid = shard_pieces(layout, {10, 70}, h);
  ASSERT_EQ(mid.size(), 3u);
  EXPECT_EQ(mid[0].begin, 0);
  EXPECT_EQ(mid[0].end, 22);
  EXPECT_EQ(mid[1].end, 54);
  EXPECT_EQ(mid[2].begin, 54);
  EXPECT_EQ(mid[2].end, 60);
  EXPECT_EQ(mid[2].weight_decay, 0.1);

  // Different lr scales do not merge.
  auto h2 = h;
  h2[2].lr_scale = 0.5;
  EXPECT_EQ(shard_pieces(layout, ShardRange::whole(layout), h2).size(), 4u);
  EXPECT_TRUE(shard_pieces(layout, {40, 40}, h).empty());
}

TEST(ShardPieces, BadArgumentsNameTheirValues) {
  const FlatLayout layout = testing::random_flat({{"w", {4, 4}}}, 3).layout;
  const auto h = timm_weight_decay(layout, 0.1);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { shard_pieces(layout, {0, 17}, h); }, {"[0, 17)", "16"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { shard_pieces(layout, {5, 4}, h); }, {"[5, 4)"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { shard_pieces(layout, {0, 16}, {}); }, {"0 hyper"}));
  auto bad = h;
  bad[0].lr_scale = -2;
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        shard_pieces(layout, {0, 16}, bad);
      },
      {"lr_scale", "'w'", "-2"}));
}

}  // namespace
}  // namespace cz
