// Waiting for communication without spinning, within a deadline, watching for dead peers.
// Note [Polling]: ranks may outnumber cores (CI runs 4 ranks on 2), and MPI's blocking calls busy-poll, which
// starves the very peers a rank is waiting for. So communication threads never block inside MPI: they test
// requests and, between tests, first yield the core (sched_yield) for kYieldUs after the last progress, then
// sleep with an exponential backoff capped at kMaxSleepUs. Yielding hands the core straight to any other
// runnable thread (often the very rank being waited for, when ranks share cores) and costs nothing when there
// is none; a sleep costs 20-100 us of wake-up latency per message, which made 4 KiB all-reduces on 4 ranks
// over 2 cores take 450 us instead of 50 us (100 us of yielding was enough). $CZ_COMM_YIELD_US overrides
// kYieldUs. The thread's timer slack is lowered so that short sleeps stay short. Every wait is bounded by the
// collective's deadline, and same-host peers are checked for liveness while waiting; either failure throws
// CommError naming the collective (a timeout with the hang report of hang_report.h).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dist/comm/collective_log.h"

namespace cz::dist {

class World;

class Poller {
 public:
  static constexpr int kYieldUs = 200;     // yield (not sleep) this long after the last progress
  static constexpr int kMaxSleepUs = 64;   // backoff cap
  static constexpr int kLivenessMs = 100;  // how often waiting checks that same-host peers still exist

  // `what`: "all_reduce of 4096 bytes on ranks [0, 1]"; `world` may be null (no liveness checks).
  // `members`: the world rank of each rank of the group being waited in (null: the world), for messages.
  Poller(const World* world, std::string what, double timeout_s, const std::vector<int>* members = nullptr);

  // Calls done() until it returns true, backing off in between. `waiting_for` (a rank, or -1) only improves
  // the timeout message. Throws CommError on timeout or when a same-host peer has died.
  template <class Done>
  void until(Done&& done, int waiting_for = -1) {
    while (!done()) idle(waiting_for);
    progressed();
  }

  // Extra work done on every idle step (e.g. testing other outstanding requests).
  void set_idle_hook(std::function<void()> hook) { hook_ = std::move(hook); }
  // Waiting stops with CommError("... aborted") once *flag is set (Communicator::abort from another thread).
  void set_abort_flag(const std::atomic<bool>* flag) { abort_flag_ = flag; }
  // The collective being waited for, as the collective log knows it (Note [Collective log]): a timeout then
  // adds the hang report (hang_report.h) to its message. `label`: its communicator's.
  void set_collective(const CollectiveId& id, std::string label) {
    collective_ = id;
    label_ = std::move(label);
  }
  // Call after useful work so the next wait starts with short naps again.
  void progressed();
  double elapsed_s() const;
  const std::string& what() const { return what_; }

  // Lowers the calling thread's timer slack so that microsecond sleeps are not stretched to 50 us.
  static void tune_thread();

 private:
  void idle(int waiting_for);
  void check(int waiting_for);

  const World* world_;
  const std::vector<int>* members_;
  std::string what_;
  double timeout_s_;
  std::chrono::steady_clock::time_point start_, deadline_, last_progress_, next_liveness_;
  int sleep_us_ = 1;
  std::function<void()> hook_;
  const std::atomic<bool>* abort_flag_ = nullptr;
  CollectiveId collective_;
  std::string label_;
};

}  // namespace cz::dist
