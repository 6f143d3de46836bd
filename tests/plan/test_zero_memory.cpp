// The ZeRO memory model (Note [ZeRO memory model]) row by row against its formulas, its partitions, and
// the planner's parameter list against the real module tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "dist/plan/model_shapes.h"
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
    const std::vector<ParamInfo> planned = convnext_parameters(cfg);
    ASSERT_EQ(planned.size(), real.size()) << cfg.name;
    for (size_t i = 0; i < real.size(); ++i) {
      EXPECT_EQ(planned[i].name, real[i].first);
      EXPECT_EQ(planned[i].shape, real[i].second.sizes()) << real[i].first;
      EXPECT_EQ(planned[i].numel, real[i].second.numel()) << real[i].first;
      EXPECT_EQ(planned[i].unit, real[i].first.substr(0, planned[i].unit.size())) << real[i].first;
    }
  }
  // timm's count for ConvNeXt-T (README), without building it.
  const std::vector<ParamInfo> tiny = convnext_parameters(nn::convnext_variant("tiny"));
  EXPECT_EQ(std::accumulate(tiny.begin(), tiny.end(), int64_t(0),
                            [](int64_t n, const ParamInfo& p) { return n + p.numel; }),
            28'589'128);
}

TEST(ZeroPartitions, BucketsUnitsAndPadding) {
  const std::vector<ParamInfo> params = convnext_parameters(nn::convnext_variant("atto"));
  const int64_t flat = flat_numel(params);
  for (int world : {1, 3, 4}) {
    // Units: stem, 3 downsamples, 12 blocks, head.
    const std::vector<int64_t> units = zero_partitions(params, 3, 25, DType::f32, world);
    EXPECT_EQ(units.size(), 1u + 3u + 12u + 1u);
    int64_t sum = 0;
    for (int64_t u : units) {
      EXPECT_EQ(u % (16 * world), 0);
      sum += u;
    }
    EXPECT_GE(sum, flat);
    EXPECT_LT(sum, flat + int64_t(units.size()) * 16 * world);
  }
  // One rank: the flat buffer exactly, whatever the cut.
  for (int stage : {0, 3}) {
    const std::vector<int64_t> p = zero_partitions(params, stage, 1, DType::f32, 1);
    EXPECT_EQ(std::accumulate(p.begin(), p.end(), int64_t(0)), flat);
  }
  // Buckets of up to 1 MiB: 262144 fp32 or 524288 bf16 elements. atto's stage-3 fc weights (409600) and its
  // 1000-class head (320000) are larger than the fp32 limit: each is a bucket of its own.
  for (DType reduce : {DType::f32, DType::bf16}) {
    const int64_t limit = (int64_t(1) << 20) / int64_t(dtype_size(reduce));
    std::vector<int64_t> alone;
    for (const ParamInfo& p : params)
      if (p.numel > limit) alone.push_back(pad_partition(p.numel, 2));
    const std::vector<int64_t> b = zero_partitions(params, 1, 1, reduce, 2);
    EXPECT_GT(b.size(), 1u);
    size_t oversized = 0;
    for (int64_t n : b) {
      if (n <= pad_partition(limit, 2)) continue;
      ++oversized;
      EXPECT_NE(std::find(alone.begin(), alone.end(), n), alone.end())
          << n << " in " << ::testing::PrintToString(b);
    }
    EXPECT_EQ(oversized, alone.size());
    EXPECT_EQ(alone.size(), reduce == DType::f32 ? 5u : 0u);
  }
  // A parameter larger than the bucket is a bucket of its own.
  std::vector<ParamInfo> big = {{"a", {10}, 10, "u"}, {"b", {5000}, 5000, "u"}, {"c", {10}, 10, "u"}};
  const std::vector<int64_t> b = zero_partitions(big, 0, 1000.0 * 4 / double(1 << 20), DType::f32, 1);
  EXPECT_EQ(b, (std::vector<int64_t>{16, 5008, 16}));
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

TEST(ZeroMemoryModel, EveryStageFollowsTheFormulas) {
  for (int n : {1, 4}) {
    const std::vector<int64_t> parts = {64 * n, 1024 * n, 16 * n, 4096 * n};
    const int64_t psi = std::accumulate(parts.begin(), parts.end(), int64_t(0));
    for (DType compute : {DType::f32, DType::bf16, DType::f16})
      for (int stage = 0; stage <= 3; ++stage) {
        ZeroSpec s;
        s.stage = stage;
        s.world = n;
        s.partitions = parts;
        s.compute = compute;
        s.reduce = DType::f32;
        s.prefetch = 2;
        s.ema = true;
        const ZeroState z = zero_model_state(s);
        const bool mixed = compute != DType::f32;
        const Expected e = formulas(stage, mixed, psi, n, int64_t(dtype_size(compute)));
        SCOPED_TRACE(::testing::Message()
                     << "stage " << stage << ", " << n << " ranks, " << dtype_name(compute));
        EXPECT_EQ(z.psi, psi);
        EXPECT_EQ(z.shard * n, psi);
        EXPECT_EQ(z.row_bytes(StateRow::parameters), e.params);
        EXPECT_EQ(z.row_bytes(StateRow::master_weights), e.master);
        EXPECT_EQ(z.row_bytes(StateRow::gradients), e.grads);
        EXPECT_EQ(z.row_bytes(StateRow::optimizer_state), e.state);
        EXPECT_EQ(z.row_bytes(StateRow::ema), e.ema);
        // Buckets: 3 of the largest partition at stages 2-3; a cast buffer at 0-1 when the gradients (the
        // compute dtype) are not what travels (fp32).
        const int64_t comm = stage >= 2 ? 3 * 4096 * n * 4 : mixed ? 4096 * n * 4 : 0;
        EXPECT_EQ(z.row_bytes(StateRow::comm_buffers), comm);
        // Stage 3 gathers 1 + prefetch consecutive units; the heaviest window is the last three.
        const int64_t gather = stage == 3 ? (1024 + 16 + 4096) * n * int64_t(dtype_size(compute)) : 0;
        EXPECT_EQ(z.row_bytes(StateRow::gather_buffers), gather);
      }
  }
}

TEST(ZeroMemoryModel, RefusesWhatItCannotModel) {
  ZeroSpec s;
  s.world = 2;
  s.partitions = {48};  // not a multiple of 16 x 2
  EXPECT_THROW(zero_model_state(s), ValueError);
  s.partitions = {64};
  s.offload = true;  // the hook: offload is not built yet
  EXPECT_THROW(zero_model_state(s), ValueError);
}

}  // namespace
}  // namespace cz::plan
