// convnext_zero: train a ConvNeXt on one process or many (mpirun). Flags in, Trainer (src/dist/train) does
// the work; errors print with the rank prefix and exit non-zero (aborting the other ranks of a multi-rank
// job). `--plan` prints the memory plan for the same flags instead (src/dist/plan), without MPI or a GPU.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/plan/planner.h"
#include "dist/plan/what_if.h"
#include "dist/train/stop.h"
#include "dist/train/trainer.h"
#include "nn/convnext.h"
#include "tensor/cuda/runtime.h"

namespace {

void add_flags(CLI::App& app, cz::train::TrainConfig& c, bool& no_shuffle, bool& no_progress) {
  const std::string variants = fmt::format("{}", fmt::join(cz::nn::convnext_variant_names(), "|"));
  app.add_option("--model", c.model, "ConvNeXt variant: " + variants)->capture_default_str();
  app.add_option("--depths", c.depths, "custom blocks per stage, e.g. 2,2,6,2 (with --dims)")->delimiter(',');
  app.add_option("--dims", c.dims, "custom channels per stage, e.g. 40,80,160,320 (with --depths)")
      ->delimiter(',');
  app.add_option("--num-classes", c.num_classes, "classifier outputs")->capture_default_str();
  app.add_option("--image-size", c.image_size, "square input size in pixels")->capture_default_str();
  app.add_option("--data", c.data, "synthetic[:k=v,...] | h5:FILE | cifar10:DIR | folder:DIR")
      ->capture_default_str();
  app.add_option("--eval-data", c.eval_data, "evaluation set (default: the data source's own eval split)");
  app.add_option("--eval-every", c.eval_every, "evaluate every N steps (0: at the end only)")
      ->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "evaluate on at most N batches per rank (0: all)")
      ->capture_default_str();
  app.add_option("--steps", c.steps,
                 "optimizer steps (0: use --epochs; without --steps and --epochs: the default run)")
      ->capture_default_str();
  app.add_option("--epochs", c.epochs, "passes over the training set (when --steps is 0)")
      ->capture_default_str();
  app.add_option("--micro-batch", c.micro_batch, "images per rank per micro-step")->capture_default_str();
  app.add_option("--grad-accum", c.grad_accum, "micro-steps per optimizer step")->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "adamw | sgd")->capture_default_str();
  app.add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "final learning rate of the cosine schedule")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "decoupled weight decay (not on biases and 1-D params)")
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--warmup-steps", c.warmup_steps, "linear warmup steps")->capture_default_str();
  app.add_option("--schedule", c.schedule, "cosine | constant")->capture_default_str();
  app.add_option("--label-smoothing", c.label_smoothing, "cross-entropy label smoothing")
      ->capture_default_str();
  app.add_option("--drop-path", c.drop_path, "stochastic depth rate of the last block")
      ->capture_default_str();
  app.add_option("--clip-grad", c.clip_grad, "global gradient-norm clipping (0: off)")->capture_default_str();
  app.add_option("--ema-decay", c.ema_decay, "EMA of weights, evaluated alongside (0: off)")
      ->capture_default_str();
  app.add_option("--precision", c.precision, "fp32 | fp16 | bf16 (16-bit needs --device cuda)")
      ->capture_default_str();
  app.add_option(
         "--initial-loss-scale", c.initial_loss_scale,
         "fp16: the dynamic loss scale to start from (halved on overflow, doubled after 2000 clean steps)")
      ->capture_default_str();
  app.add_flag("--activation-checkpointing", c.activation_checkpointing,
               "recompute block activations in backward");
  app.add_option("--device", c.device, "cpu | cuda")->capture_default_str();
  app.add_option("--stage", c.stage,
                 "ZeRO stage: 0 replicated, 1 shards optimizer state, 2 also gradients, 3 also parameters")
      ->capture_default_str();
  app.add_option("--bucket-mb", c.bucket_mb,
                 "gradient bucket size in MiB (stages 0-2; at most a quarter of the model)")
      ->capture_default_str();
  app.add_option("--prefetch", c.prefetch, "stage 3: how many units ahead to all-gather")
      ->capture_default_str();
  app.add_option("--reduce-dtype", c.reduce_dtype, "fp32 | bf16 | fp16: the dtype gradients are reduced in")
      ->capture_default_str();
  app.add_flag(
      "--offload-optimizer", c.offload_optimizer,
      "at any --stage: fp32 master weights, gradients and optimizer state in pinned host memory, updated "
      "by the CPU bucket by bucket as gradients arrive");
  app.add_flag("--offload-overlap-step", c.offload_overlap_step,
               "with --offload-optimizer: run step t's CPU update during step t+1 (one step stale)");
  app.add_option("--comm-timeout", c.comm_timeout_s,
                 "seconds a collective may take before the run fails, naming it and the rank it waited for")
      ->capture_default_str();
  app.add_flag("--tf32", c.tf32, "CUDA: allow TF32 tensor cores for fp32 matmuls");
  app.add_option("--init-weights", c.init_weights,
                 "HDF5 weights to start from (timm or original ConvNeXt keys)");
  app.add_flag("--reset-head", c.reset_head, "with --init-weights: new classifier for --num-classes");
  app.add_option("--export-weights", c.export_weights, "write the trained weights (HDF5, timm keys)");
  app.add_option(
      "--checkpoint-dir", c.checkpoint_dir,
      "write sharded HDF5 checkpoints (DIR/step_N, DIR/latest) here, one at the end of the run too");
  app.add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->capture_default_str();
  app.add_option("--keep-checkpoints", c.keep_checkpoints,
                 "keep the newest K complete checkpoints (older ones removed once a newer one is complete; "
                 "0: all)")
      ->capture_default_str();
  app.add_option(
      "--resume", c.resume,
      "continue from a checkpoint: DIR (its latest complete one) or DIR/step_N, at any world size and stage");
  app.add_option("--log", c.log, "JSON-lines log: one object per step and per evaluation");
  app.add_option("--seed", c.seed, "initialisation, shuffling, augmentation and drop-path")
      ->capture_default_str();
  app.add_flag("--no-shuffle", no_shuffle, "read the training set in file order");
  app.add_flag("--augment", c.augment, "random-resized-crop and horizontal flip");
  app.add_option("--loader-threads", c.loader_threads, "data loader worker threads")->capture_default_str();
  app.add_flag("--no-progress", no_progress,
               "no progress on stderr (by default a bar on a terminal, else a plain line every "
               "--progress-interval seconds)");
  app.add_option("--progress-interval", c.progress_interval_s,
                 "seconds between plain progress lines when stderr is not a terminal (mpirun, a file)")
      ->capture_default_str();
}

