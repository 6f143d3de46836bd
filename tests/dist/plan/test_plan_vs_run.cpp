// Whole runs against their plan (issue 30): Trainer::run, as the app runs it, and the plan its closing
// summary prints (train::plan_request_for_run) must agree to the byte, for the rows of run_cases() in
// plan_cases.h (Note [What a run holds that a step does not decide]: a save only at the end, periodic and
// synchronous saves, epochs shorter than the loader's prefetch window, which it holds across their ends). The
// same source runs its one-rank rows in test_plan and its two-rank rows in test_plan_mpi under mpirun.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>

#include "dist/plan/planner.h"
#include "dist/train/plan_request.h"
#include "dist/train/trainer.h"
#include "io/io_testing.h"
#include "plan_cases.h"
#include "tensor/allocator.h"

namespace cz::plan {
namespace {

// A folder: data set of `classes` classes of `images` JPEG files each under `dir`. Every rank writes all of
// it (each file to a temporary name, then renamed over the same content), so every rank lists all of it
// without waiting for another.
std::string write_folder(const std::filesystem::path& dir, int images, int classes, int rank) {
  for (int c = 0; c < classes; ++c) {
    const std::filesystem::path cls = dir / fmt::format("class_{}", c);
    std::filesystem::create_directories(cls);
    for (int i = 0; i < images; ++i) {
      const std::string path = (cls / fmt::format("{:03d}.jpg", i)).string();
      const std::string tmp = fmt::format("{}.tmp{}", path, rank);
      testing::write_bytes(tmp,
                           testing::encode_jpeg(testing::smooth_image(40 + i, 48, uint32_t(c * 100 + i))));
      std::filesystem::rename(tmp, path);
    }
  }
  return "folder:" + dir.string();
}

class PlanVsRun : public ::testing::TestWithParam<RunCase> {};

TEST_P(PlanVsRun, SummaryPeakIsPlannedToTheByte) {
  const RunCase& c = GetParam();
  dist::World& world = dist::World::get();
  ASSERT_EQ(c.ranks, world.size()) << "multi-rank rows run under mpirun";
  train::TrainConfig cfg = c.config;
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / fmt::format("cz_plan_run_{}_data", c.name);
  if (c.folder_images > 0) cfg.data = write_folder(folder, c.folder_images, c.folder_classes, world.rank());
  if (!cfg.checkpoint_dir.empty() && world.rank() == 0) std::filesystem::remove_all(cfg.checkpoint_dir);
  Allocator& alloc = allocator_for(Device::cpu());
  alloc.empty_cache();
  int64_t measured = 0, planned = 0, epoch = 0;
  std::string why;
  {
    train::Trainer t(cfg, world);
    const train::TrainSummary s = t.run();
    measured = s.peak_mem_bytes;
    epoch = t.batches_per_epoch();
    const Plan p = make_plan(train::plan_request_for_run(t, s, world.rank()));
    planned = p.total_bytes;
    why = plan_difference(p, measured);
  }
  fmt::print("| {} | {} | {} | {} micro-batches an epoch | measured {} | planned {} |\n", c.name, c.ranks,
             world.rank(), epoch, measured, planned);
  if (c.scratch_timing && planned != measured)
    EXPECT_NE(why.find("ring scratch"), std::string::npos) << "rank " << world.rank() << ": " << why;
  else
    EXPECT_EQ(planned, measured) << "rank " << world.rank() << ": " << why;
  if (!cfg.checkpoint_dir.empty() && world.rank() == 0) std::filesystem::remove_all(cfg.checkpoint_dir);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PlanVsRun);  // the mesh rows' program has none
INSTANTIATE_TEST_SUITE_P(Runs, PlanVsRun, ::testing::ValuesIn(my_run_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cz::plan
