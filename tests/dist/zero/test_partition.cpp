// ZeRO partition arithmetic (Note [ZeRO partitioning]) without MPI.
#include <gtest/gtest.h>

#include "dist/zero/partition.h"
#include "dist/zero/step_plan.h"

namespace cz::zero {
namespace {

std::vector<ParamShape> shapes() {
  return {
      {"stem.0.weight", {8, 4, 4, 3}}, {"stem.0.bias", {8}},      {"blocks.0.w", {33}}, {"blocks.0.b", {7}},
      {"blocks.1.w", {100}},           {"head.fc.weight", {5, 8}}};
}

StepPlan plan(int stage, int world) {
  return make_step_plan({.stage = stage}, {.world = world});
}

void check_tiling(const ZeroLayout& z, int world) {
  int64_t at = 0;
  for (size_t p = 0; p < z.partitions.size(); ++p) {
    const Partition& part = z.partitions[p];
    EXPECT_EQ(part.begin, at);
    EXPECT_EQ(part.numel % (int64_t(z.shards) * z.flat.align), 0) << part.name;
    for (size_t i = part.first_param; i < part.end_param; ++i) {
      const FlatSegment& s = z.flat.segments[i];
      EXPECT_GE(s.offset, part.begin);
      EXPECT_LE(s.offset + s.numel, part.begin + part.numel);
      EXPECT_EQ(s.offset % z.flat.align, 0);
    }
    at += part.numel;
  }
  EXPECT_EQ(at, z.flat.numel);
  // Every flat element belongs to exactly one rank's chunk; local offsets are the chunks back to back.
  std::vector<int> owner(size_t(z.flat.numel), 0);
  for (int r = 0; r < z.shards; ++r) {
    int64_t local = 0;
    const auto ranges = z.ranges(r);
    ASSERT_EQ(ranges.size(), z.partitions.size());
    for (size_t p = 0; p < ranges.size(); ++p) {
      EXPECT_EQ(z.local_offset(p), local);
      local += ranges[p].numel();
      for (int64_t e = ranges[p].begin; e < ranges[p].end; ++e) ++owner[size_t(e)];
    }
    EXPECT_EQ(local, z.shard_numel());
  }
  for (int o : owner) EXPECT_EQ(o, 1);
  (void)world;
}

TEST(ZeroPartition, BucketsOfWholeParametersPaddedToTheWorld) {
  for (int world : {1, 2, 3, 4}) {
    for (int stage : {0, 1, 2}) {
      const ZeroLayout z = plan_layout(shapes(), plan(stage, world), 200, {});
      EXPECT_EQ(z.shards, stage == 0 ? 1 : world);
      check_tiling(z, world);
      EXPECT_EQ(z.params_numel(), 384 + 8 + 33 + 7 + 100 + 40);
      for (const Partition& p : z.partitions)  // at most 200 elements unless one parameter is larger
        EXPECT_TRUE(
            p.end_param - p.first_param == 1 ||
            z.flat.segments[p.end_param - 1].offset + z.flat.segments[p.end_param - 1].numel - p.begin <= 200)
            << p.name;
    }
  }
  // The 384-element stem weight is a bucket of its own.
  const ZeroLayout z = plan_layout(shapes(), plan(1, 2), 200, {});
  EXPECT_EQ(z.partitions[0].end_param, 1u);
}

TEST(ZeroPartition, UnitsAtStageThree) {
  const auto units = assign_units(shapes(), {"stem", "blocks.0", "blocks.1", "head"});
  EXPECT_EQ(units, (std::vector<std::string>{"stem", "stem", "blocks.0", "blocks.0", "blocks.1", "head"}));
  const ZeroLayout z = plan_layout(shapes(), plan(3, 4), 1, units);
  ASSERT_EQ(z.partitions.size(), 4u);
  EXPECT_EQ(z.partitions[1].name, "blocks.0");
  EXPECT_EQ(z.partitions[1].end_param - z.partitions[1].first_param, 2u);
  check_tiling(z, 4);
  // A chunk boundary falls inside a parameter: shards straddle parameters.
  const ShardRange r = z.chunk_range(0, 1);
  EXPECT_GT(r.begin, z.flat.segments[0].offset);
  EXPECT_LT(r.begin, z.flat.segments[0].offset + z.flat.segments[0].numel);
}

TEST(ZeroPartition, BadInputNamesTheProblem) {
  EXPECT_THROW(assign_units(shapes(), {"stem", "blocks.0"}), ValueError);  // blocks.1.w, head.fc.weight
  try {
    assign_units(shapes(), {"stem"});
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.w"), std::string::npos);
  }
  EXPECT_THROW(plan(4, 2), ValueError);
  EXPECT_THROW(plan(1, 0), ValueError);
  EXPECT_THROW(plan_layout(shapes(), plan(3, 2), 100, {"a", "b", "a", "b", "a", "b"}),
               ValueError);  // not consecutive
}

}  // namespace
}  // namespace cz::zero

namespace cz::zero {
namespace {

TEST(ZeroPartition, BucketsAreAtMostAQuarterOfTheModel) {
  EXPECT_EQ(bucket_elems(25 << 20, 4, 100'000'000), (25 << 20) / 4);  // a big model: --bucket-mb as asked
  EXPECT_EQ(bucket_elems(25 << 20, 2, 100'000'000), (25 << 20) / 2);  // in the reduce dtype
  EXPECT_EQ(bucket_elems(25 << 20, 4, 3'700'000), 925'000);           // atto: four buckets, not one
  EXPECT_EQ(bucket_elems(25 << 20, 4, 1000), 1 << 16);                // never below 64 Ki elements
  EXPECT_EQ(bucket_elems(100, 4, 1000), 25);                          // a smaller request wins
  EXPECT_THROW(bucket_elems(0, 4, 1000), ValueError);
}

}  // namespace
}  // namespace cz::zero
