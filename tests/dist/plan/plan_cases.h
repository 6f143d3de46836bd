// The configurations the planner is held to the real step in (test_plan_vs_measured.cpp: the peak;
// test_step_events.cpp: every allocation, op by op): models, image sizes, batches, checkpointing, drop path,
// optimizers, EMA, accumulation, loader threads, and the ZeRO engine's stages, bucket sizes, prefetch, reduce
// dtype, gather dtype (int8, bf16) and offload on 1, 2 and 4 ranks.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "dist/plan/planner.h"
#include "dist/train/config.h"
#include "tensor/cpu/cpu_features.h"

namespace cz::plan {

struct Case {
  const char* name;
  train::TrainConfig config;
  int ranks = 1;
  // Ranks per host for the 2-D mesh's rows (--shard-group host, --hpz): they run where the launcher's hosts
  // (or $CZ_SIMULATE_HOSTS, ctest plan_vs_measured_mesh_np4) have that many; 0: any.
  int ranks_per_host = 0;
};

inline train::TrainConfig base(std::vector<int64_t> depths, std::vector<int64_t> dims, int64_t image,
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
  // The flat ring on every row, simulated hosts included (where auto could take two levels); rows with
  // --comm-impl hier say so.
  c.comm_impl = "flat";
  return c;
}

inline train::TrainConfig atto(int64_t image, int64_t batch) {
  train::TrainConfig c = base({}, {}, image, batch);
  c.model = "atto";
  return c;
}

// A small model whose 0.2 MB of parameters fall into several 64 KiB buckets.
inline train::TrainConfig small(int stage) {
  train::TrainConfig c = base({2, 2, 2, 2}, {16, 32, 48, 64}, 48, 8);
  c.stage = stage;
  c.bucket_mb = 1.0 / 16;
  return c;
}

// Whether this machine can run the row: --precision bf16 on the CPU needs AVX512_BF16 or AMX.
inline bool runs_here(const Case& c) {
  return c.config.precision != "bf16" || c.config.device != "cpu" ||
         !cpu::bf16_isa(cpu::cpu_features()).empty();
}

template <class F>
train::TrainConfig with(train::TrainConfig c, F f) {
  f(c);
  return c;
}

// --checkpoint-dir --checkpoint-every 1 (the same on every rank): the test saves after the first step, in the
// background, so the save's host copy of the state is alive during the second.
inline train::TrainConfig checkpointed(train::TrainConfig c, const std::string& name) {
  c.checkpoint_dir = (std::filesystem::temp_directory_path() / ("cz_plan_" + name)).string();
  c.checkpoint_every = 1;
  return c;
}

inline const std::vector<Case>& cases() {
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
      // ConvNeXt V2 blocks (grn between fc1 + GELU and fc2, no layer scale): plain, with drop path and
      // checkpointing, and at stage 3.
      {"v2_custom", with(base({1, 1, 1, 1}, {8, 16, 24, 32}, 32, 16), [](auto& c) { c.grn = true; })},
      {"v2_2222_droppath_ckpt", with(base({2, 2, 2, 2}, {16, 32, 48, 64}, 48, 8),
                                     [](auto& c) {
                                       c.grn = true;
                                       c.drop_path = 0.2;
                                       c.activation_checkpointing = true;
                                     })},
      {"s3_v2_small", with(small(3), [](auto& c) { c.grn = true; })},
      {"atto_64", atto(64, 8)},
      {"atto_64_ckpt", with(atto(64, 8), [](auto& c) { c.activation_checkpointing = true; })},
      {"atto_96_droppath_ckpt", with(atto(96, 4),
                                     [](auto& c) {
                                       c.drop_path = 0.1;
                                       c.activation_checkpointing = true;
                                     })},
      {"atto_72_odd_sizes", atto(72, 4)},
      {"atto_64_cpu_bf16", with(atto(64, 8), [](auto& c) { c.precision = "bf16"; })},
      {"sgd_ema_accum", with(base({3, 1, 1, 1}, {32, 64, 96, 128}, 40, 10),
                             [](auto& c) {
                               c.optimizer = "sgd";
                               c.ema_decay = 0.99;
                               c.grad_accum = 2;
                             })},
      {"atto_prefetch", with(atto(48, 8), [](auto& c) { c.loader_threads = 1; })},
      // Mixup/CutMix: soft targets in every batch (prefetched too) and the soft-target loss's row sums.
      {"atto_mixup_accum", with(atto(32, 8),
                                [](auto& c) {
                                  c.mixup = 0.8;
                                  c.cutmix = 1.0;
                                  c.num_classes = 37;
                                  c.grad_accum = 2;
                                })},
      {"atto_mixup_prefetch_accum", with(atto(32, 8),
                                         [](auto& c) {
                                           c.mixup = 0.8;
                                           c.cutmix = 1.0;
                                           c.num_classes = 37;
                                           c.loader_threads = 1;
                                           c.grad_accum = 2;
                                         })},
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
      // Quantized gathers (Note [Quantized gathers]) on one rank: the records still go through a group of
      // one.
      {"s3_small_int8_gather", with(small(3), [](auto& c) { c.gather_dtype = "int8"; })},
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
      {"np2_s3_atto_int8_gather_ckpt",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 3;
              c.gather_dtype = "int8";
              c.activation_checkpointing = true;
              c.prefetch = 2;
            }),
       2},
      {"np2_s2_small_bf16_gather", with(small(2), [](auto& c) { c.gather_dtype = "bf16"; }), 2},
      // --precision bf16 on the CPU (Note [bf16 on the CPU]): bf16 GEMMs in an fp32 model, no 16-bit copies.
      {"np2_s3_atto_cpu_bf16",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 3;
              c.precision = "bf16";
            }),
       2},
      {"np2_s1_small_int8_reduce", with(small(1), [](auto& c) { c.reduce_dtype = "int8"; }), 2},
      {"np2_s0_small_int8_reduce_accum",
       with(small(0),
            [](auto& c) {
              c.reduce_dtype = "int8";
              c.grad_accum = 2;
            }),
       2},
      {"np2_s3_small_int8_both_accum",
       with(small(3),
            [](auto& c) {
              c.gather_dtype = "int8";
              c.reduce_dtype = "int8";
              c.grad_accum = 2;
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
      {"np4_s1_small_int8_gather_ema",
       with(small(1),
            [](auto& c) {
              c.gather_dtype = "int8";
              c.ema_decay = 0.99;
            }),
       4},
      {"np4_s2_atto_int8_reduce",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 2;
              c.reduce_dtype = "int8";
            }),
       4},
      {"np4_s0_atto_int8_reduce", with(atto(64, 8), [](auto& c) { c.reduce_dtype = "int8"; }), 4},
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
      {"np4_mesh_s3_small_hpz_int8_gather",
       with(small(3),
            [](auto& c) {
              c.hpz = true;
              c.gather_dtype = "int8";
            }),
       4, 2},
      // Shard groups of one: the replication group is the world, and shares the world's communicator.
      {"np4_mesh_s2_small_1", with(small(2), [](auto& c) { c.shard_group = "1"; }), 4, 2},
      // Two-level collectives (Note [Two-level collectives]) on the two hosts: the host and cross
      // communicators' scratch and the slots' pack scratch; atto's 25 MB buckets go in pieces (Note
      // [Two-level pipeline]). Auto: the cost model on the detected topology takes two levels for some calls
      // and the flat ring for others.
      {"np4_mesh_s0_small_hier", with(small(0), [](auto& c) { c.comm_impl = "hier"; }), 4, 2},
      {"np4_mesh_s2_atto_hier",
       with(atto(64, 8),
            [](auto& c) {
              c.stage = 2;
              c.comm_impl = "hier";
            }),
       4, 2},
      {"np4_mesh_s3_small_hier", with(small(3), [](auto& c) { c.comm_impl = "hier"; }), 4, 2},
      {"np4_mesh_s0_atto_auto", with(atto(64, 8), [](auto& c) { c.comm_impl = "auto"; }), 4, 2},
      // Two-hop int8 reductions (Note [Two-hop quantized reduction]): each bucket's records and the host's
      // fp32
      // partial sums, allocated at the launch, freed at the finish.
      {"np4_mesh_s3_small_int8_both_hier",
       with(small(3),
            [](auto& c) {
              c.gather_dtype = "int8";
              c.reduce_dtype = "int8";
              c.comm_impl = "hier";
            }),
       4, 2},
      // ... and stage 0's two-hop all-reduce (Note [Two-hop quantized all-reduce]): then the second
      // exchange's
      // records.
      {"np4_mesh_s0_atto_int8_hier",
       with(atto(64, 8),
            [](auto& c) {
              c.reduce_dtype = "int8";
              c.comm_impl = "hier";
            }),
       4, 2},
  };
  return k;
}