struct PlanFlags {
  bool plan = false, json = false;
  std::string gpu_mem;
  int ranks = 0;  // 0: the launcher's world size, else 1
  std::string what_if, compute_table;
};

void add_plan_flags(CLI::App& app, PlanFlags& f) {
  app.add_flag("--plan", f.plan,
               "print the memory plan per rank for these flags and exit (no MPI, no GPU needed)");
  app.add_option("--gpu-mem", f.gpu_mem,
                 "with --plan: device memory per rank to fit, e.g. 24GB, 24GiB, 512MiB; the exit code is 3 "
                 "when the plan does not fit it (0 when it does)");
  app.add_flag("--json", f.json, "with --plan: print the plan as one JSON object");
  app.add_option("--ranks", f.ranks, "with --plan: the world size (default: the launcher's, else 1)");
  app.add_option(
      "--what-if", f.what_if,
      "with --plan: predict step time, img/s and memory per GPU at each stage and rank count on the "
      "machine this topology JSON describes (docs/planning.md)");
  app.add_option("--compute-table", f.compute_table,
                 "with --what-if: op rates, a bench_train_step --profile --json result or a rates table "
                 "(default: the built-in RTX 4090 rates)");
}

int run_what_if(const cz::train::TrainConfig& cfg, const PlanFlags& f) {
  cz::plan::WhatIfRequest req;
  req.config = cfg;
  req.topology = cz::dist::Topology::load(f.what_if);
  const cz::DType compute = cfg.precision == "bf16"   ? cz::DType::bf16
                            : cfg.precision == "fp16" ? cz::DType::f16
                                                      : cz::DType::f32;
  req.compute = f.compute_table.empty() ? cz::plan::default_compute_table(compute)
                                        : cz::plan::load_compute_table(f.compute_table, compute);
  if (!f.gpu_mem.empty()) req.gpu_mem = cz::plan::parse_memory_size(f.gpu_mem, "--gpu-mem");
  const cz::plan::WhatIf w = cz::plan::what_if(req);
  if (cz::plan::launcher_rank() != 0) return 0;
  if (f.json)
    fmt::print("{}\n", cz::plan::what_if_to_json(w).dump(2));
  else
    fmt::print("{}", cz::plan::format_what_if(w));
  return 0;
}

