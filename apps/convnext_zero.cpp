// convnext_zero: train a ConvNeXt on one process or many (mpirun). Flags in, Trainer (src/dist/train) does
// the work; errors print with the rank prefix and exit non-zero (aborting the other ranks of a multi-rank
// job). `--plan` prints the memory plan for the same flags instead (src/dist/plan), without MPI or a GPU.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "dist/comm/bootstrap.h"
#include "dist/comm/slurm.h"
#include "dist/elastic/command.h"
#include "dist/plan/planner.h"
#include "dist/plan/what_if.h"
#include "dist/train/cli.h"
#include "dist/train/flags.h"
#include "dist/train/loader_only.h"
#include "dist/train/param_groups.h"
#include "dist/train/plan_request.h"
#include "dist/train/recipe.h"
#include "dist/train/stop.h"
#include "dist/train/trainer.h"
#include "io/h5/helper_programs.h"
#include "io/log/train_log.h"
#include "nn/convnext.h"
#include "tensor/allocator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"

namespace {

// The planner's flags (not a run's, so not in the flag table); messages name them through their options.
struct PlanFlags {
  bool plan = false, json = false, param_groups = false;
  std::string gpu_mem;
  int ranks = 0;  // 0: the launcher's world size, else 1
  std::string what_if, compute_table;
  CLI::Option *plan_opt = nullptr, *gpu_mem_opt = nullptr, *json_opt = nullptr, *ranks_opt = nullptr,
              *what_if_opt = nullptr, *compute_table_opt = nullptr, *param_groups_opt = nullptr;

