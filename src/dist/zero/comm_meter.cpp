// The step's communication figures (Note [Exposed communication]).
#include "dist/zero/comm_meter.h"

#include <algorithm>
#include <chrono>

namespace cz::zero {

void CommMeter::begin_step() {
  works_.clear();  // evaluation's gathers since the last step
  waits_.clear();
  wait_s_ = 0;
  bytes_ = cross_bytes_ = 0;
  peak_ = held_;
}

void CommMeter::wait(const dist::WorkHandle& w) {
  if (!w) return;
  const auto t0 = std::chrono::steady_clock::now();
  w->wait();
  const auto t1 = std::chrono::steady_clock::now();
  wait_s_ += std::chrono::duration<double>(t1 - t0).count();
  waits_.emplace_back(t0, t1);
  works_.push_back(w);
}

void CommMeter::sent(const dist::ProcessGroup& group, int64_t bytes, dist::Collective kind) {
  const int factor = kind == dist::Collective::all_reduce ? 2 : 1;
  const dist::Communicator* comm = group.communicator();
  if (comm && !host_of_.empty() && comm->two_level(kind, size_t(bytes), group.device())) {
    std::vector<int> hosts;
    for (int r : group.ranks()) hosts.push_back(host_of_.at(size_t(r)));
    std::sort(hosts.begin(), hosts.end());
    const int64_t h = std::unique(hosts.begin(), hosts.end()) - hosts.begin(), r = group.size() / h;
    const int64_t host_steps = kind == dist::Collective::all_reduce ? 2 : 1;  // reduce-scatter, all-gather
    const int64_t across = int64_t(factor) * (bytes / r) * (h - 1) / h;
    bytes_ += host_steps * bytes * (r - 1) / r + across;
    cross_bytes_ += across;
    return;
  }
  const int64_t n = dist::ring_bytes_sent(group, bytes, factor);
  bytes_ += n;
  if (group.size() < 2 || host_of_.empty()) return;
  const std::vector<int> ring = group.ring_order();
  int cross = 0;  // links of the ring from one host to another
  for (size_t i = 0; i < ring.size(); ++i)
    cross += host_of_.at(size_t(ring[i])) != host_of_.at(size_t(ring[(i + 1) % ring.size()]));
  cross_bytes_ += n * cross / group.size();
}

void CommMeter::sent_to(const dist::ProcessGroup& group, int peer, int64_t bytes) {
  bytes_ += bytes;
  if (host_of_.empty()) return;
  const std::vector<int>& ranks = group.ranks();
  if (host_of_.at(size_t(ranks[size_t(peer)])) != host_of_.at(size_t(ranks[size_t(group.rank())])))
    cross_bytes_ += bytes;
}

void CommMeter::hold(int64_t bytes) {
  held_ += bytes;
  peak_ = std::max(peak_, held_);
}

// Note [Exposed communication]
// The host's time in wait() is not all communication: it also holds the hand-off to the communication
// thread, the wait behind collectives queued earlier, and both threads' wake-ups, which on an oversubscribed
// CPU (ranks x threads > cores) can take far longer than a small collective runs. Counting all of it as
// exposed made `1 - exposed / comm_s` as low as -1056% for a 4-block model at 2 ranks. So comm_exposed_s is
// the time during the host's waits in which one of the step's collectives was running (the waits intersected
// with the union of their run intervals). The waits do not overlap each other, so it is at most the measure
// of that union, which is at most comm_s: the hidden fraction 1 - comm_exposed_s / comm_s lies in [0, 1]. The
// rest of the waiting is comm_wait_s - comm_exposed_s. NCCL's collectives are timed on the device's clock and
// wait() does not block the host for them, so they add to comm_s and not to comm_exposed_s.
namespace {
using Interval = std::pair<dist::Work::TimePoint, dist::Work::TimePoint>;
double exposed_seconds(std::vector<Interval> runs, const std::vector<Interval>& waits) {
  std::sort(runs.begin(), runs.end());
  std::vector<Interval> merged;  // disjoint, in order
  for (const auto& r : runs) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  double s = 0;
  for (const auto& [begin, end] : waits)
    for (const auto& [run_begin, run_end] : merged) {
      const auto from = std::max(begin, run_begin), to = std::min(end, run_end);
      if (from < to) s += std::chrono::duration<double>(to - from).count();
    }
  return s;
}
}  // namespace

// On the CPU the collectives are complete once waited for; NCCL's device-side part is timed by its events,
// read once they have passed (the step ends with a device sync anyway).
void CommMeter::finish_step(StepStats& s) {
  std::vector<Interval> runs;
  s.comm_s = 0;
  for (const auto& w : works_) {
    w->synchronize();
    w->trace_device();  // --trace: NCCL's collectives on the timeline (Note [Trace device times])
    s.comm_s += w->run_seconds();
    const auto r = w->host_run_interval();
    if (r) runs.push_back(*r);
    const dist::Work::Call& call = w->call();
    if (call.ranks > 0)
      table_.add(call.kind, call.bytes, call.ranks, w->run_seconds(),
                 r ? exposed_seconds({*r}, waits_) : 0.0);
  }
  s.comm_exposed_s = exposed_seconds(std::move(runs), waits_);
  s.comm_wait_s = wait_s_;
  s.comm_bytes = bytes_;
  s.comm_cross_bytes = cross_bytes_;
  s.comm_buffer_bytes = peak_;
  works_.clear();
  waits_.clear();
}

}  // namespace cz::zero