int run_plan(const cz::train::TrainConfig& cfg, const PlanFlags& f, bool ranks_given) {
  cz::plan::PlanRequest req;
  req.config = cfg;
  CZ_CHECK(!ranks_given || f.ranks >= 1, "--ranks must be at least 1, got {}", f.ranks);
  req.world = ranks_given ? f.ranks : cz::plan::launcher_world_size();
  if (!f.gpu_mem.empty()) req.gpu_mem = cz::plan::parse_memory_size(f.gpu_mem, "--gpu-mem");
  const cz::plan::Plan p = cz::plan::make_plan(req);
  // Scripts test the exit code: 3 (distinct from 1, an error) when --gpu-mem is given and the plan does not
  // fit it, on every rank of a launcher.
  constexpr int kDoesNotFit = 3;
  const int rc = p.fits.value_or(true) ? 0 : kDoesNotFit;
  if (cz::plan::launcher_rank() != 0) return rc;  // under mpirun, one copy of the plan
  if (f.json)
    fmt::print("{}\n", cz::plan::plan_to_json(p).dump(2));
  else
    fmt::print("{}", cz::plan::format_plan(p));
  if (rc != 0)
    fmt::print(stderr,
               "convnext_zero --plan: does not fit: {} B required per rank (the allocator's peak {} B{}) but "
               "--gpu-mem is {} B, {:.1f} MiB short; exit code {}\n",
               p.required_bytes, p.total_bytes,
               p.device == "cuda" ? fmt::format(" + driver pages {} B + CUDA context and NCCL {} B",
                                                p.fragmentation_bytes, p.device_overhead_bytes)
                                  : "",
               *p.gpu_mem, double(p.required_bytes - *p.gpu_mem) / (1 << 20), rc);
  return rc;
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20));
}

// Edit distance, for "did you mean" on an unknown flag.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown flag --stpes (did you mean --steps?)" for the first argument CLI11 could not place.
std::string unknown_argument(const CLI::App& app, const std::vector<std::string>& extras) {
  const std::string arg = extras.front().substr(0, extras.front().find('='));
  if (arg.rfind("-", 0) != 0)
    return fmt::format("unexpected argument '{}' (every value follows its flag: see --help)", arg);
  std::string best;
  size_t best_distance = 3;  // suggest only a near miss: two edits at most
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& name : o->get_lnames()) {
      const size_t d = edit_distance(arg, "--" + name);
      if (d < best_distance) best_distance = d, best = "--" + name;
    }
  }
  return best.empty() ? fmt::format("unknown flag {} (see --help)", arg)
                      : fmt::format("unknown flag {} (did you mean {}?)", arg, best);
}

// The main job's run (scripts/main_job.sh, `./build.sh run`), for a command that names neither --steps nor
// --epochs: ConvNeXt-atto on the embedded synthetic data, with these settings where the command gives none.
constexpr int64_t kDefaultRunSteps = 300;
void apply_default_run(const CLI::App& app, cz::train::TrainConfig& c) {
  c.steps = kDefaultRunSteps;
  if (app.count("--lr") == 0) c.lr = 3e-3;
  if (app.count("--warmup-steps") == 0) c.warmup_steps = 20;
  if (app.count("--eval-every") == 0) c.eval_every = 100;
}

