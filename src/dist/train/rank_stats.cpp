// Note [Every rank's step] in rank_stats.h.
#include "dist/train/rank_stats.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace cz::train {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double per_step(double sum, const RankFigures& f) {
  return f.steps > 0 ? sum / f.steps : 0;
}

}  // namespace

double RankFigures::compute_s() const {
  return std::max(0.0, step_s - data_wait_s - input_s - comm_wait_s);
}

std::vector<double> RankFigures::pack() const {
  return {steps, step_s, data_wait_s, input_s, comm_wait_s, gpu};
}

RankFigures RankFigures::unpack(const double* v) {
  RankFigures f;
  f.steps = v[0];
  f.step_s = v[1];
  f.data_wait_s = v[2];
  f.input_s = v[3];
  f.comm_wait_s = v[4];
  f.gpu = v[5];
  return f;
}

SlowestRank find_slowest(const std::vector<RankFigures>& ranks) {
  SlowestRank s;
  if (ranks.size() < 2) return s;
  std::vector<double> own;
  for (const RankFigures& f : ranks) own.push_back(per_step(f.own_s(), f));
  s.rank = int(std::max_element(own.begin(), own.end()) - own.begin());
  const RankFigures& me = ranks[size_t(s.rank)];
  const double med_own = median(own);
  s.own_ratio = med_own > 0 ? own[size_t(s.rank)] / med_own : 1;
  // Its phases against the other ranks' medians, per step.
  struct Phase {
    const char* name;
    double (*of)(const RankFigures&);
  };
  const Phase phases[] = {
      {"loader", [](const RankFigures& f) { return f.data_wait_s; }},
      {"compute", [](const RankFigures& f) { return f.compute_s(); }},
      {"input copies", [](const RankFigures& f) { return f.input_s; }},
  };
  double best = -INFINITY;
  for (const Phase& p : phases) {
    std::vector<double> others;
    for (size_t r = 0; r < ranks.size(); ++r)
      if (int(r) != s.rank) others.push_back(per_step(p.of(ranks[r]), ranks[r]));
    const double excess = per_step(p.of(me), me) - median(others);
    if (excess > best) {
      best = excess;
      s.phase = p.name;
      s.phase_fraction = me.step_s > 0 ? p.of(me) / me.step_s : 0;
    }
  }
  std::vector<double> waits;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (int(r) != s.rank) waits.push_back(per_step(ranks[r].comm_wait_s, ranks[r]));
  s.others_wait_s = median(waits);
  return s;
}

std::string describe_slowest(const SlowestRank& s, const std::string& op) {
  if (s.rank < 0) return "";
  return fmt::format(
      "slowest rank {}: {} {:.0f}% of its step, {:.2f}x the median rank's (the others wait {:.0f} "
      "ms a step in {})",
      s.rank, s.phase, 100 * s.phase_fraction, s.own_ratio, 1e3 * s.others_wait_s, op);
}

nlohmann::json ranks_record(int64_t step, const std::vector<RankFigures>& ranks,
                            const std::vector<std::string>& hosts, const SlowestRank& s,
                            const std::string& op) {
  nlohmann::json per = nlohmann::json::array();
  nlohmann::json r = {{"split", "ranks"}, {"step", step}};
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankFigures& f = ranks[i];
    const double n = std::max(f.steps, 1.0);
    per.push_back({{"rank", int(i)},
                   {"host", i < hosts.size() ? hosts[i] : ""},
                   {"device", f.gpu >= 0 ? fmt::format("cuda:{}", int(f.gpu)) : "cpu"},
                   {"steps", int64_t(f.steps)},
                   {"step_s", f.step_s / n},
                   {"compute_s", f.compute_s() / n},
                   {"data_wait_s", f.data_wait_s / n},
                   {"input_s", f.input_s / n},
                   {"comm_wait_s", f.comm_wait_s / n}});
    // Flat numbers for TensorBoard (ranks/rankN_*), which skips the nested array.
    r[fmt::format("rank{}_own_s", i)] = f.own_s() / n;
    r[fmt::format("rank{}_comm_wait_s", i)] = f.comm_wait_s / n;
  }
  r["ranks"] = std::move(per);
  if (s.rank >= 0) {
    r["slowest_rank"] = s.rank;
    r["slowest_phase"] = s.phase;
    r["slowest_phase_fraction"] = s.phase_fraction;
    r["slowest_own_ratio"] = s.own_ratio;
    r["others_wait_s"] = s.others_wait_s;
    r["collective"] = op;
  }
  return r;
}

void RankStats::add(double step_s, double data_wait_s, double input_s, double comm_wait_s) {
  sum_.steps += 1;
  sum_.step_s += step_s;
  sum_.data_wait_s += data_wait_s;
  sum_.input_s += input_s;
  sum_.comm_wait_s += comm_wait_s;
}

bool RankStats::due(int64_t step, bool last) const {
  return every_ > 0 && sum_.steps > 0 && (step % every_ == 0 || last);
}

RankFigures RankStats::take(int gpu) {
  RankFigures f = sum_;
  f.gpu = gpu;
  sum_ = {};
  return f;
}

std::vector<int> RankStats::note_slow(const std::vector<RankFigures>& ranks) {
  runs_.resize(ranks.size(), 0);
  warned_.resize(ranks.size(), false);
  std::vector<double> own;
  for (const RankFigures& f : ranks) own.push_back(per_step(f.own_s(), f));
  const double med = median(own);
  std::vector<int> reached;
  for (size_t r = 0; r < ranks.size(); ++r) {
    runs_[r] = med > 0 && own[r] > kSlowRatio * med ? runs_[r] + 1 : 0;
    if (runs_[r] >= kSlowIntervals && !warned_[r]) {
      warned_[r] = true;
      reached.push_back(int(r));
    }
  }
  return reached;
}

}  // namespace cz::train
