// The plan against the peak the CPU allocator measures over real training steps (Trainer::step resets the
// peak and reports it as StepStats::peak_mem_bytes), for a table of configurations: models, image sizes,
// batches, checkpointing, drop path, optimizers, EMA, accumulation, loader threads, and the ZeRO engine's
// stages, bucket sizes, prefetch, reduce dtype and offload on 1, 2 and 4 ranks. Issue 14 asks for the planned
// peak within 10% of the measured one.
//
// One source, two programs: test_plan runs the one-rank rows; test_plan_mpi (built with CZ_PLAN_MPI) runs
// under mpirun the rows whose rank count is the launcher's, every rank measuring its own peak against the
// plan. The model-state buffers of Note [ZeRO memory model] are checked against the engine's own accounts
// the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "dist/plan/planner.h"
#include "dist/plan/zero_memory.h"
#include "dist/train/trainer.h"
#include "tensor/allocator.h"
#include "train/trainer_testing.h"

namespace cz::plan {
namespace {

#ifndef CZ_PLAN_MPI
const auto* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new train::testing::WorldEnvironment);
#endif

struct Case {
  const char* name;
  train::TrainConfig config;
  int ranks = 1;
  // Ranks per host for the 2-D mesh's rows (--shard-group host, --hpz): they run where the launcher's hosts
  // (or $CZ_SIMULATE_HOSTS, ctest plan_vs_measured_mesh_np4) have that many; 0: any.
  int ranks_per_host = 0;
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

// A small model whose 0.2 MB of parameters fall into several 64 KiB buckets.
train::TrainConfig small(int stage) {
  train::TrainConfig c = base({2, 2, 2, 2}, {16, 32, 48, 64}, 48, 8);
  c.stage = stage;
  c.bucket_mb = 1.0 / 16;
  return c;
}

template <class F>
train::TrainConfig with(train::TrainConfig c, F f) {
  f(c);
  return c;
}

// --checkpoint-dir (the same on every rank): the test saves after the first step, in the background, so the
// save's host copy of the state is alive during the second.
train::TrainConfig checkpointed(train::TrainConfig c, const std::string& name) {
  c.checkpoint_dir = (std::filesystem::temp_directory_path() / ("cz_plan_" + name)).string();
  return c;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> k = {
      // Stage 0 on one rank: the trainer before the engine, kept as they were.
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
      {"atto_64_checkpoint", checkpointed(atto(64, 8), "atto_64_checkpoint")},
      {"s3_small_ema_checkpoint",
       checkpointed(with(small(3), [](auto& c) { c.ema_decay = 0.99; }), "s3_small_ema_checkpoint")},
      // The engine's stages, one rank (the collectives are local copies; no ring scratch).
      {"s1_small_offload", with(small(1), [](auto& c) { c.offload_optimizer = true; })},
      {"s2_small", small(2)},
      {"s2_small_ckpt_offload", with(small(2),
                                     [](auto& c) {
                                       c.activation_checkpointing = true;
                                       c.offload_optimizer = true;
                                     })},
      {"s3_small_accum", with(small(3), [](auto& c) { c.grad_accum = 2; })},
      {"s3_atto_ckpt", with(atto(64, 8),
                            [](auto& c) {
                              c.stage = 3;
                              c.activation_checkpointing = true;
                            })},
      // Two ranks.
      {"np2_s0_atto", with(atto(64, 8), [](auto& c) { c.stage = 0; }), 2},
      {"np2_s1_small_ckpt", with(small(1), [](auto& c) { c.activation_checkpointing = true; }), 2},
      {"np2_s2_small_offload", with(small(2), [](auto& c) { c.offload_optimizer = true; }), 2},
      {"np2_s3_atto_ckpt_offload",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 3;
              c.activation_checkpointing = true;
              c.offload_optimizer = true;
            }),
       2},
      {"np2_s0_atto_checkpoint", checkpointed(atto(64, 8), "np2_s0_atto_checkpoint"), 2},
      {"np2_s2_small_ema_checkpoint",
       checkpointed(with(small(2), [](auto& c) { c.ema_decay = 0.99; }), "np2_s2_small_ema_checkpoint"), 2},
      // Four ranks.
      {"np4_s0_small_bf16_reduce", with(small(0), [](auto& c) { c.reduce_dtype = "bf16"; }), 4},
      {"np4_s1_small_offload", with(small(1), [](auto& c) { c.offload_optimizer = true; }), 4},
      {"np4_s2_atto", with(atto(64, 8), [](auto& c) { c.stage = 2; }), 4},
      {"np4_s2_small_ckpt_accum",
       with(small(2),
            [](auto& c) {
              c.activation_checkpointing = true;
              c.grad_accum = 2;
            }),
       4},
      {"np4_s3_small_prefetch2", with(small(3), [](auto& c) { c.prefetch = 2; }), 4},
      {"np4_s3_atto_ckpt",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 3;
              c.activation_checkpointing = true;
            }),
       4},
      // Four ranks on two hosts of two (Note [2-D mesh]): HSDP at stages 1-3, hpZ.
      {"np4_mesh_s1_small_host", with(small(1), [](auto& c) { c.shard_group = "host"; }), 4, 2},
      {"np4_mesh_s2_small_2_offload_checkpoint",
       checkpointed(with(small(2),
                         [](auto& c) {
                           c.shard_group = "2";
                           c.offload_optimizer = true;
                         }),
                    "np4_mesh_s2_small_2_offload_checkpoint"),
       4, 2},
      {"np4_mesh_s3_atto_host_ckpt",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 3;
              c.shard_group = "host";
              c.activation_checkpointing = true;
            }),
       4, 2},
      {"np4_mesh_s3_small_hpz", with(small(3), [](auto& c) { c.hpz = true; }), 4, 2},
  };
  return k;
}

// The rows this program runs: one rank, or under mpirun the launcher's rank count.
std::vector<Case> my_cases() {
  std::vector<Case> out;
#ifdef CZ_PLAN_MPI
  const int ranks = launcher_world_size();
#else
  const int ranks = 1;
#endif
  for (const Case& c : cases())
    if (c.ranks == ranks && (c.ranks_per_host == 0 || c.ranks_per_host == launcher_ranks_per_host()))
      out.push_back(c);
  return out;
}

// gtest names each row by its name (the default would dump the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class PlanVsMeasured : public ::testing::TestWithParam<Case> {};

TEST_P(PlanVsMeasured, PeakWithinTenPercent) {
  const Case& c = GetParam();
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

  PlanRequest req;
  req.config = c.config;
  req.world = c.ranks;
  req.ranks_per_host = c.ranks_per_host;
  req.rank = world.rank();
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
      spec.stage = stage;
      spec.world = n;
      spec.layout =
          zero_layout(nn::convnext_parameters(t.model().config()), stage, n, cfg.bucket_mb, DType::f32);
      spec.optimizer_state_tensors = stage == 1 ? 1 : 2;
      spec.ema = true;
      spec.offload = offload;
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