// A word as a POSIX shell reads it back.
std::string shell_quote(const std::string& w) {
  if (!w.empty() &&
      w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%") ==
          std::string::npos)
    return w;
  std::string q = "'";
  for (char ch : w) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// The command that continues a stopped run: this one with --resume DIR in place of any earlier --resume.
std::string resume_command(const std::vector<std::string>& args, const std::string& dir, int world) {
  std::vector<std::string> words;
  if (world > 1) words = {"mpirun", "-np", std::to_string(world)};
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--resume") {
      ++i;
      continue;
    }
    if (args[i].rfind("--resume=", 0) == 0) continue;
    words.push_back(args[i]);
  }
  words.push_back("--resume");
  words.push_back(dir);
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + shell_quote(w);
  return out;
}

// Open MPI's mpirun gives the ranks odls_base_sigkill_timeout seconds (1 by default) between the SIGTERM it
// sends on a Ctrl-C or SIGTERM and SIGKILL (Note [Stopping on request]); a value given with --mca reaches the
// ranks' environment.
void warn_short_grace(const cz::train::TrainConfig& cfg, bool lead) {
  if (!lead || cfg.checkpoint_dir.empty() || !std::getenv("OMPI_COMM_WORLD_SIZE")) return;
  const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  const int grace = v ? std::atoi(v) : 1;
  if (grace >= 10) return;
  fmt::print(
      "note: Open MPI kills the ranks {} s after passing on a Ctrl-C or SIGTERM to mpirun, which may be too "
      "soon "
      "for the final checkpoint: stop with `kill -USR1 <mpirun pid>` (no deadline), or launch with `mpirun "
      "--mca "
      "odls_base_sigkill_timeout 10 ...`; the newest complete checkpoint stays loadable either way\n",
      grace);
}

