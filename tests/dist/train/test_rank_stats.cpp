// Note [Every rank's step]: the slowest rank and its phase from every rank's sums, the warning's count of
// slow intervals, the log record.
#include <gtest/gtest.h>

#include "dist/train/rank_stats.h"

namespace cz::train {
namespace {

// 10 steps of `step` ms, of which `data`, `input` and `comm` ms waiting or copying.
RankFigures rank(double step, double data, double comm, double input = 0) {
  RankFigures f;
  f.steps = 10;
  f.step_s = 10 * step / 1e3;
  f.data_wait_s = 10 * data / 1e3;
  f.comm_wait_s = 10 * comm / 1e3;
  f.input_s = 10 * input / 1e3;
  return f;
}

TEST(RankStats, TheSlowRankIsTheOneTheOthersWaitFor) {
  // Collectives make every step 100 ms; rank 2 computes 90 ms, the others 60 and wait 30 for it.
  const std::vector<RankFigures> ranks = {rank(100, 2, 38), rank(100, 2, 38), rank(100, 2, 8),
                                          rank(100, 2, 38)};
  const SlowestRank s = find_slowest(ranks);
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.phase, "compute");
  EXPECT_NEAR(s.phase_fraction, 0.90, 1e-9);
  EXPECT_NEAR(s.own_ratio, 92.0 / 62.0, 1e-9);
  EXPECT_NEAR(s.others_wait_s, 0.038, 1e-12);
  EXPECT_EQ(
      describe_slowest(s, "reduce-scatter"),
      "slowest rank 2: compute 90% of its step, 1.48x the median rank's (the others wait 38 ms a step in "
      "reduce-scatter)");
}

TEST(RankStats, ALoaderStarvedRankIsNamedWithTheLoader) {
  // Rank 1 waits 31 ms for its batches; its compute is the others'.
  const std::vector<RankFigures> ranks = {rank(100, 1, 30), rank(100, 31, 0), rank(100, 1, 30)};
  const SlowestRank s = find_slowest(ranks);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.phase, "loader");
  EXPECT_NEAR(s.phase_fraction, 0.31, 1e-9);
  // Copies to the device.
  const SlowestRank c = find_slowest({rank(50, 0, 20, 1), rank(50, 0, 0, 21)});
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.phase, "input copies");
  EXPECT_EQ(find_slowest({rank(50, 0, 0)}).rank, -1);  // one rank: nobody to compare with
  EXPECT_EQ(describe_slowest(find_slowest({rank(50, 0, 0)}), "all-reduce"), "");
}

TEST(RankStats, WarnsOnceAfterThreeSlowIntervalsInARow) {
  RankStats stats(10);
  const std::vector<RankFigures> slow1 = {rank(100, 0, 30), rank(100, 0, 0), rank(100, 0, 30)};
  const std::vector<RankFigures> even = {rank(100, 0, 0), rank(100, 0, 0), rank(100, 0, 0)};
  EXPECT_TRUE(stats.note_slow(slow1).empty());
  EXPECT_TRUE(stats.note_slow(even).empty());  // the run broken
  EXPECT_TRUE(stats.note_slow(slow1).empty());
  EXPECT_TRUE(stats.note_slow(slow1).empty());
  EXPECT_EQ(stats.note_slow(slow1), std::vector<int>({1}));
  EXPECT_TRUE(stats.note_slow(slow1).empty());  // once
}

TEST(RankStats, SumsAreTakenEveryIntervalAndAtTheEnd) {
  RankStats stats(5);
  EXPECT_FALSE(stats.due(5, false));  // nothing summed yet
  for (int i = 0; i < 5; ++i) stats.add(0.1, 0.01, 0.002, 0.03);
  EXPECT_FALSE(stats.due(4, false));
  EXPECT_TRUE(stats.due(5, false));
  EXPECT_TRUE(stats.due(7, true));
  const RankFigures f = stats.take(3);
  EXPECT_EQ(f.steps, 5);
  EXPECT_NEAR(f.step_s, 0.5, 1e-12);
  EXPECT_NEAR(f.compute_s(), 0.5 - 0.05 - 0.01 - 0.15, 1e-12);
  EXPECT_EQ(f.gpu, 3);
  EXPECT_EQ(RankFigures::unpack(f.pack().data()).pack(), f.pack());
  EXPECT_FALSE(stats.due(10, true));  // taken: a new interval
  EXPECT_FALSE(RankStats(0).enabled());
}

TEST(RankStats, TheLogRecordHoldsEveryRankAndTheSlowest) {
  std::vector<RankFigures> ranks = {rank(100, 2, 38), rank(100, 2, 8)};
  ranks[1].gpu = 1;
  const nlohmann::json r = ranks_record(20, ranks, {"a", "b"}, find_slowest(ranks), "all-reduce");
  EXPECT_EQ(r["split"], "ranks");
  EXPECT_EQ(r["step"], 20);
  ASSERT_EQ(r["ranks"].size(), 2u);
  EXPECT_EQ(r["ranks"][1]["host"], "b");
  EXPECT_EQ(r["ranks"][1]["device"], "cuda:1");
  EXPECT_EQ(r["ranks"][0]["device"], "cpu");
  EXPECT_NEAR(r["ranks"][1]["compute_s"].get<double>(), 0.090, 1e-12);
  EXPECT_EQ(r["slowest_rank"], 1);
  EXPECT_EQ(r["slowest_phase"], "compute");
  EXPECT_NEAR(r["rank1_own_s"].get<double>(), 0.092, 1e-12);  // flat, for TensorBoard
}

}  // namespace
}  // namespace cz::train
