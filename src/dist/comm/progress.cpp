// Backoff, deadlines and liveness checks for communication threads (Note [Polling]).
#include "dist/comm/progress.h"

#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>

#include "dist/comm/bootstrap.h"
#include "dist/comm/hang_report.h"
#include "tensor/check.h"

namespace cz::dist {

using Clock = std::chrono::steady_clock;

namespace {
int yield_us() {
  static const int us = [] {
    const char* env = std::getenv("CZ_COMM_YIELD_US");
    return env && *env ? std::max(0, std::atoi(env)) : Poller::kYieldUs;
  }();
  return us;
}
}  // namespace

Poller::Poller(const World* world, std::string what, double timeout_s, const std::vector<int>* members)
    : world_(world), members_(members), what_(std::move(what)), timeout_s_(timeout_s) {
  start_ = last_progress_ = Clock::now();
  deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  next_liveness_ = start_ + std::chrono::milliseconds(kLivenessMs);
}

void Poller::tune_thread() {
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us instead of the default 50 us
}

void Poller::progressed() {
  last_progress_ = Clock::now();
  sleep_us_ = 1;
}

double Poller::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void Poller::idle(int waiting_for) {
  if (hook_) hook_();
  const auto now = Clock::now();
  if (now >= deadline_ || now >= next_liveness_ || (abort_flag_ && abort_flag_->load())) check(waiting_for);
  if (now - last_progress_ < std::chrono::microseconds(yield_us())) {
    sched_yield();
    return;
  }
  timespec ts{0, long(sleep_us_) * 1000};
  nanosleep(&ts, nullptr);
  sleep_us_ = std::min(sleep_us_ * 2, kMaxSleepUs);
}

void Poller::check(int waiting_for) {
  const auto now = Clock::now();
  if (abort_flag_ && abort_flag_->load()) throw CommError(fmt::format("comm failure: {} aborted", what_));
  if (world_) {
    next_liveness_ = now + std::chrono::milliseconds(kLivenessMs);
    for (int r = 0; r < world_->size(); ++r) {
      if (r == world_->rank() || world_->peer_alive(r)) continue;
      const PeerInfo& p = world_->peer(r);
      throw CommError(
          fmt::format("comm failure: peer rank {} (pid {} on {}) died during {}", r, p.pid, p.host, what_));
    }
  }
  if (now >= deadline_) {
    std::string waiting;
    if (waiting_for >= 0) {
      const int rank = members_ ? (*members_)[size_t(waiting_for)] : waiting_for;
      waiting = fmt::format(" (waiting for rank {})", rank);
      // A peer on another host is named with its host: a lost host is then named by every survivor's message,
      // also without a supervisor.
      if (World::initialized()) {
        const World& w = World::get();
        if (rank >= 0 && rank < w.size() && !w.same_host(rank))
          waiting = fmt::format(" (waiting for rank {} on host {})", rank, w.peer(rank).host);
      }
    }
    std::string report;
    if (collective_.comm >= 0) {
      std::vector<int> members;
      if (members_) members = *members_;
      for (int r = 0; !members_ && world_ && r < world_->size(); ++r) members.push_back(r);
      report = hang_report(collective_, label_, members);
    }
    throw CommError(fmt::format("comm timeout: {} after {:.1f} s{}{}", what_, timeout_s_, waiting, report));
  }
}

}  // namespace cz::dist
