// czrun: run a training command under mpirun over a hostfile, or over the nodes of the Slurm job it runs in,
// and keep it going when a host is lost: probe the hosts, drop the ones that do not answer, relaunch on the
// rest from the newest published checkpoint at the same global batch (src/dist/elastic/supervisor.h,
// docs/training.md "When a host dies", docs/slurm.md).
#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "dist/elastic/supervisor.h"

int main(int argc, char** argv) {
  cz::elastic::SupervisorOptions o;
  CLI::App app{
      "czrun: run convnext_zero under mpirun over a hostfile; after a lost host, relaunch on the hosts that "
      "answer from the newest checkpoint at the same global batch.\n"
      "  czrun --hostfile HOSTS [OPTIONS] -- convnext_zero --checkpoint-dir DIR --checkpoint-every N ..."};
  std::string mpirun = "mpirun", mpirun_args;
  app.add_option("--hostfile", o.hostfile,
                 "Open MPI hostfile: 'HOST slots=N' a line; ranks fill it in order (default inside a Slurm "
                 "job: the job's nodes, SLURM_JOB_NODELIST, with SLURM_TASKS_PER_NODE slots each)");
  app.add_option("--mpirun", mpirun, "the launcher")->capture_default_str();
  app.add_option(
      "--mpirun-args", mpirun_args,
      "options for every mpirun (or srun), split at spaces (e.g. \"--mca plm_rsh_agent ./agent\")");
  bool srun = false;
  app.add_flag("--srun", srun,
               "inside a Slurm job without --hostfile: launch each attempt with `srun --mpi=pmix` over the "
               "job's nodes instead of mpirun");
  app.add_option("--min-ranks", o.min_ranks, "never relaunch on fewer ranks")->capture_default_str();
  app.add_option("--max-restarts", o.max_restarts, "give up after this many restarts")->capture_default_str();
  app.add_flag("--readmit", o.readmit,
               "probe dropped hosts again at each restart and take back those that answer");
  app.add_option("--probe-timeout", o.probe_timeout_s, "seconds a host has to run `true` through mpirun")
      ->capture_default_str();
  app.add_option("--teardown-grace", o.teardown_grace_s,
                 "seconds mpirun may take to exit after a rank aborted before it is killed")
      ->capture_default_str();
  app.add_option("--start-timeout", o.start_timeout_s,
                 "seconds from a launch to its first step (start-up and checkpoint load included) before "
                 "the launch counts as failed and mpirun is killed (0: no limit)")
      ->capture_default_str();
  app.add_option("--daemon-timeout", o.daemon_timeout_s,
                 "seconds before mpirun gives up on a silent daemon (Open MPI's oob TCP keepalive; 0: its "
                 "default, about 8 minutes)")
      ->capture_default_str();
  app.add_option("--work-dir", o.work_dir,
                 "attempt logs, hostfiles, events.jsonl (default CHECKPOINT_DIR/czrun)");
  app.add_option("command", o.command, "the training command, after --")->required();
  app.positionals_at_end();
  app.footer(
      "Exit codes: 0 done; 1 gave up or failed (the reason is printed); 2 bad command line; 75 stopped by "
      "SIGTERM/SIGINT after the job saved a checkpoint.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // czrun's words before the command (CLI11 took the command from the end of argv, after any "--").
  o.self.assign(argv, argv + (size_t(argc) - std::min(size_t(argc), o.command.size())));
  o.mpirun = {srun ? std::string("srun") : mpirun};
  o.srun = srun;
  std::istringstream words(mpirun_args);
  for (std::string w; words >> w;) o.mpirun.push_back(w);
  try {
    if (srun && !o.hostfile.empty()) {
      std::fprintf(stderr,
                   "czrun: error: --srun launches over the Slurm job's nodes: leave --hostfile out\n");
      return 2;
    }
    if (o.hostfile.empty()) {
      // Inside a Slurm allocation (docs/slurm.md): its nodes, launched by mpirun, which reads the allocation.
      const char* nodes = std::getenv("SLURM_JOB_NODELIST");
      if (!nodes || !*nodes) nodes = std::getenv("SLURM_NODELIST");
      if (!nodes || !*nodes) {
        std::fprintf(stderr,
                     "czrun: error: give --hostfile HOSTS, or run czrun inside a Slurm job (sbatch or "
                     "salloc), whose nodes it then uses\n");
        return 2;
      }
      const char* per_node = std::getenv("SLURM_TASKS_PER_NODE");
      o.hosts =
          cz::elastic::hosts_of_allocation(cz::elastic::slurm_hostnames(nodes), per_node ? per_node : "");
      std::string listed;
      for (const auto& h : o.hosts)
        listed += fmt::format(" {} ({} slot{})", h.name, h.slots, h.slots == 1 ? "" : "s");
      std::fprintf(stderr,
                   "czrun: Slurm job %s:%s; a lost node is dropped only in a job that outlives it (sbatch "
                   "--no-kill)\n",
                   std::getenv("SLURM_JOB_ID") ? std::getenv("SLURM_JOB_ID") : "?", listed.c_str());
    }
    return cz::elastic::supervise(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "czrun: error: %s\n", e.what());
    return 1;
  }
}