  std::string gpu_mem_name() const { return gpu_mem_opt->get_name(); }
};

void add_plan_flags(CLI::App& app, PlanFlags& f) {
  app.option_defaults()->group("Planning (--plan: no training)");
  f.plan_opt = app.add_flag(
      "--plan", f.plan, "print the memory plan per rank for these flags and exit (no MPI, no GPU needed)");
  f.gpu_mem_opt = app.add_option("--gpu-mem", f.gpu_mem,
                                 "with --plan: device memory per rank to fit, e.g. 24GB, 24GiB, 512MiB; the "
                                 "exit code is 3 when the plan does not fit it (0 when it does); without "
                                 "--device the plan is for CUDA");
  f.json_opt =
      app.add_flag("--json", f.json,
                   "with --plan or --print-param-groups: print the plan or the groups as one JSON object");
  f.param_groups_opt = app.add_flag("--print-param-groups", f.param_groups,
                                    "print the optimizer's parameter groups for these flags (lr scale of "
                                    "--layer-decay, weight decay) and exit (no MPI, no GPU needed)");
  f.ranks_opt =
      app.add_option("--ranks", f.ranks, "with --plan: the world size (default: the launcher's, else 1)");
  f.what_if_opt = app.add_option(
      "--what-if", f.what_if,
      "with --plan: predict step time, img/s and memory per GPU at each stage and rank count on the "
      "machine this topology JSON describes (docs/planning.md); without --device, ranks on GPUs are "
      "planned for CUDA");
  f.compute_table_opt =
      app.add_option("--compute-table", f.compute_table,
                     "with --what-if: op rates, a bench_train_step --profile --json result or a rates table "
                     "(default: the built-in RTX 4090 rates)");
}

// The plan flags that go with --plan, and which do not go together: the exit code 1 and a message.
void check_plan_flags(const PlanFlags& f) {
  CZ_CHECK(!f.plan || !f.param_groups, "{} and {} go separately", f.plan_opt->get_name(),
           f.param_groups_opt->get_name());
  CZ_CHECK(f.plan || f.param_groups || f.json_opt->count() == 0, "{} goes with {} or {}",
           f.json_opt->get_name(), f.plan_opt->get_name(), f.param_groups_opt->get_name());
  for (const CLI::Option* o : {f.gpu_mem_opt, f.ranks_opt, f.what_if_opt})
    CZ_CHECK(f.plan || o->count() == 0, "{} goes with {}", o->get_name(), f.plan_opt->get_name());
  CZ_CHECK(!f.what_if.empty() || f.compute_table_opt->count() == 0, "{} goes with {} {}",
           f.compute_table_opt->get_name(), f.plan_opt->get_name(), f.what_if_opt->get_name());
  CZ_CHECK(f.what_if.empty() || f.ranks_opt->count() == 0,
           "{} does not go with {} (it plans every rank count the topology holds)", f.ranks_opt->get_name(),
           f.what_if_opt->get_name());
}

// Without --device, a plan about GPU memory or a GPU machine is a CUDA plan (Note [The device a plan is
// for]).
cz::plan::PlanDevice plan_device(const cz::train::TrainConfig& cfg, bool device_given, const PlanFlags& f,
                                 const cz::dist::Topology* what_if) {
  return cz::plan::plan_device(device_given ? std::optional<std::string>(cfg.device) : std::nullopt,
                               !f.gpu_mem.empty(), what_if);
}

int run_what_if(const cz::train::TrainConfig& run_cfg, bool device_given, const PlanFlags& f) {
  cz::dist::Topology topology = cz::dist::Topology::load(f.what_if);
  const cz::plan::PlanDevice device = plan_device(run_cfg, device_given, f, &topology);
  cz::train::TrainConfig cfg = run_cfg;
  cfg.device = device.device;
  cfg.validate();
  const cz::DType compute = cz::train::dtype_of_flag(cfg.precision);
  cz::plan::ComputeTable table = f.compute_table.empty()
                                     ? cz::plan::default_compute_table(compute)
                                     : cz::plan::load_compute_table(f.compute_table, compute);
  std::optional<int64_t> gpu_mem;
  if (!f.gpu_mem.empty()) gpu_mem = cz::plan::parse_memory_size(f.gpu_mem, f.gpu_mem_name());
  cz::plan::WhatIfRequest req = cz::train::what_if_request(cfg);
  req.topology = std::move(topology);
  req.device_reason = device.reason;
  req.compute = std::move(table);
  req.gpu_mem = gpu_mem;
  const cz::plan::WhatIf w = cz::plan::what_if(req);
  if (cz::plan::launcher_rank() != 0) return 0;
  if (f.json)
    fmt::print("{}\n", cz::plan::what_if_to_json(w).dump(2));
  else
    fmt::print("{}", cz::plan::format_what_if(w));
  return 0;
}

int run_plan(const cz::train::TrainConfig& cfg, bool device_given, const PlanFlags& f) {
  const cz::plan::PlanDevice device = plan_device(cfg, device_given, f, nullptr);
  cz::train::TrainConfig planned = cfg;
  planned.device = device.device;
  // The world (make_plan checks it); --shard-group host and --hpz need the hosts: as the launcher (or
  // $CZ_SIMULATE_HOSTS) puts the ranks.
  const int world = f.ranks_opt->count() > 0 ? f.ranks : cz::plan::launcher_world_size();
  int per_host = 0;
  if (const int per = cz::plan::launcher_ranks_per_host(); per > 0 && world % per == 0) per_host = per;
  std::optional<int64_t> gpu_mem;
  if (!f.gpu_mem.empty()) gpu_mem = cz::plan::parse_memory_size(f.gpu_mem, f.gpu_mem_name());
  cz::plan::PlanRequest req = cz::train::plan_request(planned, world, per_host);
  req.device_reason = device.reason;
  req.gpu_mem = gpu_mem;
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
  if (!f.json) {
    // The threads a run with these flags would get on this host (Note [CPU threads on a CUDA rank]).
    const cz::CpuThreadsRequest threads =
        cz::cpu_threads_request(p.device == "cuda", cfg.offload_optimizer, cfg.loader_threads,
                                req.ranks_per_host > 0 ? req.ranks_per_host : req.world);
    const cz::ThreadCpus cpus = threads.cuda ? cz::thread_cpus(threads.share, {}) : cz::ThreadCpus{};
    fmt::print("\nOn this host, a run would take {}\n",
               cz::describe_cpu_threads(threads, cz::decide_cpu_threads(threads), cpus));
  }
  if (rc != 0)
    fmt::print(stderr,
               "convnext_zero {}: does not fit: {} B required per rank (the allocator's peak {} B{}) but "
               "{} is {} B, {:.1f} MiB short; exit code {}\n",
               f.plan_opt->get_name(), p.required_bytes, p.total_bytes,
               p.device == "cuda" ? fmt::format(" + driver pages {} B + CUDA context and NCCL {} B",
                                                p.fragmentation_bytes, p.device_overhead_bytes)
                                  : "",
               f.gpu_mem_name(), *p.gpu_mem, double(p.required_bytes - *p.gpu_mem) / (1 << 20), rc);
  return rc;
}

// "93.75%", or "n/a" for a top-5 below 5 classes (EvalResult::top5).
std::string percent(double fraction) {
  return std::isnan(fraction) ? std::string("n/a") : fmt::format("{:.2f}%", 100 * fraction);
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
  using cz::train::flag_name, cz::train::TrainConfig;
  c.steps = kDefaultRunSteps;
  if (app.count(flag_name(&TrainConfig::lr)) == 0) c.lr = 3e-3;
  if (app.count(flag_name(&TrainConfig::warmup_steps)) == 0) c.warmup_steps = 20;
  if (app.count(flag_name(&TrainConfig::eval_every)) == 0) c.eval_every = 100;
}

// Note [Resume command] (dist/elastic/command.h): under a launcher, its own words as the user typed them,
// read from the command line of rank 0's parent (mpirun starts the ranks of its host itself). Where that
// cannot be read (rank 0 started by a remote daemon, through a wrapper, or by another launcher), `mpirun -np
// N` and a note saying which options to add; as root Open MPI refuses to start without --allow-run-as-root,
// so that one is given.
std::string resume_command(const std::vector<std::string>& args, const std::string& dir, int world,
                           std::string& note) {
  const std::string resume = cz::train::flag_name(&cz::train::TrainConfig::resume);
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && world == 1)
    return cz::elastic::resume_command({args[0]}, args, resume, dir);
  if (auto head = cz::elastic::launcher_head(cz::elastic::launcher_command_line(), args))
    return cz::elastic::resume_command(*head, args, resume, dir);
  if (cz::dist::read_slurm_process().launch == cz::dist::SlurmLaunch::srun) {
    note =
        "(srun's own options could not be read from here: add those the step was started with, e.g. -N, "
        "--ntasks-per-node; in a job script that requeues itself, as examples/slurm/train.sbatch, the next "
        "start resumes by itself)";
    return cz::elastic::resume_command({"srun", "--mpi=pmix", "-n", std::to_string(world), args[0]}, args,
                                       resume, dir);
  }
  std::vector<std::string> head = {"mpirun"};
  if (::geteuid() == 0) head.push_back("--allow-run-as-root");
  for (const std::string& w : {std::string("-np"), std::to_string(world), args[0]}) head.push_back(w);
  note =
      "(the launcher's own options could not be read from here: add those the job was started with, "
      "e.g. --hostfile, --oversubscribe, -x VAR, --mca ...)";
  return cz::elastic::resume_command(head, args, resume, dir);
}