void print_stopped(const cz::train::TrainSummary& s, const cz::train::TrainConfig& cfg,
                   const std::vector<std::string>& args, int world, int64_t total_steps) {
  fmt::print("stopped by {} after step {} of {}", cz::train::signal_name(s.stop_signal), s.last_step,
             total_steps);
  if (!s.checkpoint.empty()) fmt::print("; the newest checkpoint on disk is {}", s.checkpoint);
  if (cfg.checkpoint_dir.empty()) fmt::print("; nothing was saved (no --checkpoint-dir)");
  if (!cfg.export_weights.empty())
    fmt::print("; weights of step {} exported to {}", s.last_step, cfg.export_weights);
  fmt::print("\n");
  if (!cfg.checkpoint_dir.empty())
    fmt::print("resume with: {}\n", resume_command(args, cfg.checkpoint_dir, world));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  using cz::train::kExitFailed, cz::train::kExitStopped, cz::train::kExitUsage;
  const std::vector<std::string> args(argv, argv + argc);
  cz::train::TrainConfig cfg;
  CLI::App app{
      "convnext_zero: train ConvNeXt image classifiers on CPUs or GPUs, on one process or many (mpirun)"};
  app.allow_extras();  // an unknown flag gets our message, with a suggestion
  app.footer(
      "Exit codes: 0 done; 1 failed (the error is printed); 2 bad command line; 3 --plan --gpu-mem does not "
      "fit; "
      "75 stopped on request (SIGINT, SIGTERM, SIGUSR1) after saving; 128+N killed by signal N.");
  bool no_shuffle = false, no_progress = false;
  add_flags(app, cfg, no_shuffle, no_progress);
  PlanFlags plan_flags;
  add_plan_flags(app, plan_flags);
  // Before MPI starts, every rank of a job sees the same command line: one of them reports its errors.
  const bool lead_process = cz::plan::launcher_rank() == 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = lead_process ? app.exit(e) : e.get_exit_code();
    return code == 0 ? 0 : kExitUsage;  // --help is not an error
  }
  if (!app.remaining().empty()) {
    if (lead_process)
      fmt::print(stderr, "convnext_zero: error: {}\n", unknown_argument(app, app.remaining()));
    return kExitUsage;
  }
  cfg.shuffle = !no_shuffle;
  cfg.progress = !no_progress;
  const bool default_run = app.count("--steps") == 0 && app.count("--epochs") == 0;
  const bool ranks_given = app.count("--ranks") > 0;
  try {
    for (const char* flag : {"--gpu-mem", "--json", "--ranks", "--what-if"})
      CZ_CHECK(plan_flags.plan || app.count(flag) == 0, "{} goes with --plan", flag);
    CZ_CHECK(!plan_flags.what_if.empty() || app.count("--compute-table") == 0,
             "--compute-table goes with --plan --what-if");
    CZ_CHECK(plan_flags.what_if.empty() || !ranks_given,
             "--ranks does not go with --what-if (it plans every rank count the topology holds)");
    if (plan_flags.plan && !plan_flags.what_if.empty()) return run_what_if(cfg, plan_flags);
    if (plan_flags.plan) return run_plan(cfg, plan_flags, ranks_given);
    if (default_run) {
      CZ_CHECK(cfg.data.rfind("synthetic", 0) == 0,
               "--data {}: give the run's length with --epochs N or --steps N (without them and without "
               "--data, convnext_zero does its default run on the embedded synthetic data)",
               cfg.data);
      apply_default_run(app, cfg);
    }
    cfg.validate();
  } catch (const std::exception& e) {
    if (lead_process) fmt::print(stderr, "convnext_zero: error: {}\n", e.what());
    return kExitFailed;
  }

  cz::dist::World* world = nullptr;
  int exit_code = 0;
  try {
    world = &cz::dist::World::init(&argc, &argv);
    const bool lead = world->rank() == 0;
    cz::train::install_stop_handlers(lead);
    if (lead && default_run)
      fmt::print(
          "convnext_zero: the default run ({} steps on the embedded synthetic data, as `./build.sh run`); "
          "for "
          "real data give --data h5:FILE|cifar10:DIR|folder:DIR and --epochs N or --steps N (--help lists "
          "every flag)\n",
          cfg.steps);
    warn_short_grace(cfg, lead);
    cz::train::Trainer trainer(cfg, *world);
    if (lead) {
      const auto& mc = trainer.model().config();
      fmt::print(
          "convnext_zero: {} ({:.2f}M params) on {} x{}, {}, ZeRO stage {}{}, data {}, {}x{} images, global "
          "batch {}, {} steps\n",
          mc.name, double(trainer.model().num_parameters()) / 1e6, cfg.device, world->size(), cfg.precision,
          cfg.stage, cfg.offload_optimizer ? " + CPU offload" : "", cfg.data, cfg.image_size, cfg.image_size,
          cfg.global_batch(world->size()), trainer.total_steps());
      std::fflush(stdout);
    }
    const cz::train::TrainSummary s = trainer.run();
    if (s.stop_signal != 0) {
      if (lead) print_stopped(s, cfg, args, world->size(), trainer.total_steps());
      exit_code = kExitStopped;
    } else if (lead) {
      fmt::print("done: {} steps in {:.1f} s, {:.1f} img/s, final train loss {:.4f}", s.steps, s.seconds,
                 s.img_per_s, s.final_loss);
      if (s.eval) fmt::print(", eval loss {:.4f} top1 {:.2f}%", s.eval->loss, 100 * s.eval->top1);
      if (s.eval_ema) fmt::print(" (EMA top1 {:.2f}%)", 100 * s.eval_ema->top1);
      // Planned beside measured (docs/planning.md): the same flags through the planner.
      cz::plan::PlanRequest req;
      req.config = cfg;
      req.world = world->size();
      req.max_micro_batch = false;
      fmt::print(", peak memory {} per rank (planned {}; model states {}", mib(s.peak_mem_bytes),
                 mib(cz::plan::make_plan(req).total_bytes), mib(s.model_state_bytes));
      if (world->size() > 1 && s.comm_s > 0)
        fmt::print(", {:.0f}% of {:.2f} s of communication hidden",
                   100 * std::max(0.0, 1 - s.comm_exposed_s / s.comm_s), s.comm_s);
      fmt::print(")\n");
    }
  } catch (const std::exception& e) {
    if (world && world->size() > 1) cz::dist::die(e);
    fmt::print(stderr, "convnext_zero: error: {}\n", e.what());
    if (cz::dist::World::initialized()) cz::dist::World::finalize();
    return kExitFailed;
  }
  cz::dist::World::finalize();  // after the trainer and its communicators are gone
  return exit_code;
}
