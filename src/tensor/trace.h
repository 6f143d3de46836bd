// The timeline recorder behind --trace (dist/train/step_trace.h): spans on named lanes, kept in memory while
// tracing is on and handed out as Chrome Trace Event records. Off by default; while off, a hook costs one
// relaxed atomic load.
//
// Note [Trace lanes]: a lane is a name ("compute", "data wait", "comm 1", ...) that becomes one thread (tid)
// of the rank's process in the viewer. Spans on one lane must nest, which holds by construction when a lane
// is written by one thread only: the training thread's op scopes and phases go to the lane its thread was
// given (set_thread_lane), each communication thread's collectives to a lane of their own, and a span that
// may overlap the training thread's (data wait, checkpoint saves) names its own lane. Only the outermost op
// scope of a thread is recorded, as the op profiler times it (Note [Op profiling]).
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace cz::trace {

using Clock = std::chrono::steady_clock;

namespace detail {
extern std::atomic<bool> g_active;
}

inline bool active() {
  return detail::g_active.load(std::memory_order_relaxed);
}
// Times are recorded relative to `zero` (Note [Trace clocks] in step_trace.cpp).
void set_zero(Clock::time_point zero);
void set_active(bool on);

// This thread's lane, for its op scopes and its unnamed spans; a thread never named gets "thread N".
void set_thread_lane(std::string_view lane);
// The lane of this thread, prefixed: "comm 2" for the second thread that asked with "comm".
std::string thread_lane(std::string_view prefix);

struct Event {
  std::string name, cat, lane;
  char ph = 'X';             // X complete, i instant, C counter
  double ts_us = 0, dur_us = 0;
  std::string args_json;     // a JSON object's text, or empty
};

// A complete span [t0, t1] on `lane` ("" = this thread's lane). Dropped while tracing is off.
void complete(std::string_view name, std::string_view cat, Clock::time_point t0, Clock::time_point t1,
              std::string_view lane = {}, std::string args_json = {});
void instant(std::string_view name, std::string_view cat, std::string_view lane = {},
             std::string args_json = {});

// A span from construction to destruction (only if tracing was on at construction).
class Span {
 public:
  Span(std::string_view name, std::string_view cat, std::string_view lane = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  std::string name_, cat_, lane_;
  Clock::time_point t0_;
};

// Op scopes (profiler.h) call these: only the outermost scope of a thread is recorded.
void op_begin(std::string_view name);
void op_end();

// Everything recorded so far, in recording order; clears the records.
std::vector<Event> take();

}  // namespace cz::trace