// Open MPI's mpirun gives the ranks odls_base_sigkill_timeout seconds (1 by default) between the SIGTERM it
// sends on a Ctrl-C or SIGTERM and SIGKILL (Note [Stopping on request]); a value given with --mca reaches the
// ranks' environment. Under czrun (CZ_SUPERVISOR), which stops the job by SIGUSR1 itself, there is nothing to
// advise.
void warn_short_grace(const cz::train::TrainConfig& cfg, bool lead) {
  if (!lead || cfg.checkpoint_dir.empty() || !std::getenv("OMPI_COMM_WORLD_SIZE")) return;
  if (const char* s = std::getenv("CZ_SUPERVISOR"); s && *s) return;
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

// Rank 0's lines for a stop go to stderr, where the stop handler's "stopping after this step" went (a
// handler may only write(2)), so that under mpirun, which forwards stdout and stderr through separate pipes,
// they come out in the order they were written.
void print_stopped(const cz::train::TrainSummary& s, const cz::train::TrainConfig& cfg,
                   const std::vector<std::string>& args, int world, int64_t total_steps) {
  std::string text = fmt::format("stopped by {} after step {} of {}", cz::train::signal_name(s.stop_signal),
                                 s.last_step, total_steps);
  if (!s.checkpoint.empty()) text += fmt::format("; the newest checkpoint on disk is {}", s.checkpoint);
  if (cfg.checkpoint_dir.empty()) text += "; nothing was saved (no --checkpoint-dir)";
  if (!cfg.export_weights.empty())
    text += fmt::format("; weights of step {} exported to {}", s.last_step, cfg.export_weights);
  text += "\n";
  const char* supervisor = std::getenv("CZ_SUPERVISOR");
  if (!cfg.checkpoint_dir.empty() && !(supervisor && *supervisor)) {  // czrun prints its own
    std::string note;
    const std::string cmd = resume_command(args, cfg.checkpoint_dir, world, note);
    text += fmt::format("resume with: {}\n", cmd);
    if (!note.empty()) text += note + "\n";
  }
  cz::console_print(stderr, text);
}

// Note [Data wait] (io/log/train_log.h): rank 0's wait for data, and whether the loader limited the run.
void print_data_wait(const cz::train::TrainSummary& s, const cz::train::TrainConfig& cfg) {
  fmt::print(", data wait {:.2f} s", s.data_wait_s);
  if (std::isnan(s.data_wait_fraction)) return;
  fmt::print(" ({:.1f}% of step time after the first step", 100 * s.data_wait_fraction);
  const char* const flag = cz::train::flag_name(&cz::train::TrainConfig::loader_threads);
  if (s.data_wait_fraction > cz::kLoaderBoundFraction && cfg.loader_threads == 0)
    fmt::print("; the loader is the bottleneck: the training thread decodes ({} 0)", flag);
  else if (s.data_wait_fraction > cz::kLoaderBoundFraction)
    fmt::print("; the loader is the bottleneck at {} {}: more threads help where the host has idle cores",
               flag, cfg.loader_threads);
  fmt::print(")");
}

// --loader-only (dist/train/loader_only.h): rank 0 prints the job's rate.
int run_loader_only(const cz::train::TrainConfig& cfg, int* argc, char*** argv) {
  cz::dist::World* world = nullptr;
  try {
    world = &cz::dist::World::init(argc, argv);
    const cz::train::LoaderOnlyReport r = cz::train::run_loader_only(cfg, *world);
    if (world->rank() == 0) fmt::print("{}\n", cz::train::format_loader_only(r, cfg));
  } catch (const std::exception& e) {
    if (world && world->size() > 1) cz::dist::die(e);
    fmt::print(stderr, "convnext_zero: error: {}\n", e.what());
    if (cz::dist::World::initialized()) cz::dist::World::finalize();
    return cz::train::kExitFailed;
  }
  cz::dist::World::finalize();
  return 0;
}

// The plot script to name in the closing line: the installed one (PREFIX/share/convnext_zero beside
// PREFIX/bin), else this source tree's while it is there; empty when neither is.
std::string plot_script() {
  std::error_code ec;
  const std::string installed = cz::self_dir() + "/../" CZ_INSTALL_DATADIR "/convnext_zero/plot_run.py";
  if (std::filesystem::is_regular_file(installed, ec))
    return std::filesystem::weakly_canonical(installed, ec).string();
  return std::filesystem::is_regular_file(CZ_PLOT_SCRIPT, ec) ? CZ_PLOT_SCRIPT : "";
}

// The summary of a run that took no step (--steps 0 to export or checkpoint the initial weights, or a
// resume at its last step): what it did, not a loss and a peak memory of zero.
void print_no_steps(const cz::train::TrainSummary& s, const cz::train::TrainConfig& cfg,
                    int64_t total_steps) {
  using cz::train::flag_name, cz::train::TrainConfig;
  std::string text =
      total_steps == 0
          ? fmt::format("done: no training step ({} 0)", flag_name(&TrainConfig::steps))
          : fmt::format("done: no training step (resumed at step {}, the run's last)", s.last_step);
  if (s.eval)
    text += fmt::format("; eval loss {:.4f} top1 {:.2f}% top5 {}", s.eval->loss, 100 * s.eval->top1,
                        percent(s.eval->top5));
  if (s.eval_ema)
    text += fmt::format(" (EMA top1 {:.2f}% top5 {})", 100 * s.eval_ema->top1, percent(s.eval_ema->top5));
  if (!s.checkpoint.empty()) text += fmt::format("; checkpoint {}", s.checkpoint);
  if (!cfg.export_weights.empty()) text += fmt::format("; weights exported to {}", cfg.export_weights);
  fmt::print("{}\n", text);
}

}  // namespace

