// The plan against the peak the CPU allocator measures over real training steps (Trainer::step resets the
// peak and reports it as StepStats::peak_mem_bytes), for a table of configurations: models, image sizes,
// batches, checkpointing, drop path, optimizers, EMA, accumulation, loader threads. Issue 14 asks for the
// planned peak within 10% of the measured one.
//
// Extending the table: the rows carry a ZeRO stage and a rank count. Today's trainer is stage 0; once the
// engine runs --stage 1-3, rows with those stages go here unchanged, and rows with 2-4 ranks go into an
// `mpi`-labelled run of this same table under mpirun (each rank measures its own peak; the largest counts).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "dist/plan/planner.h"
#include "dist/train/trainer.h"
#include "tensor/allocator.h"
#include "train/trainer_testing.h"

namespace cz::plan {
namespace {

const auto* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new train::testing::WorldEnvironment);

struct Case {
  const char* name;
  train::TrainConfig config;
  int ranks = 1;
};

train::TrainConfig base(std::vector<int64_t> depths, std::vector<int64_t> dims, int64_t image,
                        int64_t batch) {
  train::TrainConfig c;
  c.depths = std::move(depths);
  c.dims = std::move(dims);
  c.image_size = image;
  c.micro_batch = batch;
  c.num_classes = 10;
  c.data = "synthetic:n=64,eval_n=16,classes=10";
  c.steps = 2;
  c.loader_threads = 0;  // batches made in step(): the same peak on every run (threads: see "prefetch")
  c.progress = false;
  c.seed = 5;
  return c;
}

train::TrainConfig atto(int64_t image, int64_t batch) {
  train::TrainConfig c = base({}, {}, image, batch);
  c.model = "atto";
  return c;
}

template <class F>
train::TrainConfig with(train::TrainConfig c, F f) {
  f(c);
  return c;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> k = {
      {"tiny_custom", base({1, 1, 1, 1}, {8, 16, 24, 32}, 32, 16)},
      {"tiny_custom_ckpt",
       with(base({1, 1, 1, 1}, {8, 16, 24, 32}, 32, 16), [](auto& c) { c.activation_checkpointing = true; })},
      {"custom_2222_droppath",
       with(base({2, 2, 2, 2}, {16, 32, 48, 64}, 48, 8), [](auto& c) { c.drop_path = 0.2; })},
      {"custom_2222_droppath_ckpt", with(base({2, 2, 2, 2}, {16, 32, 48, 64}, 48, 8),
                                         [](auto& c) {
                                           c.drop_path = 0.2;
                                           c.activation_checkpointing = true;
                                         })},
      {"custom_1131_wide", base({1, 1, 3, 1}, {24, 48, 96, 192}, 64, 4)},
      {"three_stages", base({2, 2, 2}, {16, 32, 64}, 32, 8)},
      {"one_stage_ckpt", with(base({3}, {24}, 16, 8), [](auto& c) { c.activation_checkpointing = true; })},
      {"atto_64", atto(64, 8)},
      {"atto_64_ckpt", with(atto(64, 8), [](auto& c) { c.activation_checkpointing = true; })},
      {"atto_96_droppath_ckpt", with(atto(96, 4),
                                     [](auto& c) {
                                       c.drop_path = 0.1;
                                       c.activation_checkpointing = true;
                                     })},
      {"atto_72_odd_sizes", atto(72, 4)},
      {"sgd_ema_accum", with(base({3, 1, 1, 1}, {32, 64, 96, 128}, 40, 10),
                             [](auto& c) {
                               c.optimizer = "sgd";
                               c.ema_decay = 0.99;
                               c.grad_accum = 2;
                             })},
      {"atto_prefetch", with(atto(48, 8), [](auto& c) { c.loader_threads = 1; })},
  };
  return k;
}

// gtest names each row by its name (the default would dump the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class PlanVsMeasured : public ::testing::TestWithParam<Case> {};

TEST_P(PlanVsMeasured, PeakWithinTenPercent) {
  const Case& c = GetParam();
  ASSERT_EQ(c.ranks, dist::World::get().size()) << "multi-rank rows run under mpirun";
  Allocator& alloc = allocator_for(Device::cpu());
  alloc.empty_cache();
  alloc.reset_peak();
  const int64_t before =
      alloc.stats().allocated_bytes;  // whatever else this process holds (nothing, normally)
  int64_t measured = 0;
  {
    train::Trainer t(c.config, dist::World::get());
    for (int i = 0; i < 2; ++i) measured = std::max(measured, t.step().peak_mem_bytes - before);
  }
  const int64_t reserved = alloc.stats().peak_reserved_bytes - before;

  PlanRequest req;
  req.config = c.config;
  req.world = c.ranks;
  const Plan p = make_plan(req);
  const double err = double(p.total_bytes - measured) / double(measured);
  // One line per row, for docs/planning.md.
  fmt::print("| {} | {} | {} | {:+.2f}% | {} | {} |\n", c.name, measured, p.total_bytes, 100 * err, reserved,
             p.reserved_bytes);
  EXPECT_LE(std::abs(err), 0.10) << "planned " << p.total_bytes << " measured " << measured << "; the peak "
                                 << "is planned in " << p.peak_at;
  // The allocator's cache (what the planner reports as reserved_bytes) is replayed too.
  EXPECT_NEAR(double(p.reserved_bytes), double(reserved), 0.10 * double(reserved));
}

INSTANTIATE_TEST_SUITE_P(Stage0OneRank, PlanVsMeasured, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cz::plan
