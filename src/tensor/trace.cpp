// Note [Trace lanes] (trace.h): the in-memory timeline behind --trace.
#include "tensor/trace.h"

#include <map>
#include <mutex>

#include <fmt/format.h>

namespace cz::trace {

namespace detail {
std::atomic<bool> g_active{false};
}

namespace {

struct State {
  std::mutex mu;
  std::vector<Event> events;
  Clock::time_point zero = Clock::now();
  std::map<std::string, int, std::less<>> lane_counts;  // thread_lane's numbering per prefix
  int unnamed = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: threads may record during static teardown
  return *s;
}

thread_local std::string tls_lane;
thread_local int tls_op_depth = 0;
thread_local std::string tls_op_name;
thread_local Clock::time_point tls_op_t0;

double us_since_zero(const State& s, Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - s.zero).count();
}

const std::string& own_lane(State& s) {
  if (tls_lane.empty()) {
    std::lock_guard lock(s.mu);
    tls_lane = fmt::format("thread {}", ++s.unnamed);
  }
  return tls_lane;
}

}  // namespace

void set_zero(Clock::time_point zero) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.zero = zero;
}

void set_active(bool on) {
  detail::g_active.store(on, std::memory_order_relaxed);
}

void set_thread_lane(std::string_view lane) {
  tls_lane = lane;
}

std::string thread_lane(std::string_view prefix) {
  if (!tls_lane.empty()) return tls_lane;
  State& s = state();
  std::lock_guard lock(s.mu);
  tls_lane = fmt::format("{} {}", prefix, ++s.lane_counts[std::string(prefix)]);
  return tls_lane;
}

void complete(std::string_view name, std::string_view cat, Clock::time_point t0, Clock::time_point t1,
              std::string_view lane, std::string args_json) {
  if (!active()) return;
  State& s = state();
  std::string l = lane.empty() ? own_lane(s) : std::string(lane);
  std::lock_guard lock(s.mu);
  s.events.push_back(Event{.name = std::string(name),
                           .cat = std::string(cat),
                           .lane = std::move(l),
                           .ph = 'X',
                           .ts_us = us_since_zero(s, t0),
                           .dur_us = std::chrono::duration<double, std::micro>(t1 - t0).count(),
                           .args_json = std::move(args_json)});
}

void instant(std::string_view name, std::string_view cat, std::string_view lane, std::string args_json) {
  if (!active()) return;
  State& s = state();
  std::string l = lane.empty() ? own_lane(s) : std::string(lane);
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(s.mu);
  s.events.push_back(Event{.name = std::string(name),
                           .cat = std::string(cat),
                           .lane = std::move(l),
                           .ph = 'i',
                           .ts_us = us_since_zero(s, now),
                           .args_json = std::move(args_json)});
}

Span::Span(std::string_view name, std::string_view cat, std::string_view lane) : on_(active()) {
  if (!on_) return;
  name_ = name;
  cat_ = cat;
  lane_ = lane;
  t0_ = Clock::now();
}

Span::~Span() {
  if (on_) complete(name_, cat_, t0_, Clock::now(), lane_);
}

void op_begin(std::string_view name) {
  if (tls_op_depth++ > 0) return;
  tls_op_name = name;
  tls_op_t0 = Clock::now();
}

void op_end() {
  if (--tls_op_depth > 0) return;
  complete(tls_op_name, "op", tls_op_t0, Clock::now());
}

std::vector<Event> take() {
  State& s = state();
  std::lock_guard lock(s.mu);
  std::vector<Event> out = std::move(s.events);
  s.events.clear();
  return out;
}

}  // namespace cz::trace