// Whole runs (Trainer::run, as the app runs them), whose closing summary's peak the plan of
// plan_request_for_run must equal (test_plan_vs_run.cpp): the rows of Note [What a run holds that a step
// does not decide]. A `folder` of "N/C" is a folder: data set of C classes of N JPEG files each, made by the
// test.
struct RunCase {
  const char* name;
  train::TrainConfig config;
  int ranks = 1;
  int folder_images = 0, folder_classes = 0;
  // Atto at stage 0 on 2 ranks: the communicator's thread grows the ring scratch later than the replay
  // (docs/planning.md), so the plan may be high by up to that row, as the summary then says.
  bool scratch_timing = false;
};

inline const std::vector<RunCase>& run_cases() {
  auto threads = [](train::TrainConfig c, int t) {
    c.loader_threads = t;
    return c;
  };
  auto steps = [](train::TrainConfig c, int64_t n) {
    c.steps = n;
    return c;
  };
  auto saving = [](train::TrainConfig c, const std::string& name, int64_t every, bool sync) {
    c.checkpoint_dir = (std::filesystem::temp_directory_path() / ("cz_plan_run_" + name)).string();
    c.checkpoint_every = every;
    c.checkpoint_sync = sync;
    return c;
  };
  static const std::vector<RunCase> k = {
      // --checkpoint-dir alone: the one save comes after the last step (issue 30: planned 179.5 MiB against
      // 134.5 measured).
      {"run_atto_checkpoint_at_end", saving(steps(atto(64, 8), 3), "at_end", 0, false)},
      // A save at step 2 is in flight during step 3; with --checkpoint-sync it is finished before it.
      {"run_atto_checkpoint_every_2", saving(steps(atto(64, 8), 3), "every_2", 2, false)},
      {"run_atto_checkpoint_sync", saving(steps(atto(64, 8), 3), "sync", 1, true)},
      // Epochs of 3 micro-batches (24 images at 8): 2 loader threads hold their window of 4 batches, the
      // next epoch's among them (Note [Running ahead]; before issue 40 they stopped at the epoch's end).
      {"run_atto_folder_short_epochs", threads(steps(atto(64, 8), 4), 2), 1, 8, 3},
      // Epochs of 5 micro-batches, 2 a step: step 3 takes the last of one epoch and the first of the next;
      // the window of 4 is ahead of every step. Atto: a step long enough
      // for the workers to have claimed their batches before its peak on a busy machine (a tiny model's
      // 1 ms step was not, beside other builds: 3 of the 4 were).
      {"run_synthetic_short_epochs_accum", with(threads(steps(atto(48, 8), 3), 2),
                                                [](auto& c) {
                                                  c.data = "synthetic:n=40,eval_n=16,classes=10";
                                                  c.grad_accum = 2;
                                                })},
      // The two ranks at stage 3 with --checkpoint-dir alone.
      {"np2_run_s3_atto_checkpoint_at_end",
       with(saving(steps(atto(64, 8), 3), "np2_at_end", 0, false), [](auto& c) { c.stage = 3; }), 2},
      // Epochs of one global batch (24 images, 16 a step): the window of 2 is the next epochs' batches.
      {"np2_run_s3_atto_folder_short_epochs",
       with(threads(steps(atto(64, 8), 3), 1), [](auto& c) { c.stage = 3; }), 2, 12, 2},
      {"np2_run_s0_atto_folder_short_epochs", threads(steps(atto(64, 8), 3), 1), 2, 12, 2, true},
      {"np4_run_s3_atto_ckpt_folder_checkpoint_at_end",
       with(saving(threads(steps(atto(64, 8), 3), 1), "np4_at_end", 0, false),
            [](auto& c) {
              c.stage = 3;
              c.activation_checkpointing = true;
            }),
       4, 20, 2},
  };
  return k;
}

// The rows this program runs: one rank, or under mpirun the launcher's rank count.
inline std::vector<Case> my_cases() {
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

inline std::vector<RunCase> my_run_cases() {
  std::vector<RunCase> out;
#ifdef CZ_PLAN_MPI
  const int ranks = launcher_world_size();
#else
  const int ranks = 1;
#endif
  for (const RunCase& c : run_cases())
    if (c.ranks == ranks) out.push_back(c);
  return out;
}

// gtest names each row by its name (the default would dump the struct's bytes).
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}
inline void PrintTo(const RunCase& c, std::ostream* os) {
  *os << c.name;
}

}  // namespace cz::plan
