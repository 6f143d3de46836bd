// The timeline recorder behind --trace (dist/train/step_tracer.h): spans on named lanes, kept in memory
// while tracing is on and handed out as Chrome Trace Event records. Off by default; while off, a hook costs
// one relaxed atomic load.
//
// Note [Trace lanes]: a lane is a name ("compute", "data wait", "comm 1", ...) that becomes one thread (tid)
// of the rank's process in the viewer. Spans on one lane must nest, which holds by construction when a lane
// is written by one thread only: the training thread's op scopes and phases go to the lane its thread was
// given (set_thread_lane), each communication thread's collectives to a lane of their own, and a span that
// may overlap the training thread's (data wait, checkpoint saves) names its own lane. Only the outermost op
// scope of a thread is recorded, as the op profiler times it (Note [Op profiling]).
//
// Note [Trace blocks]: ops are grouped by the model's block (and ZeRO-3 unit) they ran in. The training
// thread names its block (set_block, from the units' forward and backward hooks, step_tracer.cpp) and each
// op records the name current when it began; take() wraps every run of consecutive ops of one lane with the
// same block in one span of category "block" around them. Runs never cross: the name says forward or
// backward, and is cleared where a phase ends, so the block spans nest between the phase's and the ops'.
// Collectives are labelled the same way (set_comm_label: "bucket 3", "unit 5"), read by dist::Work when the
// launching thread creates it.
//
// Note [Trace device times]: on CUDA an op's span is the device's time between two events recorded on the
// stream at the scope's ends (as the op profiler times it), on a lane "compute (cuda:0)" beside the host's
// (whose phase spans run ahead of the device), and NCCL's collectives are timed by their own
// start and end events; both are put on the host clock through one zero event recorded when tracing starts
// (set_device_zero: the host waits for it, so host time then = device time of the event, to the wait's
// wake-up latency of a few microseconds).
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/device.h"

namespace cz::trace {

using Clock = std::chrono::steady_clock;

namespace detail {
extern std::atomic<bool> g_active;
}

inline bool active() {
  return detail::g_active.load(std::memory_order_relaxed);
}
// Times are recorded relative to `zero` (Note [Trace clocks] in step_tracer.cpp).
void set_zero(Clock::time_point zero);
void set_active(bool on);

// This thread's lane, for its op scopes and its unnamed spans; a thread never named gets "thread N".
void set_thread_lane(std::string_view lane);
// The lane of this thread, prefixed: "comm 2" for the second thread that asked with "comm".
std::string thread_lane(std::string_view prefix);

struct Event {
  std::string name, cat, lane;
  std::string block;  // ops: the block they ran in (Note [Trace blocks])
  char ph = 'X';      // X complete, i instant, C counter
  double ts_us = 0, dur_us = 0;
  std::string args_json;  // a JSON object's text, or empty
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

// A counter sample ("C"): args_json's numeric fields, drawn as a stacked graph per name.
void counter(std::string_view name, std::string args_json);

// Op scopes (profiler.h) call these: only the outermost scope of a thread is recorded. On CUDA the span is
// the device's (Note [Trace device times]).
void op_begin(std::string_view name, Device device);
void op_end();

// This thread's block ("" = none) for the ops it runs from now on (Note [Trace blocks]).
void set_block(std::string_view block);
// The label of the collectives this thread launches from now on ("" = none); Label sets it for a scope and
// then puts back the one before (scopes nest: a bucket's launch may post an older bucket's second hop).
void set_comm_label(std::string_view label);
const std::string& comm_label();
class Label {
 public:
  // "bucket 3": formatted only while tracing.
  Label(std::string_view what, size_t index) : on_(active()) {
    if (!on_) return;
    previous_ = comm_label();
    set_comm_label(std::string(what) + " " + std::to_string(index));
  }
  ~Label() {
    if (on_) set_comm_label(previous_);
  }
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  bool on_;
  std::string previous_;
};

// Note [Trace device times]: records the zero event on `device`'s current stream and waits for it. A CPU
// device does nothing.
void set_device_zero(Device device);
// The host time of a device event (an event handle of tensor/stream.h) recorded after the zero event; nullopt
// without one.
std::optional<Clock::time_point> device_time(void* cuda_event);

// Everything recorded so far, in recording order; clears the records.
std::vector<Event> take();

}  // namespace cz::trace
