// A rank among the ranks of its node and of the job: the CPUs it takes from its node's gathered masks (Note
// [A rank's CPUs on a node]), whether its loader holds it back, and every rank's step gathered (Note [Every
// rank's step]).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dist/train/trainer.h"
#include "io/log/train_log.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"

namespace cz::train {

// --loader-threads' default and OpenMP's threads (Note [CPU threads on a CUDA rank]) from this rank's share
// of its node's CPUs (Note [A rank's CPUs on a node]): the share's cores on a CPU rank; on a CUDA rank its
// CPUs less the launching thread's, which stays on the share (near the GPU where the share allows, so that
// the pinned buffers it takes are too) while the loaders take the rest. Resolved before the log's start
// record, which shows the numbers used.
void Trainer::place_cpu_threads() {
  CpuThreadsRequest req = cpu_threads_request(device_.is_cuda(), cfg_.offload_optimizer, cfg_.loader_threads,
                                              world_.local_size());
  req.share = world_.cpu_share();
  req.gathered = true;
  const CpuThreads threads = decide_cpu_threads(req);
  cfg_.loader_threads = threads.loader_threads;
  if (req.omp_threads_env == 0) {
    set_omp_threads_per_rank(threads.omp_threads);
    configure_cpu_threads(threads.omp_threads);
  }
  ThreadCpus cpus;
  if (device_.is_cuda()) {
    cpus = thread_cpus(req.share, world_.node_cpus().at(size_t(world_.local_rank())).near);
    if (!cpus.loaders.empty()) pin_current_thread(req.share.cpus);
  }
  loader_cpus_ = cpus.loaders;
  cpu_threads_note_ = describe_cpu_threads(req, threads, cpus);
  node_cpus_note_ = describe_node_shares(world_.node_cpus(), world_.node_shares());
}

// A rank whose loader holds its steps back says so once, with the CPUs it would need (issue 51): its
// loader threads made a batch per step_time (the wait is the part the step could not use), and the step
// alone takes step_time - wait, so the threads that would keep up are threads x step_time / (step_time -
// wait), and one CPU more for the launching thread on a CUDA rank.
void Trainer::warn_if_loader_bound(double wait_s, double time_s) const {
  if (time_s <= 0 || wait_s <= cz::kLoaderBoundFraction * time_s || cfg_.loader_threads <= 0) return;
  const double compute_s = std::max(time_s - wait_s, 1e-9);
  const int threads = int(std::ceil(double(cfg_.loader_threads) * time_s / compute_s));
  const CpuShare& share = world_.cpu_share();
  console_print(
      stderr,
      fmt::format("{}warning: the loader holds this rank back: data wait {:.0f}% of its steps {}-{} "
                  "with {} loader thread{} on {} CPU{} ({} on {}); keeping up would take about {} "
                  "loader threads{} (give the rank more CPUs: srun --cpus-per-task, mpirun --map-by "
                  "...:PE=N; docs/data.md has the cores per GPU the whole recipe needs)\n",
                  world_.size() > 1 ? fmt::format("[rank {}] ", world_.rank()) : "", 100 * wait_s / time_s,
                  step_ - kLoaderCheckSteps + 2, step_, cfg_.loader_threads,
                  cfg_.loader_threads == 1 ? "" : "s", share.cpus.size(), share.cpus.size() == 1 ? "" : "s",
                  cpu_list(share.cpus), world_.hostname(), threads,
                  device_.is_cuda() ? fmt::format(", {} CPUs with the launching thread", threads + 1) : ""));
}

// Note [Every rank's step]: the interval's sums of every rank, gathered between two steps; rank 0 logs them,
// names the slowest rank and warns about one that stays slow.
void Trainer::gather_rank_stats(int64_t step) {
  const RankFigures mine = rank_stats_.take(world_.gpu());
  const std::vector<double> all = control_.all_gather(mine.pack());
  if (world_.rank() != 0) return;
  std::vector<RankFigures> ranks;
  std::vector<std::string> hosts;
  for (int r = 0; r < world_.size(); ++r) {
    ranks.push_back(RankFigures::unpack(all.data() + size_t(r) * RankFigures::kPacked));
    hosts.push_back(world_.peer(r).host);
  }
  const SlowestRank slow = find_slowest(ranks);
  const std::string op = cfg_.stage == 0 ? "all-reduce" : "reduce-scatter";
  write_record(ranks_record(step, ranks, hosts, slow, op));
  if (slow.rank >= 0 && slow.own_ratio >= kSlowRatio && progress_mode() != ProgressMode::off)
    console_print(stderr, fmt::format("step {}: {}\n", step, describe_slowest(slow, op)));
  for (int r : rank_stats_.note_slow(ranks)) {
    const RankFigures& f = ranks[size_t(r)];
    console_print(
        stderr,
        fmt::format("warning: rank {} (host {}, {}) has been more than {:.0f}% slower than the median "
                    "rank for {} intervals of {} steps: its own work {:.1f} ms a step ({}; "
                    "docs/training.md, \"Every rank's step\")\n",
                    r, hosts[size_t(r)], f.gpu >= 0 ? fmt::format("cuda:{}", int(f.gpu)) : "cpu",
                    100 * (kSlowRatio - 1), kSlowIntervals, cfg_.rank_stats_every,
                    1e3 * f.own_s() / std::max(f.steps, 1.0),
                    r == slow.rank ? describe_slowest(slow, op) : "not the slowest this interval"));
  }
}

}  // namespace cz::train
