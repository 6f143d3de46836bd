// The plan against the peak the CPU allocator measures over real training steps (Trainer::step resets the
// peak and reports it as StepStats::peak_mem_bytes), for the table of configurations in plan_cases.h. Issue
// 14 asks for the planned peak within 10% of the measured one.
//
// One source, two programs: test_plan runs the one-rank rows; test_plan_mpi (built with CZ_PLAN_MPI) runs
// under mpirun the rows whose rank count is the launcher's, every rank measuring its own peak against the
// plan. The model-state buffers of Note [ZeRO memory model] are checked against the engine's own accounts
// the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "dist/comm/topology_detect.h"
#include "dist/plan/planner.h"
#include "dist/plan/zero_memory.h"
#include "dist/train/flags.h"
#include "dist/train/plan_request.h"
#include "dist/train/trainer.h"
#include "dist/train/trainer_testing.h"
#include "plan_cases.h"
#include "tensor/allocator.h"

namespace cz::plan {
namespace {

#ifndef CZ_PLAN_MPI
const auto* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new train::testing::WorldEnvironment);
#endif

class PlanVsMeasured : public ::testing::TestWithParam<Case> {};

TEST_P(PlanVsMeasured, PeakWithinTenPercent) {
  const Case& c = GetParam();
  if (!runs_here(c)) GTEST_SKIP() << "--precision bf16 on the CPU: this CPU has neither AVX512_BF16 nor AMX";
  dist::World& world = dist::World::get();
  ASSERT_EQ(c.ranks, world.size()) << "multi-rank rows run under mpirun";
  Allocator& alloc = allocator_for(Device::cpu());
  alloc.empty_cache();
  alloc.reset_peak();
  const int64_t before =
      alloc.stats().allocated_bytes;  // whatever else this process holds (nothing, normally)
  int64_t measured = 0;
  const bool saves = !c.config.checkpoint_dir.empty();
  int64_t copy_measured = 0;  // what the save left allocated: its host copy
  if (saves && world.rank() == 0) std::filesystem::remove_all(c.config.checkpoint_dir);
  {
    train::Trainer t(c.config, world);
    for (int i = 0; i < 2; ++i) {
      measured = std::max(measured, t.step().peak_mem_bytes - before);
      if (saves && i == 0) {
        const int64_t held = alloc.stats().allocated_bytes;
        t.save_checkpoint();
        copy_measured = alloc.stats().allocated_bytes - held;
      }
    }
  }
  const int64_t reserved = alloc.stats().peak_reserved_bytes - before;

  PlanRequest req = train::plan_request(c.config, c.ranks, c.ranks_per_host);
  req.rank = world.rank();
  // Auto decides each collective on the run's topology (collective: every rank runs every row).
  if (c.config.comm_impl == "auto" && world.size() > 1) req.topology = dist::detect_topology(world);
  const Plan p = make_plan(req);
  const double err = double(p.total_bytes - measured) / double(measured);
  // One line per row and rank, for docs/planning.md.
  fmt::print("| {} | {} | {} | {} | {} | {} | {:+.2f}% | {} | {} |\n", c.name, c.config.stage, c.ranks,
             world.rank(), measured, p.total_bytes, 100 * err, reserved, p.reserved_bytes);
  EXPECT_LE(std::abs(err), 0.10) << "rank " << world.rank() << ": planned " << p.total_bytes << " measured "
                                 << measured << "; the peak is planned in " << p.peak_at;
  if (saves) {  // the save's host copy is planned on its own row, to the byte
    const auto row = std::find_if(p.rows.begin(), p.rows.end(),
                                  [](const PlanRow& r) { return r.key == "checkpoint_copy"; });
    ASSERT_NE(row, p.rows.end());
    // Stage 0: rank 0 saves it all; on a mesh, the first shard group's ranks.
    if ((c.config.stage > 0 || world.rank() == 0) && c.config.shard_group == "world") {
      EXPECT_GT(row->bytes, 0);
    }
    EXPECT_EQ(row->bytes > 0 ? int64_t(round_to_size_class(size_t(row->bytes))) : 0, copy_measured)
        << "rank " << world.rank();
  }
  // The allocator's cache (what the planner reports as reserved_bytes) is replayed too.
  EXPECT_NEAR(double(p.reserved_bytes), double(reserved), 0.10 * double(reserved));
}

INSTANTIATE_TEST_SUITE_P(Grid, PlanVsMeasured, ::testing::ValuesIn(my_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Note [ZeRO memory model] buffer by buffer against what the engine says it holds (each buffer rounded to
// its size class, as the allocator holds it), and the planner's partitions against the engine's.
TEST(PlanVsEngine, ModelStateAndPartitions) {
  dist::World& world = dist::World::get();
  const int n = world.size();
  for (int stage = 0; stage <= 3; ++stage)
    for (bool offload : {false, true}) {
      train::TrainConfig cfg = small(stage);
      cfg.offload_optimizer = offload;
      cfg.ema_decay = 0.9;
      cfg.optimizer = stage == 1 ? "sgd" : "adamw";
      SCOPED_TRACE(::testing::Message() << "stage " << stage << ", offload " << offload << ", " << n
                                        << " ranks, " << cfg.optimizer);
      train::Trainer t(cfg, world);
      const zero::ZeroEngine& e = t.engine();

      ZeroSpec spec;
      spec.plan = zero::make_step_plan(train::zero_config(cfg, Device::cpu()), {.world = n});
      spec.layout = zero_layout(t.model().spec().parameters(), spec.plan);
      spec.optimizer_state_tensors = stage == 1 ? 1 : 2;
      spec.ema = true;
      spec.cpu_device = true;
      const zero::ZeroLayout& real = e.layout();
      ASSERT_EQ(spec.layout.partitions.size(), real.partitions.size());
      EXPECT_GT(real.partitions.size(), 4u);
      for (size_t i = 0; i < real.partitions.size(); ++i) {
        EXPECT_EQ(spec.layout.partitions[i].name, real.partitions[i].name);
        EXPECT_EQ(spec.layout.partitions[i].begin, real.partitions[i].begin);
        EXPECT_EQ(spec.layout.partitions[i].numel, real.partitions[i].numel);
        EXPECT_EQ(spec.layout.partitions[i].first_param, real.partitions[i].first_param);
      }
      EXPECT_EQ(spec.layout.flat.numel, real.flat.numel);
      EXPECT_EQ(spec.layout.shard_numel(), real.shard_numel());

      const ZeroState z = zero_model_state(spec);
      int64_t device = 0, host = 0, ema = 0;
      for (const StateBuffer& b : z.buffers) {
        const auto held = int64_t(round_to_size_class(size_t(b.bytes)));
        (b.row == StateRow::ema ? ema : b.host ? host : device) += held;
      }
      EXPECT_EQ(device, e.model_state_bytes());
      EXPECT_EQ(host, e.host_state_bytes());
      EXPECT_EQ(ema, e.ema_bytes());
    }
}

}  // namespace
}  // namespace cz::plan
