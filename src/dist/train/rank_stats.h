// Every rank's step, gathered (Note [Every rank's step]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cz::train {

// Note [Every rank's step]: a run goes at the pace of its slowest rank, and the slow rank is rarely rank 0 (a
// GPU in an x4 slot or throttling, a loader starved on one socket, a busy neighbour). Data-parallel
// collectives equalise the step time across ranks, so the slow rank shows only in what each rank did before
// it entered a collective: each rank sums, over the steps of an interval, its step time, its data wait, its
// host's part of the input's copy to the device, and its waits in collectives (the engine's comm_wait_s and
// the loss's all-reduce); the rest is its compute. Every --rank-stats-every steps the ranks all-gather those
// sums (one small collective between two steps, on the control communicator), and rank 0 names the rank
// whose own work (step time less its waits in collectives) is the longest, and its phase: the one of loader,
// compute and input copies in which it spent the most beyond the other ranks' median. The log line reads
//   slowest rank 1: compute 93% of its step, 1.42x the median rank's (the others wait 41 ms a step in
//   all-reduce)
// and the JSON log gets a "ranks" record (every rank's figures, slowest_rank and its phase), which
// TensorBoard shows as ranks/*. A rank whose own work is more than 10% above the median for
// kSlowIntervals intervals in a row gets one warning line, with its host and device.
struct RankFigures {
  double steps = 0;        // steps in the interval
  double step_s = 0;       // their step_time_s
  double data_wait_s = 0;  // waiting for the loader's batches
  double input_s = 0;      // the host's part of the input's copy to the device (or its conversion)
  double comm_wait_s = 0;  // waiting in collectives: the engine's comm_wait_s and the loss's all-reduce
  double gpu = -1;         // the rank's CUDA device, -1 on a CPU rank

  double own_s() const { return step_s - comm_wait_s; }
  double compute_s() const;  // step_s less every wait and the input's copy (at least 0)
  std::vector<double> pack() const;
  static RankFigures unpack(const double* v);
  static constexpr int kPacked = 6;
};

struct SlowestRank {
  int rank = -1;
  std::string phase;          // "loader", "compute" or "input copies"
  double phase_fraction = 0;  // that phase's time over the rank's step time
  double own_ratio = 1;       // its own work over the median rank's
  double others_wait_s = 0;   // the median of the other ranks' waits in collectives, per step
};

inline constexpr double kSlowRatio = 1.10;
inline constexpr int kSlowIntervals = 3;

// The rule above over one interval's figures (one entry per rank); rank -1 with fewer than 2 ranks.
SlowestRank find_slowest(const std::vector<RankFigures>& ranks);
// "slowest rank 1: compute 93% of its step, 1.42x the median rank's (the others wait 41 ms a step in
// all-reduce)"; `op`: what the ranks' collectives are ("all-reduce", "reduce-scatter").
std::string describe_slowest(const SlowestRank& s, const std::string& op);
// The log's "ranks" record.
nlohmann::json ranks_record(int64_t step, const std::vector<RankFigures>& ranks,
                            const std::vector<std::string>& hosts, const SlowestRank& s,
                            const std::string& op);

// A rank's sums between two gathers, and the runs of slow intervals per rank that the warning counts.
class RankStats {
 public:
  explicit RankStats(int every) : every_(every) {}
  bool enabled() const { return every_ > 0; }
  void add(double step_s, double data_wait_s, double input_s, double comm_wait_s);
  // After step `step`: whether this is a gather's step (every `every` steps, and the run's last).
  bool due(int64_t step, bool last) const;
  RankFigures take(int gpu);  // the interval's sums (and starts the next)
  // Counts slow intervals; returns the ranks that just reached kSlowIntervals in a row (each rank once).
  std::vector<int> note_slow(const std::vector<RankFigures>& ranks);

 private:
  int every_;
  RankFigures sum_;
  std::vector<int> runs_;
  std::vector<bool> warned_;
};

}  // namespace cz::train
