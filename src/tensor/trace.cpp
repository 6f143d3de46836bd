// Note [Trace lanes] (trace.h): the in-memory timeline behind --trace.
#include "tensor/trace.h"

#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::trace {

namespace detail {
std::atomic<bool> g_active{false};
}

namespace {

// A CUDA op's events, until take() reads them (Note [Trace device times]).
struct DeviceSpan {
  size_t event;  // its index in State::events
  std::unique_ptr<cz::Event> start, stop;
};

struct State {
  std::mutex mu;
  std::vector<Event> events;
  std::vector<DeviceSpan> device_spans;
  std::unique_ptr<cz::Event> device_zero;  // Note [Trace device times]
  Clock::time_point device_zero_host;
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
thread_local std::string tls_op_block;
thread_local Clock::time_point tls_op_t0;
thread_local Device tls_op_device;
thread_local std::unique_ptr<cz::Event> tls_op_start;  // CUDA
thread_local std::string tls_block;
thread_local std::string tls_comm_label;

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

void counter(std::string_view name, std::string args_json) {
  if (!active()) return;
  State& s = state();
  std::string l = own_lane(s);
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(s.mu);
  s.events.push_back(Event{.name = std::string(name),
                           .cat = "counter",
                           .lane = std::move(l),
                           .ph = 'C',
                           .ts_us = us_since_zero(s, now),
                           .args_json = std::move(args_json)});
}

void op_begin(std::string_view name, Device device) {
  if (tls_op_depth++ > 0) return;
  tls_op_name = name;
  tls_op_block = tls_block;
  tls_op_device = device;
  if (device.is_cuda()) {
    tls_op_start = std::make_unique<cz::Event>(device);
    tls_op_start->record(current_stream(device));
  } else {
    tls_op_t0 = Clock::now();
  }
}

void op_end() {
  if (--tls_op_depth > 0) return;
  if (!active()) return;
  State& s = state();
  if (!tls_op_device.is_cuda()) {
    const Clock::time_point t1 = Clock::now();
    std::string l = own_lane(s);
    std::lock_guard lock(s.mu);
    s.events.push_back(Event{.name = tls_op_name,
                             .cat = "op",
                             .lane = std::move(l),
                             .block = tls_op_block,
                             .ts_us = us_since_zero(s, tls_op_t0),
                             .dur_us = std::chrono::duration<double, std::micro>(t1 - tls_op_t0).count()});
    return;
  }
  auto stop = std::make_unique<cz::Event>(tls_op_device);
  stop->record(current_stream(tls_op_device));
  // The device's times on a lane of their own: the host's phase spans run ahead of them.
  std::string l = own_lane(s) + " (" + tls_op_device.str() + ")";
  std::lock_guard lock(s.mu);
  s.device_spans.push_back(DeviceSpan{s.events.size(), std::move(tls_op_start), std::move(stop)});
  s.events.push_back(Event{.name = tls_op_name, .cat = "op", .lane = std::move(l), .block = tls_op_block});
}

void set_block(std::string_view block) {
  tls_block = block;
}

void set_comm_label(std::string_view label) {
  tls_comm_label = label;
}

const std::string& comm_label() {
  return tls_comm_label;
}

void set_device_zero(Device device) {
  if (!device.is_cuda()) return;
  State& s = state();
  auto zero = std::make_unique<cz::Event>(device);
  zero->record(current_stream(device));
  zero->synchronize();
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(s.mu);
  s.device_zero = std::move(zero);
  s.device_zero_host = now;
}

namespace {
std::optional<Clock::time_point> device_time_locked(const State& s, void* cuda_event) {
  if (!s.device_zero || !cuda_event) return std::nullopt;
  const double ms = double(cuda_runtime::event_elapsed_ms(s.device_zero->handle(), cuda_event));
  return s.device_zero_host +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

// Note [Trace blocks]: one "block" span around each run of consecutive ops of a lane with the same block.
void add_block_spans(std::vector<Event>& events) {
  struct Run {
    std::string block;
    double t0 = 0, t1 = 0;
  };
  std::map<std::string, Run> open;  // per lane
  std::vector<Event> spans;
  auto close = [&](const std::string& lane, Run& r) {
    if (!r.block.empty())
      spans.push_back(
          Event{.name = r.block, .cat = "block", .lane = lane, .ts_us = r.t0, .dur_us = r.t1 - r.t0});
    r = Run{};
  };
  for (const Event& e : events) {
    if (e.cat != "op") continue;
    Run& r = open[e.lane];
    if (e.block != r.block) {
      close(e.lane, r);
      r.block = e.block;
      r.t0 = e.ts_us;
    }
    r.t1 = std::max(r.t1, e.ts_us + e.dur_us);
  }
  for (auto& [lane, r] : open) close(lane, r);
  events.insert(events.end(), spans.begin(), spans.end());
}
}  // namespace

std::optional<Clock::time_point> device_time(void* cuda_event) {
  State& s = state();
  std::lock_guard lock(s.mu);
  return device_time_locked(s, cuda_event);
}

std::vector<Event> take() {
  State& s = state();
  std::lock_guard lock(s.mu);
  for (DeviceSpan& d : s.device_spans) {
    d.stop->synchronize();
    Event& e = s.events[d.event];
    const auto t0 = device_time_locked(s, d.start->handle()), t1 = device_time_locked(s, d.stop->handle());
    if (t0 && t1) {
      e.ts_us = us_since_zero(s, *t0);
      e.dur_us = std::chrono::duration<double, std::micro>(*t1 - *t0).count();
    }
  }
  s.device_spans.clear();
  std::vector<Event> out = std::move(s.events);
  s.events.clear();
  add_block_spans(out);
  return out;
}

}  // namespace cz::trace