int main(int argc, char** argv) {
  using cz::train::kExitFailed, cz::train::kExitStopped, cz::train::kExitUsage;
  const std::vector<std::string> args(argv, argv + argc);
  cz::train::TrainConfig cfg;
  cfg.num_classes = cz::train::kClassesOfTheData;  // without --num-classes: the training data's classes
  CLI::App app{
      "convnext_zero: train ConvNeXt image classifiers on CPUs or GPUs, on one process or many (mpirun)"};
  app.allow_extras();  // an unknown flag gets our message, with a suggestion
  app.formatter(std::make_shared<cz::train::WrappingFormatter>(cz::train::help_width()));
  cz::train::take_last_values(app);  // Note [Flags given twice]
  app.footer(
      "Exit codes: 0 done; 1 failed (the error is printed); 2 bad command line; 3 --plan --gpu-mem does not "
      "fit; "
      "75 stopped on request (SIGINT, SIGTERM, SIGUSR1) after saving; 128+N killed by signal N.");
  cz::train::add_flags(app, cfg);
  PlanFlags plan_flags;
  add_plan_flags(app, plan_flags);
  bool loader_only = false;
  app.option_defaults()->group("Loader benchmark (--loader-only: no training)");
  app.add_flag("--loader-only", loader_only,
               fmt::format("run the input pipeline alone with the run's data, augmentation and loader flags "
                           "for --steps (x --grad-accum) batches per rank, --epochs, or {}; print img/s in "
                           "all and per loader thread, and exit (under mpirun: every rank's share)",
                           cz::train::kLoaderOnlyBatches));
  // Before MPI starts, every rank of a job sees the same command line: one of them reports its errors. The
  // others wait for it before they exit: mpirun ends the job at the first non-zero exit, and killed the lead
  // before it had printed (app_mesh lost "--hpz shards over the world" 2 runs in 3 beside another test).
  const bool lead_process = cz::plan::launcher_rank() == 0;
  auto refuse = [&](int code) {
    if (!lead_process && code != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    return code;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = lead_process ? app.exit(e) : e.get_exit_code();
    return refuse(code == 0 ? 0 : kExitUsage);  // --help is not an error
  }
  if (!app.remaining().empty()) {
    if (lead_process)
      fmt::print(stderr, "convnext_zero: error: {}\n", unknown_argument(app, app.remaining()));
    return refuse(kExitUsage);
  }
  using cz::train::flag_name, cz::train::TrainConfig;
  const char* const steps_flag = flag_name(&TrainConfig::steps);
  const char* const epochs_flag = flag_name(&TrainConfig::epochs);
  // Whether the command line gave `flag` (the recipe's values yield to it); false for one this build lacks.
  const auto given = [&](const std::string& flag) {
    const CLI::Option* o = app.get_option_no_throw(flag);
    return o != nullptr && o->count() > 0;
  };
  bool default_run = false;
  cz::train::RecipeReport recipe;
  try {
    recipe = cz::train::apply_recipe(cfg, given);  // Note [Recipes]; --lr once the world size is known
    default_run =
        !given(steps_flag) && !given(epochs_flag) && !recipe.sets(steps_flag) && !recipe.sets(epochs_flag);
    check_plan_flags(plan_flags);
    CZ_CHECK(!loader_only || !(plan_flags.plan || plan_flags.param_groups),
             "--loader-only and {} go separately", plan_flags.plan ? "--plan" : "--print-param-groups");
    if (plan_flags.param_groups || plan_flags.plan) cz::train::resolve_num_classes(cfg);
    if (plan_flags.param_groups) {
      cfg.validate();
      const auto groups = cz::train::param_groups(cfg);
      if (plan_flags.json)
        fmt::print("{}\n", cz::train::param_groups_json(cfg, groups).dump(2));
      else
        fmt::print("{}", cz::train::format_param_groups(cfg, groups));
      return 0;
    }
    const bool device_given = app.count(flag_name(&TrainConfig::device)) > 0;
    if (plan_flags.plan && !plan_flags.what_if.empty()) return run_what_if(cfg, device_given, plan_flags);
    if (plan_flags.plan) return run_plan(cfg, device_given, plan_flags);
    if (default_run && !loader_only) {
      const char* const data_flag = flag_name(&TrainConfig::data);
      CZ_CHECK(cfg.data.rfind("synthetic", 0) == 0,
               "{} {}: give the run's length with {} N or {} N (without them and without {}, convnext_zero "
               "does its default run on the embedded synthetic data)",
               data_flag, cfg.data, epochs_flag, steps_flag, data_flag);
      apply_default_run(app, cfg);
    }
    cfg.validate();
  } catch (const std::exception& e) {
    if (lead_process) fmt::print(stderr, "convnext_zero: error: {}\n", e.what());
    return refuse(kExitFailed);
  }

  // In a Slurm job (docs/slurm.md): a launch MPI cannot start from is refused by every process before MPI
  // starts; the lead reads the allocation, which the ranks check the run against once MPI is up.
  const cz::dist::SlurmProcess slurm = cz::dist::read_slurm_process();
  std::optional<cz::dist::SlurmAllocation> allocation;
  if (slurm.launch != cz::dist::SlurmLaunch::none) {
    if (const std::string bad = cz::dist::check_srun_launch(slurm); !bad.empty()) {
      if (lead_process) fmt::print(stderr, "convnext_zero: error: {}\n", bad);
      return refuse(kExitFailed);
    }
    if (lead_process) {
      try {
        allocation = cz::dist::query_slurm_allocation(slurm.job_id);
      } catch (const std::exception& e) {
        fmt::print(stderr, "convnext_zero: note: the run is not checked against Slurm job {}: {}\n",
                   slurm.job_id, e.what());
      }
    }
  }

  if (loader_only) return run_loader_only(cfg, &argc, &argv);
  // Before MPI and any OpenMP use: may re-execute the program (Note [Choosing the OpenMP wait policy]).
  cz::choose_omp_wait_policy(argv, cz::parse_device(cfg.device).is_cuda(), cfg.offload_optimizer);
  // A stop request during the start (MPI, the model, a resume's reading) is kept for the first step
  // boundary rather than ending the process at the signal's default action: a preemption's SIGUSR1 to a
  // requeued Slurm job that had just started killed its ranks (docs/slurm.md). World::init installs its own
  // SIGTERM handler for a moment; the line after it puts the stop handlers back, rank 0 announcing.
  cz::train::install_stop_handlers(false);
  cz::dist::World* world = nullptr;
  int exit_code = 0;
  try {
    world = &cz::dist::World::init(&argc, &argv);
    const bool lead = world->rank() == 0;
    cz::train::install_stop_handlers(lead);
    cz::train::take_stop_signals_off_compute_threads();
    if (lead && default_run)
      fmt::print(
          "convnext_zero: the default run ({} steps on the embedded synthetic data, as `./build.sh run`); "
          "for "
          "real data give --data h5:FILE|cifar10:DIR|folder:DIR and --epochs N or --steps N (--help lists "
          "every flag)\n",
          cfg.steps);
    if (slurm.launch != cz::dist::SlurmLaunch::none) {
      cz::dist::SlurmRunFacts facts;
      facts.gpus = cfg.device.rfind("cuda", 0) == 0;
      const char* supervisor = std::getenv("CZ_SUPERVISOR");
      facts.supervised = supervisor && *supervisor;
      facts.checkpoint_dir = cfg.checkpoint_dir;
      facts.resume = !cfg.resume.empty();
      facts.checkpoint_on_disk =
          !cfg.checkpoint_dir.empty() && std::filesystem::exists(cfg.checkpoint_dir + "/latest");
      // Every rank comes to rank 0's verdict: one line, and a clean exit of all.
      if (const std::string bad = cz::dist::check_slurm_job(*world, facts, allocation); !bad.empty()) {
        if (lead) fmt::print(stderr, "convnext_zero: error: {}\n", bad);
        cz::dist::World::finalize();
        return kExitFailed;
      }
    }
    if (lead && cfg.end_margin > 0 && !cz::dist::slurm_job_end_time(slurm, allocation))
      fmt::print(stderr, "convnext_zero: note: {} {} does nothing here: {}\n",
                 flag_name(&TrainConfig::end_margin), cfg.end_margin,
                 slurm.launch == cz::dist::SlurmLaunch::none ? "not in a Slurm job"
                                                             : "the job's end time is unknown");
    warn_short_grace(cfg, lead);
    cz::train::apply_recipe_lr(cfg, world->size(), given(flag_name(&TrainConfig::lr)), recipe);
    cz::train::Trainer trainer(cfg, *world);
    if (lead) {
      fmt::print(
          "convnext_zero: {} ({:.2f}M params, {} classes{}) on {} x{}, {}, ZeRO stage {}{}, data {}, {}x{} "
          "images, global batch {}, {} steps\n",
          trainer.model().spec().name(), double(trainer.model().num_parameters()) / 1e6,
          trainer.model().spec().num_classes(), trainer.classes_from_data() ? ": the data's" : "", cfg.device,
          world->size(), cfg.precision, cfg.stage, cfg.offload_optimizer ? " + CPU offload" : "", cfg.data,
          cfg.image_size, cfg.image_size, cfg.global_batch(world->size()), trainer.total_steps());
      fmt::print("{}", cz::train::format_recipe(recipe));
      if (!cz::omp_wait_policy_note().empty())
        fmt::print(
            "convnext_zero: OpenMP waits {} (rank 0's choice; OMP_WAIT_POLICY=active|passive overrides)\n",
            cz::omp_wait_policy_note());
      fmt::print("convnext_zero: {}\n", trainer.cpu_threads_note());
      fmt::print("convnext_zero: CPUs of the ranks on this host (the launcher's masks, gathered): {}\n",
                 trainer.node_cpus_note());
      fmt::print("convnext_zero: {}\n", cz::heap_policy_note());
      if (!trainer.cpu_gemm_note().empty())
        fmt::print("convnext_zero: CPU GEMMs {}\n", trainer.cpu_gemm_note());
      for (const std::string& w : trainer.cpu_gemm_warnings()) fmt::print(stderr, "convnext_zero: {}\n", w);
      if (!trainer.precision_note().empty()) fmt::print("convnext_zero: {}\n", trainer.precision_note());
      if (!trainer.comm_backend_note().empty())
        fmt::print("convnext_zero: collectives over {}\n", trainer.comm_backend_note());
      // Note [CUDA graphs for the step]: on a CPU run there is nothing to say (and `on` was refused).
      if (cfg.device != "cpu")
        fmt::print("convnext_zero: CUDA graphs {}\n", trainer.cuda_graph_plan().note());
      for (const std::string& line : trainer.data_notes()) fmt::print("convnext_zero: {}\n", line);
      if (!trainer.init_weights_note().empty())
        fmt::print("convnext_zero: {}\n", trainer.init_weights_note());
      std::fflush(stdout);
    }
    if (lead && cfg.end_margin > 0) trainer.set_job_end_time(cz::dist::slurm_job_end_time(slurm, allocation));
    const cz::train::TrainSummary s = trainer.run();
    if (s.stop_signal != 0) {
      if (lead) print_stopped(s, cfg, args, world->size(), trainer.total_steps());
      exit_code = kExitStopped;
    } else if (lead && s.steps == 0) {
      print_no_steps(s, cfg, trainer.total_steps());
    } else if (lead) {
      fmt::print("done: {} steps in {:.1f} s, {:.1f} img/s, final train loss {:.4f}", s.steps, s.seconds,
                 s.img_per_s, s.final_loss);
      if (s.eval)
        fmt::print(", eval loss {:.4f} top1 {:.2f}% top5 {}", s.eval->loss, 100 * s.eval->top1,
                   percent(s.eval->top5));
      if (s.eval_ema)
        fmt::print(" (EMA top1 {:.2f}% top5 {})", 100 * s.eval_ema->top1, percent(s.eval_ema->top5));
      if (s.best.top1 >= 0) fmt::print(", best top1 {:.2f}% at step {}", 100 * s.best.top1, s.best.step);
      if (s.best_ema.top1 >= 0)
        fmt::print(" (EMA {:.2f}% at step {})", 100 * s.best_ema.top1, s.best_ema.step);
      // Planned beside measured (docs/planning.md): the same flags and the run's steps through the planner.
      const cz::plan::Plan planned = cz::plan::make_plan(cz::train::plan_request_for_run(trainer, s, 0));
      const std::string why = cz::plan::plan_difference(planned, s.peak_mem_bytes);
      fmt::print(", peak memory {} per rank (planned {}{}; model states {}", mib(s.peak_mem_bytes),
                 mib(planned.total_bytes), why.empty() ? "" : ", " + why, mib(s.model_state_bytes));
      if (world->size() > 1 && s.comm_s > 0)
        fmt::print(", {:.0f}% of {:.2f} s of communication hidden",
                   100 * std::max(0.0, 1 - s.comm_exposed_s / s.comm_s), s.comm_s);
      fmt::print(")");
      print_data_wait(s, trainer.config());  // its --loader-threads resolved
      if (s.skipped >= 0)
        fmt::print("; {} bad sample(s) skipped ({} at open, {} failed to decode: {} by rank)", s.skipped,
                   s.skipped_at_open, s.skipped - s.skipped_at_open, fmt::join(s.skipped_on_ranks, ", "));
      if (trainer.cuda_graph_plan().capture)
        fmt::print(
            "; {} micro-steps and {} updates replayed from CUDA graphs, {} of another shape run eagerly",
            trainer.graph_replays(), trainer.graph_update_replays(), trainer.graph_uncaptured());
      if (const std::string plot = plot_script(); !cfg.log.empty() && !plot.empty())
        fmt::print("; plot: {}", cz::elastic::shell_words({plot, cfg.log}));
      fmt::print("\n");
      // The one part of the CUDA plan known only on a GPU (Note [The cuDNN workspace in the plan]): what
      // cuDNN's heuristics asked for, beside the walk's rule (the largest patchify convolution's input and
      // output bytes).
      if (trainer.device().is_cuda())
        fmt::print("cuDNN workspace: {} B held at the end\n",
                   cz::cuda_runtime::cudnn_workspace_bytes(trainer.device().index));
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
