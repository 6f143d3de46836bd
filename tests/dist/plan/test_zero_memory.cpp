// The ZeRO memory model (Note [ZeRO memory model]) row by row against its formulas, the engine's partitions
// for ConvNeXt, and the planner's parameter list against the real module tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "dist/plan/zero_memory.h"
#include "nn/convnext.h"

namespace cz::plan {
namespace {

TEST(ModelShapes, MatchTheModulesNamesShapesAndOrder) {
  nn::ConvNeXtConfig custom;
  custom.depths = {2, 1, 3};
  custom.dims = {8, 16, 24};
  custom.num_classes = 5;
  nn::ConvNeXtConfig no_gamma = nn::convnext_variant("atto");
  no_gamma.layer_scale_init = 0;
  for (const nn::ConvNeXtConfig& cfg : {nn::convnext_variant("atto"), custom, no_gamma}) {
    const nn::ConvNeXt model(cfg);
    const nn::NamedParameters real = model.named_parameters();
    const std::vector<nn::ParamInfo> planned = nn::convnext_parameters(cfg);
    ASSERT_EQ(planned.size(), real.size()) << cfg.name;
    for (size_t i = 0; i < real.size(); ++i) {
      EXPECT_EQ(planned[i].name, real[i].first);
      EXPECT_EQ(planned[i].shape, real[i].second.sizes()) << real[i].first;
      EXPECT_EQ(planned[i].numel, real[i].second.numel()) << real[i].first;
      EXPECT_EQ(planned[i].unit, real[i].first.substr(0, planned[i].unit.size())) << real[i].first;
    }
  }
  // timm's count for ConvNeXt-T (README), without building it.
  const std::vector<nn::ParamInfo> tiny = nn::convnext_parameters(nn::convnext_variant("tiny"));
  EXPECT_EQ(std::accumulate(tiny.begin(), tiny.end(), int64_t(0),
                            [](int64_t n, const nn::ParamInfo& p) { return n + p.numel; }),
            28'589'128);
}

// The step plan of `stage` on `n` ranks with buckets of `bucket_mb` MiB of `reduce` (as train::zero_config
// has them), and the engine's layout under it.
zero::StepPlan plan_of(int stage, int n, double bucket_mb, DType reduce = DType::f32,
                       DType compute = DType::f32, bool offload = false) {
  zero::ZeroConfig c;
  c.stage = stage;
  c.bucket_bytes = std::max<int64_t>(1, int64_t(bucket_mb * (1 << 20)));
  c.reduce_dtype = reduce;
  c.compute_dtype = compute;
  c.offload = offload;
  return zero::make_step_plan(c, {.world = n});
}
zero::ZeroLayout layout_of(const std::vector<nn::ParamInfo>& params, int stage, int n, double bucket_mb,
                           DType reduce) {
  return zero_layout(params, plan_of(stage, n, bucket_mb, reduce));
}

// The sizes of a layout's partitions, in flat order.
std::vector<int64_t> sizes(const zero::ZeroLayout& z) {
  std::vector<int64_t> out;
  for (const zero::Partition& p : z.partitions) out.push_back(p.numel);
  return out;
}

TEST(ZeroLayout, BucketsUnitsAndPaddingAsTheEngineCutsThem) {
  const std::vector<nn::ParamInfo> params = nn::convnext_parameters(nn::convnext_variant("atto"));
  const int64_t flat = flat_numel(params);
  for (int world : {1, 3, 4}) {
    // Units: stem, 3 downsamples, 12 blocks, head.
    const zero::ZeroLayout units = layout_of(params, 3, world, 25, DType::f32);
    EXPECT_EQ(units.partitions.size(), 1u + 3u + 12u + 1u);
    EXPECT_EQ(units.partitions.front().name, "stem");
    EXPECT_EQ(units.partitions.back().name, "head");
    EXPECT_EQ(units.shards, world);
    for (int64_t u : sizes(units)) EXPECT_EQ(u % (16 * world), 0);
    EXPECT_GE(units.flat.numel, flat);
    EXPECT_LT(units.flat.numel, flat + int64_t(units.partitions.size()) * 16 * world);
    EXPECT_EQ(units.shard_numel() * world, units.flat.numel);
  }
  // One rank, or stage 0 (one shard whatever the ranks): the flat buffer exactly, whatever the cut.
  for (int stage : {0, 3}) EXPECT_EQ(layout_of(params, stage, 1, 1, DType::f32).flat.numel, flat);
  EXPECT_EQ(layout_of(params, 0, 4, 1, DType::f32).flat.numel, flat);
  // Buckets of up to 1 MiB: 262144 fp32 or 524288 bf16 elements. atto's stage-3 fc weights (409600) and its
  // 1000-class head (320000) are larger than the fp32 limit: each is a bucket of its own.
  for (DType reduce : {DType::f32, DType::bf16}) {
    const int64_t limit = (int64_t(1) << 20) / int64_t(dtype_size(reduce));
    const zero::ZeroLayout z = layout_of(params, 1, 2, 1, reduce);
    EXPECT_GT(z.partitions.size(), 1u);
    size_t oversized = 0;
    for (const zero::Partition& p : z.partitions) {
      if (p.numel <= limit) continue;
      ++oversized;
      EXPECT_EQ(p.end_param - p.first_param, 1u) << p.name;
    }
    EXPECT_EQ(oversized, reduce == DType::f32 ? 5u : 0u);
  }
  // A parameter larger than the bucket is a bucket of its own.
  const std::vector<nn::ParamInfo> big = {
      {"a", {10}, 10, "u"}, {"b", {5000}, 5000, "u"}, {"c", {10}, 10, "u"}};
  EXPECT_EQ(sizes(layout_of(big, 0, 1, 1000.0 * 4 / double(1 << 20), DType::f32)),
            (std::vector<int64_t>{16, 5008, 16}));
}

// Row totals of Note [ZeRO memory model], Ψ and N given.
struct Expected {
  int64_t params, master, grads, state, ema;
};

Expected formulas(int stage, bool mixed, int64_t psi, int n, int64_t ec) {
  const int64_t shard = psi / n, rep = stage == 0 ? psi : shard;
  Expected e{};
  e.params = (stage == 3 ? shard : psi) * (mixed ? ec : 4);
  e.master = mixed ? rep * 4 : 0;
  e.grads = mixed ? (stage <= 1 ? psi * ec + rep * 4 : shard * 4) : (stage <= 1 ? psi : shard) * 4;
  e.state = 8 * rep;
  e.ema = 4 * rep;
  return e;
}

// Four parameters, each its own bucket (a bucket of one element) or unit, sizes multiples of 16·n: no
// padding, so Ψ is their sum.
ZeroSpec four_partitions(int stage, int n, DType compute = DType::f32, bool offload = false) {
  const std::vector<nn::ParamInfo> params = {{"a", {64 * n}, 64 * n, "u0"},
                                             {"b", {1024 * n}, 1024 * n, "u1"},
                                             {"c", {16 * n}, 16 * n, "u2"},
                                             {"d", {4096 * n}, 4096 * n, "u3"}};
  ZeroSpec s;
  s.plan = plan_of(stage, n, 4.0 / double(1 << 20), DType::f32, compute, offload);
  s.layout = zero_layout(params, s.plan);
  return s;
}

TEST(ZeroMemoryModel, EveryStageFollowsTheFormulas) {
  for (int n : {1, 4}) {
    const int64_t psi = (64 + 1024 + 16 + 4096) * n;
    for (DType compute : {DType::f32, DType::bf16, DType::f16})
      for (int stage = 0; stage <= 3; ++stage) {
        ZeroSpec s = four_partitions(stage, n, compute);
        ASSERT_EQ(s.layout.partitions.size(), 4u);
        s.ema = true;
        const ZeroState z = zero_model_state(s);
        const bool mixed = compute != DType::f32;
        const Expected e = formulas(stage, mixed, psi, n, int64_t(dtype_size(compute)));
        SCOPED_TRACE(::testing::Message()
                     << "stage " << stage << ", " << n << " ranks, " << dtype_name(compute));
        EXPECT_EQ(z.psi, psi);
        EXPECT_EQ(z.shard, stage == 0 ? psi : psi / n);
        EXPECT_EQ(z.max_partition, 4096 * n);
        EXPECT_EQ(z.row_bytes(StateRow::parameters), e.params);
        EXPECT_EQ(z.row_bytes(StateRow::master_weights), e.master);
        EXPECT_EQ(z.row_bytes(StateRow::gradients), e.grads);
        EXPECT_EQ(z.row_bytes(StateRow::optimizer_state), e.state);
        EXPECT_EQ(z.row_bytes(StateRow::ema), e.ema);
        EXPECT_EQ(z.host_bytes(), 0);
      }
  }
}

// Note [CPU offload]: master shard, fp32 gradient shard and optimizer state move to pinned host memory; the
// device keeps the compute copy (and the gradient buffer at stages 0-1).
TEST(ZeroMemoryModel, OffloadMovesMasterGradientShardAndStateToTheHost) {
  const int n = 4;
  const int64_t psi = (64 + 1024 + 16 + 4096) * n;
  for (DType compute : {DType::f32, DType::bf16})
    for (int stage = 0; stage <= 3; ++stage)
      for (bool cpu_device : {true, false}) {
        ZeroSpec s = four_partitions(stage, n, compute, true);
        s.ema = true;
        s.cpu_device = cpu_device;
        const ZeroState z = zero_model_state(s);
        const int64_t ec = int64_t(dtype_size(compute)), shard = stage == 0 ? psi : psi / n;
        SCOPED_TRACE(::testing::Message() << "stage " << stage << ", " << dtype_name(compute));
        EXPECT_EQ(z.row_bytes(StateRow::parameters), (stage == 3 ? shard : psi) * ec);
        EXPECT_EQ(z.row_bytes(StateRow::gradients), stage <= 1 ? psi * ec : 0);
        EXPECT_EQ(z.row_bytes(StateRow::master_weights), 0);
        EXPECT_EQ(z.row_bytes(StateRow::optimizer_state), 0);
        EXPECT_EQ(z.host_row_bytes(StateRow::master_weights), 4 * shard);
        EXPECT_EQ(z.host_row_bytes(StateRow::gradients), 4 * shard);
        EXPECT_EQ(z.host_row_bytes(StateRow::optimizer_state), 8 * shard);
        // The EMA follows the master weights to the host, which on the CPU backend is the device's allocator.
        EXPECT_EQ(z.row_bytes(StateRow::ema), cpu_device ? 4 * shard : 0);
        EXPECT_EQ(z.host_row_bytes(StateRow::ema), cpu_device ? 0 : 4 * shard);
      }
}

TEST(ZeroMemoryModel, RefusesALayoutForAnotherStage) {
  ZeroSpec s = four_partitions(0, 2);  // one shard: stage 0's layout
  s.plan = plan_of(1, 2, 4.0 / double(1 << 20));
  EXPECT_THROW(zero_model_state(s), ValueError);
  s.layout = {};
  EXPECT_THROW(zero_model_state(s), ValueError);
}

}  // namespace
}  // namespace cz::plan
