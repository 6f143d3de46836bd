// What the trainer gathers from every rank: each rank's step (Note [Every rank's step]) and the samples each
// rank's loader skipped (Note [Skipping bad samples]).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dist/train/trainer.h"
#include "io/log/train_log.h"

namespace cz::train {

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
  const std::string op = !plan_.sharded() ? "all-reduce" : "reduce-scatter";
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

// Note [Skipping bad samples] (io/data/loader.cpp): a rank's loader counts the distinct samples it replaced,
// and each rank's data set left the same ones out at open. One record of its own at the end of the run, not a
// field of every step's: the sum needs every rank's count, and the steps' one exchange is the loss's.
void Trainer::count_skipped_samples(TrainSummary& sum) {
  if (cfg_.skip_bad_samples == 0) return;
  const std::vector<double> all = control_.all_gather({double(feed_->skipped_samples())});
  sum.skipped_at_open = feed_->train_set().bad_samples();
  sum.skipped = sum.skipped_at_open;
  sum.skipped_on_ranks.clear();
  for (double v : all) {
    sum.skipped_on_ranks.push_back(int64_t(v));
    sum.skipped += int64_t(v);
  }
  write_record({{"split", "data"},
                {"step", step_},
                {"skipped_samples", sum.skipped},
                {"skipped_at_open", sum.skipped_at_open},
                {"skipped_on_ranks", sum.skipped_on_ranks}});
}

}  // namespace cz::train
