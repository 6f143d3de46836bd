// What one step's collectives cost: bytes sent, the time they ran, the time the host waited for them, and the
// peak bytes of communication buffers. The reducer and the gatherer wait through it; the engine reads it out
// into the step's statistics.
#pragma once

#include <utility>
#include <vector>

#include "dist/comm/comms_table.h"
#include "dist/comm/process_group.h"
#include "dist/zero/step_stats.h"

namespace cz::zero {

class CommMeter {
 public:
  // The host of each world rank (dist::HostMap::host_of); without it no byte counts as cross-host.
  void set_hosts(std::vector<int> host_of) { host_of_ = std::move(host_of); }
  // A new step: the counts back to zero. The buffers still held are the new peak's start.
  void begin_step();
  // Waits for `w` (null: nothing to wait for), timing the host's wait.
  void wait(const dist::WorkHandle& w);
  // A `kind` collective (all-reduce, reduce-scatter or all-gather) over `group` of `bytes`. On a ring each
  // rank sends as many bytes to its successor (ring_bytes_sent); of those that cross hosts (on the links to
  // another host), this rank counts its equal share, so that a host's ranks together count what leaves the
  // host when the groups are alike on every host (as a mesh's are), and rank 0's log alone tells it. In two
  // levels (Note [Two-level collectives]) a rank sends (R-1)/R of the buffer inside its host per host step
  // and its cross group's ring share of the buffer's 1/R across hosts, all of that leaving the host.
  void sent(const dist::ProcessGroup& group, int64_t bytes, dist::Collective kind);
  // A send of `bytes` to the group's rank `peer` (cross-host when the peer's host is not this rank's).
  void sent_to(const dist::ProcessGroup& group, int peer, int64_t bytes);
  // Communication buffers allocated (bytes > 0) or freed (bytes < 0).
  void hold(int64_t bytes);
  // Waits for the device side of the step's collectives and writes comm_s, comm_exposed_s, comm_wait_s,
  // comm_bytes, comm_cross_bytes and comm_buffer_bytes into `s`.
  void finish_step(StepStats& s);
  // Every collective of the steps so far, by kind and size (--comms-table); each call's exposed time is the
  // part of its own run during the host's waits.
  const dist::CommsTable& table() const { return table_; }

 private:
  using Interval = std::pair<dist::Work::TimePoint, dist::Work::TimePoint>;
  std::vector<dist::WorkHandle> works_;  // waited for in this step: their run times are its comm_s
  std::vector<Interval> waits_;          // the host's waits
  double wait_s_ = 0;
  int64_t bytes_ = 0, cross_bytes_ = 0;
  std::vector<int> host_of_;
  int64_t held_ = 0, peak_ = 0;
  dist::CommsTable table_;
};

}  // namespace cz::zero
