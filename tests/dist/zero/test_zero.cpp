// The ZeRO engine across ranks (run under mpirun -np 2 and -np 4): every stage trains exactly as stage 0,
// model states and communication follow the ZeRO paper's formulas, stage-3 units are resident only around
// their use, and ranks started with different flags stop with one message.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "dist/comm/bootstrap.h"
#include "dist/train/trainer.h"
#include "tensor/ops.h"
#include "zero_testing.h"

namespace cz::train {
namespace {

dist::World& world() {
  return dist::World::get();
}

using testing::flat_values;
using testing::zero_config;

struct RunResult {
  std::vector<double> losses, norms;
  std::vector<float> weights;
  double ema_eval_loss = 0;
};

RunResult run(const TrainConfig& c) {
  Trainer t(c, world());
  RunResult r;
  for (int64_t i = 0; i < c.steps; ++i) {
    const StepStats s = t.step();
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.weights = flat_values(t.master_parameters());
  t.engine().swap_ema();
  r.ema_eval_loss = t.evaluate().loss;
  t.engine().swap_ema();
  return r;
}

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

TEST(Zero, EveryStageTrainsAsStageZero) {
  const RunResult ref = run(zero_config(0));
  double max_w = 0;
  for (float w : ref.weights) max_w = std::max(max_w, double(std::abs(w)));
  for (int stage = 1; stage <= 3; ++stage) {
    const RunResult r = run(zero_config(stage));
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    double worst_loss = 0, worst_norm = 0, worst_w = 0;
    for (size_t i = 0; i < r.losses.size(); ++i) {
      worst_loss = std::max(worst_loss, rel(r.losses[i], ref.losses[i]));
      worst_norm = std::max(worst_norm, rel(r.norms[i], ref.norms[i]));
    }
    ASSERT_EQ(r.weights.size(), ref.weights.size());
    for (size_t i = 0; i < r.weights.size(); ++i)
      worst_w = std::max(worst_w, std::abs(double(r.weights[i]) - double(ref.weights[i])) / max_w);
    if (world().rank() == 0)
      std::printf("stage %d vs 0 at %d ranks: losses %.2e, grad norms %.2e, weights %.2e (relative)\n", stage,
                  world().size(), worst_loss, worst_norm, worst_w);
    EXPECT_LE(worst_loss, 1e-6) << "stage " << stage;
    EXPECT_LE(worst_norm, 1e-6) << "stage " << stage;
    EXPECT_LE(worst_w, 1e-6) << "stage " << stage;
    EXPECT_LE(rel(r.ema_eval_loss, ref.ema_eval_loss), 1e-6) << "stage " << stage;
  }
}

// Psi = parameters; model states per rank for fp32 AdamW (ZeRO paper, Table 1 with K = 12 and 4-byte
// weights).
double formula(int stage, double psi, double n) {
  switch (stage) {
    case 0:
      return 16 * psi;
    case 1:
      return 8 * psi + 8 * psi / n;
    case 2:
      return 4 * psi + 12 * psi / n;
    default:
      return 16 * psi / n;
  }
}

// --offload-optimizer runs the same CPU AdamW on the same values: no bit changes, at any stage, with
// clipping (the update waits for the global norm) and without (each range updated as its gradient arrives).
TEST(Zero, OffloadChangesNoBitAtAnyStage) {
  for (int stage = 0; stage <= 3; ++stage)
    for (double clip : {1.0, 0.0}) {
      TrainConfig c = zero_config(stage);
      c.steps = 4;
      c.clip_grad = clip;
      const RunResult ref = run(c);
      c.offload_optimizer = true;
      const RunResult off = run(c);
      EXPECT_EQ(off.losses, ref.losses) << "stage " << stage << " clip " << clip;
      EXPECT_EQ(off.weights, ref.weights) << "stage " << stage << " clip " << clip;
      EXPECT_EQ(off.ema_eval_loss, ref.ema_eval_loss) << "stage " << stage << " clip " << clip;
    }
}

TEST(Zero, ModelStatesFollowTheFormulasFromTheAllocator) {
  const double n = world().size();
  std::vector<double> measured(4);
  for (int stage = 0; stage <= 3; ++stage) {
    TrainConfig c = zero_config(stage);
    c.model = "atto";  // 3.7 M parameters: buffers of megabytes, where the allocator rounds by <= 1.6%
    c.depths.clear();
    c.dims.clear();
    c.ema_decay = 0;
    c.drop_path = 0;
    c.steps = 1;
    c.micro_batch = 2;
    c.grad_accum = 1;
    c.bucket_mb = 2;
    c.data = "synthetic:n=32,eval_n=8,classes=5";  // the data set's bytes count in the allocator's figure too
    Allocator& alloc = allocator_for(Device::cpu());
    const int64_t before = alloc.stats().allocated_bytes;
    Trainer t(c, world());
    // Model states are allocated by the engine's constructor. (After a step the communicator's ring scratch,
    // sized by the largest bucket or unit, is held too: a communication buffer, checked below.)
    const int64_t held = alloc.stats().allocated_bytes - before;
    const StepStats s = t.step();
    EXPECT_LE(alloc.stats().allocated_bytes - before - held, 2 * s.comm_buffer_bytes + (1 << 20));
    const double psi = double(t.model().num_parameters());
    const double want = formula(stage, psi, n);
    if (world().rank() == 0)
      std::printf(
          "stage %d, %d ranks: model states %.2f MB (engine), %.2f MB (allocator) vs %.2f MB formula\n",
          stage, world().size(), s.model_state_bytes / 1e6, held / 1e6, want / 1e6);
    EXPECT_NEAR(double(s.model_state_bytes) / want, 1.0, 0.05) << "stage " << stage;
    EXPECT_NEAR(double(held) / want, 1.0, 0.05) << "stage " << stage;
    measured[size_t(stage)] = double(held);

    // Offload: the device (here the CPU allocator) keeps the compute copy and, at stages 0-1, the gradient
    // buffer; master weights, gradient shard and AdamW state move to pinned host memory.
    c.offload_optimizer = true;
    const int64_t before_off = alloc.stats().allocated_bytes;
    Trainer u(c, world());
    const int64_t held_off = alloc.stats().allocated_bytes - before_off;
    const double device_want = stage <= 1 ? 8 * psi : stage == 2 ? 4 * psi : 4 * psi / n;
    EXPECT_NEAR(double(held_off) / device_want, 1.0, 0.05) << "offload, stage " << stage;
    EXPECT_NEAR(double(u.engine().host_state_bytes()) / (16 * psi / (stage == 0 ? 1 : n)), 1.0, 0.05)
        << "offload, stage " << stage;
  }
  if (world().size() == 4) {
    EXPECT_LE(measured[3], 0.30 * measured[0]);
  }
}

TEST(Zero, CommBytesPerStepAreTwoOrThreePsi) {
  const int n = world().size();
  for (int stage = 0; stage <= 3; ++stage) {
    TrainConfig c = zero_config(stage);
    c.grad_accum = 1;
    c.steps = 1;
    Trainer t(c, world());
    const StepStats s = t.step();
    const double padded = double(t.engine().layout().flat.numel) * 4;  // bytes, padding included
    const double psi = double(t.model().num_parameters()) * 4;
    const double factor = stage == 3 ? 3 : 2;
    // Exact for the padded flat space (every partition is a multiple of N elements); close to the
    // unpadded Psi (padding is at most 16 x N elements per partition).
    EXPECT_EQ(double(s.comm_bytes), factor * padded * (n - 1) / n) << "stage " << stage;
    // The collectives were timed, and no step waits longer for them than the step took.
    EXPECT_GT(s.comm_s, 0) << "stage " << stage;
    EXPECT_LE(s.comm_exposed_s, s.step_time_s) << "stage " << stage;
    // Note [Exposed communication]: the waited part of the collectives' run time, never more than all of it,
    // so the hidden fraction 1 - comm_exposed_s / comm_s is in [0, 1]. (With the host's whole waiting time
    // this model's tiny collectives were "exposed" several times over.)
    EXPECT_GE(s.comm_exposed_s, 0) << "stage " << stage;
    EXPECT_LE(s.comm_exposed_s, s.comm_s * (1 + 1e-9)) << "stage " << stage;
    EXPECT_NEAR(double(s.comm_bytes) / (factor * psi * (n - 1) / n), 1.0, 0.25) << "stage " << stage;
    if (world().rank() == 0)
      std::printf(
          "stage %d, %d ranks: comm_bytes %lld = %.3f x Psi(N-1)/N (padded flat %lld of %lld elements)\n",
          stage, n, (long long)s.comm_bytes, double(s.comm_bytes) / (psi * (n - 1) / n),
          (long long)t.engine().layout().flat.numel, (long long)t.model().num_parameters());
  }
}

TEST(Zero, StageThreeUnitsAreResidentOnlyAroundTheirUse) {
  for (int prefetch : {0, 1, 2}) {
    for (bool checkpointing : {false, true}) {
      TrainConfig c = zero_config(3);
      c.prefetch = prefetch;
      c.activation_checkpointing = checkpointing;
      c.steps = 3;
      Trainer t(c, world());
      zero::ZeroEngine& e = t.engine();
      const auto& parts = e.layout().partitions;
      int64_t max_unit = 0;
      for (size_t p = 0; p < parts.size(); ++p) max_unit = std::max(max_unit, parts[p].numel * 4);
      int violations = 0, checks = 0;
      auto check = [&](size_t p) {
        ++checks;
        size_t resident = 0;
        for (size_t q = 0; q < parts.size(); ++q) resident += e.unit_resident(q) ? 1 : 0;
        // The unit in use, the units prefetched ahead, and in backward the unit just finished whose
        // gradients are still being handed over.
        if (!e.unit_resident(p) || resident > size_t(2 + prefetch) ||
            e.gathered_bytes() > int64_t(2 + prefetch) * max_unit + 4096)
          ++violations;
      };
      std::vector<std::pair<nn::Module*, int>> hooks;
      for (size_t p = 0; p < parts.size(); ++p) {
        nn::Module* m = t.model().find_module(parts[p].name);
        hooks.emplace_back(m, m->register_forward_pre_hook([&, p](nn::Module&, const Tensor&) { check(p); }));
        hooks.emplace_back(m, m->register_backward_pre_hook([&, p](nn::Module&) { check(p); }));
      }
      for (int i = 0; i < 3; ++i) {
        t.step();
        EXPECT_EQ(e.gathered_bytes(), 0) << "units still gathered after the step";
      }
      for (auto& [m, id] : hooks) m->remove_hook(id);
      EXPECT_GT(checks, int(parts.size()));
      EXPECT_EQ(violations, 0) << "prefetch " << prefetch << ", checkpointing " << checkpointing;
    }
  }
}

TEST(Zero, RanksWithDifferentFlagsStopWithOneMessage) {
  TrainConfig c = zero_config(1);
  if (world().rank() == world().size() - 1) c.stage = 2;
  try {
    Trainer t(c, world());
    FAIL() << "no error for ranks with different --stage";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--stage"), std::string::npos) << e.what();
  }
  TrainConfig d = zero_config(0);
  if (world().rank() == 0) d.micro_batch = 8;
  EXPECT_THROW(
      {
        try {
          Trainer t(d, world());
        } catch (const std::exception& e) {
          EXPECT_NE(std::string(e.what()).find("--micro-batch"), std::string::npos) << e.what();
          throw;
        }
      },
      std::exception);
}

}  // namespace
}  // namespace cz::train

namespace cz::train {
namespace {

// Note [Resuming]: 10 steps, a checkpoint, a new process state resuming from it and 10 more steps give the
// losses and master weights of 20 straight steps, to the bit, at every stage (mid-epoch, with drop-path,
// augmentation, EMA, gradient accumulation, clipping and the cosine schedule on).
TEST(ZeroCheckpoint, ResumeIsBitExactAtEveryStage) {
  const std::string dir = fmt::format("/tmp/cz_resume_{}", ::getppid());  // the same on every rank of the job
  for (int stage = 0; stage <= 3; ++stage) {
    TrainConfig c = zero_config(stage);
    c.steps = 20;
    c.augment = true;
    c.data = "synthetic:n=96,eval_n=16,classes=5";  // 96 / (4 x 2 x N) batches per epoch: resumed mid-epoch
    std::vector<double> straight;
    std::vector<float> w_straight;
    {
      Trainer t(c, world());
      for (int i = 0; i < 20; ++i) straight.push_back(t.step().loss);
      w_straight = flat_values(t.master_parameters());
    }
    c.checkpoint_dir = dir + "/s" + std::to_string(stage);
    {
      Trainer t(c, world());
      for (int i = 0; i < 10; ++i) EXPECT_EQ(t.step().loss, straight[size_t(i)]);
      t.save_checkpoint();
      t.finish_pending_save();
    }
    c.resume = c.checkpoint_dir;
    Trainer t(c, world());
    EXPECT_EQ(t.steps_done(), 10);
    for (int i = 10; i < 20; ++i)
      EXPECT_EQ(t.step().loss, straight[size_t(i)]) << "stage " << stage << " step " << i + 1;
    EXPECT_EQ(flat_values(t.master_parameters()), w_straight) << "stage " << stage;
  }
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cz::train

// ---- the 2-D mesh (Note [2-D mesh]): under mpirun -np 4 with $CZ_SIMULATE_HOSTS=2 (ctest zero_mesh_np4),
// two "hosts" of two ranks; elsewhere these skip.
namespace cz::train {
namespace {

bool two_hosts_of_two() {
  const dist::HostMap h = dist::host_map(world());
  return world().size() == 4 && h.num_hosts() == 2 && h.ranks_per_host() == 2;
}

TrainConfig mesh_config(int stage, const std::string& shard_group, bool hpz) {
  TrainConfig c = zero_config(stage);
  c.shard_group = shard_group;
  c.hpz = hpz;
  return c;
}

struct MeshCase {
  int stage;
  const char* shard_group;
  bool hpz, offload;
};

// HSDP at stages 1-3 (shard groups by host and by number), hpZ at stage 3, offload on the mesh: the losses,
// gradient norms, final master weights and the EMA's evaluation of the flat run at the same stage (the same
// global batch: 4 ranks x 4 images x 2 micro-steps), to float summation order. The reduction is two
// averages instead of one, so not to the bit, except hpZ, whose backward gathers the very values forward
// did (Note [hpZ]).
TEST(ZeroMesh, EveryMeshTrainsAsTheFlatRun) {
  if (!two_hosts_of_two()) GTEST_SKIP() << "needs 4 ranks on 2 (simulated) hosts";
  const MeshCase cases[] = {{1, "host", false, false}, {2, "2", false, false},   {3, "host", false, false},
                            {3, "world", true, false}, {2, "host", false, true}, {3, "2", false, true},
                            {3, "world", true, true}};
  RunResult flat[4];
  for (int stage = 1; stage <= 3; ++stage) flat[stage] = run(zero_config(stage));
  double max_w = 0;
  for (float w : flat[3].weights) max_w = std::max(max_w, double(std::abs(w)));
  for (const MeshCase& m : cases) {
    TrainConfig c = mesh_config(m.stage, m.shard_group, m.hpz);
    c.offload_optimizer = m.offload;
    const RunResult r = run(c);
    const RunResult& ref = flat[m.stage];
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    ASSERT_EQ(r.weights.size(), ref.weights.size());
    double worst_loss = 0, worst_norm = 0, worst_w = 0;
    for (size_t i = 0; i < r.losses.size(); ++i) {
      worst_loss = std::max(worst_loss, rel(r.losses[i], ref.losses[i]));
      worst_norm = std::max(worst_norm, rel(r.norms[i], ref.norms[i]));
    }
    for (size_t i = 0; i < r.weights.size(); ++i)
      worst_w = std::max(worst_w, std::abs(double(r.weights[i]) - double(ref.weights[i])) / max_w);
    const std::string what = fmt::format("stage {} --shard-group {}{}{}", m.stage, m.shard_group,
                                         m.hpz ? " --hpz" : "", m.offload ? " --offload-optimizer" : "");
    if (world().rank() == 0)
      std::printf("%s vs flat: losses %.2e, grad norms %.2e, weights %.2e (relative)\n", what.c_str(),
                  worst_loss, worst_norm, worst_w);
    EXPECT_LE(worst_loss, 1e-5) << what;
    EXPECT_LE(worst_norm, 1e-5) << what;
    EXPECT_LE(worst_w, 1e-5) << what;
    EXPECT_LE(rel(r.ema_eval_loss, ref.ema_eval_loss), 1e-5) << what;
    if (m.hpz && !m.offload) {
      EXPECT_EQ(r.losses, ref.losses) << what;
      EXPECT_EQ(r.weights, ref.weights) << what;
    }
  }
  // hpZ under activation checkpointing (the recompute in backward gathers inside the host too) with a deeper
  // prefetch: still bit-identical to stage 3.
  TrainConfig ck = zero_config(3);
  ck.activation_checkpointing = true;
  ck.prefetch = 2;
  ck.steps = 4;
  const RunResult flat_ck = run(ck);
  ck.hpz = true;
  const RunResult hpz_ck = run(ck);
  EXPECT_EQ(hpz_ck.losses, flat_ck.losses);
  EXPECT_EQ(hpz_ck.weights, flat_ck.weights);
  EXPECT_EQ(hpz_ck.ema_eval_loss, flat_ck.ema_eval_loss);
}

// What each mesh holds and sends per step, from the engine's own accounts: HSDP's state is that of flat
// stage s at N = the shard group's size; hpZ adds its secondary copies, Psi/R elements (R = 2 ranks per
// host); HSDP's bytes crossing hosts are at most 1/R of flat stage 3's (+5%), hpZ's 2/3 of them (backward's
// gather stays on the host), all on the flat ring; in two levels (--comm-impl hier, Note [Two-level
// collectives]) flat stage 3's are 2/3 of the ring's: (H-1)/H of each rank's 1/R share per pass against
// (N-1)/N of the buffer over each host's one crossing link.
TEST(ZeroMesh, StateAndCrossHostBytesFollowTheMesh) {
  if (!two_hosts_of_two()) GTEST_SKIP() << "needs 4 ranks on 2 (simulated) hosts";
  auto one_step = [](TrainConfig c, const std::string& impl = "flat") {
    c.comm_impl = impl;
    c.grad_accum = 1;
    c.steps = 1;
    c.ema_decay = 0;
    Trainer t(c, world());
    StepStats s = t.step();
    return std::make_pair(s, t.engine().layout().flat.numel);
  };
  const auto [flat3, psi] = one_step(zero_config(3));
  const auto [hsdp3, psi_h] = one_step(mesh_config(3, "host", false));
  const auto [hpz3, psi_z] = one_step(mesh_config(3, "world", true));
  const auto [flat2, psi_2] = one_step(mesh_config(3, "2", false));  // the same mesh, spelled by size
  const auto [hier3, psi_3] = one_step(zero_config(3), "hier");
  EXPECT_NEAR(double(hier3.comm_cross_bytes) / double(flat3.comm_cross_bytes), 2.0 / 3, 0.02);
  // Flat stage 3 at 4 ranks on 2 hosts: half of its ring links cross hosts.
  EXPECT_EQ(flat3.comm_cross_bytes, flat3.comm_bytes / 2);
  EXPECT_GT(hsdp3.comm_cross_bytes, 0);
  EXPECT_LE(double(hsdp3.comm_cross_bytes), 1.05 * double(flat3.comm_cross_bytes) / 2);
  EXPECT_LE(double(hpz3.comm_cross_bytes), 1.05 * 2.0 / 3 * double(flat3.comm_cross_bytes));
  EXPECT_EQ(flat2.comm_cross_bytes, hsdp3.comm_cross_bytes);
  // Model states: the shard group's N = 2 for HSDP (twice flat stage 3's per rank); hpZ: flat's plus Psi/2
  // fp32 elements.
  EXPECT_NEAR(double(hsdp3.model_state_bytes) / double(flat3.model_state_bytes),
              double(psi_h) / double(psi) * 2, 0.02);
  EXPECT_NEAR(double(hpz3.model_state_bytes - flat3.model_state_bytes), double(psi_z) / 2 * 4, 4096);
  if (world().rank() == 0)
    std::printf("cross-host bytes per step (rank 0): flat stage 3 %lld, HSDP %lld (%.3f), hpZ %lld (%.3f)\n",
                (long long)flat3.comm_cross_bytes, (long long)hsdp3.comm_cross_bytes,
                double(hsdp3.comm_cross_bytes) / double(flat3.comm_cross_bytes),
                (long long)hpz3.comm_cross_bytes,
                double(hpz3.comm_cross_bytes) / double(flat3.comm_cross_bytes));
}

// Checkpoints across meshes (docs/zero.md): one replica of each shard saves; a run resumes from any layout
// into any mesh. 10 steps on one mesh, saved, then 10 more on another, against 20 straight steps on the
// second (the same global batch, so the same data): HSDP stage 3 -> flat stage 3, flat stage 2 -> HSDP
// stage 3 and hpZ -> HSDP stage 1.
TEST(ZeroMesh, CheckpointsMoveBetweenMeshes) {
  if (!two_hosts_of_two()) GTEST_SKIP() << "needs 4 ranks on 2 (simulated) hosts";
  const std::string dir = fmt::format("/tmp/cz_mesh_resume_{}", ::getppid());
  struct Hop {
    TrainConfig from, to;
  };
  const Hop hops[] = {{mesh_config(3, "host", false), mesh_config(3, "world", false)},
                      {mesh_config(2, "world", false), mesh_config(3, "2", false)},
                      {mesh_config(3, "world", true), mesh_config(1, "host", false)}};
  int k = 0;
  for (Hop h : hops) {
    for (TrainConfig* c : {&h.from, &h.to}) {
      c->steps = 20;
      c->data = "synthetic:n=96,eval_n=16,classes=5";
    }
    const std::string what = fmt::format("stage {} {}{} -> stage {} {}", h.from.stage, h.from.shard_group,
                                         h.from.hpz ? " hpz" : "", h.to.stage, h.to.shard_group);
    std::vector<double> straight;
    {
      Trainer t(h.to, world());
      for (int i = 0; i < 20; ++i) straight.push_back(t.step().loss);
    }
    h.from.checkpoint_dir = fmt::format("{}/h{}", dir, k++);
    {
      Trainer t(h.from, world());
      for (int i = 0; i < 10; ++i) EXPECT_LE(rel(t.step().loss, straight[size_t(i)]), 1e-5) << what;
      t.save_checkpoint();
      t.finish_pending_save();
    }
    h.to.resume = h.from.checkpoint_dir;
    Trainer t(h.to, world());
    EXPECT_EQ(t.steps_done(), 10);
    for (int i = 10; i < 20; ++i)
      EXPECT_LE(rel(t.step().loss, straight[size_t(i)]), 1e-5) << what << ", step " << i + 1;
  }
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cz::train
