// Note [Op profiling] (profiler.h): outermost scopes per thread, CUDA event pairs or host wall time.
#include "tensor/profiler.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "tensor/check.h"
#include "tensor/stream.h"

namespace cz::profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

using Clock = std::chrono::steady_clock;

struct Record {
  std::string name;
  Device device;
  Clock::time_point t0, t1;            // CPU
  std::unique_ptr<Event> start, stop;  // CUDA
  bool ended = false;                  // the scope closed normally
};

struct State {
  std::mutex mu;
  std::vector<Record> records;
  uint64_t generation = 0;                                         // take() calls so far
  std::map<int, std::vector<std::unique_ptr<Event>>> free_events;  // by CUDA device index

  std::unique_ptr<Event> event(Device d) {
    auto& pool = free_events[d.index];
    if (pool.empty()) return std::make_unique<Event>(d);
    std::unique_ptr<Event> e = std::move(pool.back());
    pool.pop_back();
    return e;
  }
};

State& state() {
  static State* s = new State;  // never destroyed: events outlive static teardown order otherwise
  return *s;
}

thread_local int tls_depth = 0;
thread_local std::string tls_outermost;  // the outermost open scope's name

}  // namespace

void set_enabled(bool on) {
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

void Scope::begin(std::string_view name, Device device) {
  if (tls_depth++ > 0) {
    slot_ = kNested;  // counted for the depth, not timed
    return;
  }
  tls_outermost = name;
  State& s = state();
  std::lock_guard lock(s.mu);
  Record r;
  r.name = name;
  r.device = device;
  if (device.is_cuda()) {
    r.start = s.event(device);
    r.stop = s.event(device);
    r.start->record(current_stream(device));
  } else {
    r.t0 = Clock::now();
  }
  s.records.push_back(std::move(r));
  slot_ = int64_t(s.records.size()) - 1;
  generation_ = s.generation;
}

void Scope::end() noexcept {
  --tls_depth;
  if (slot_ < 0) return;
  tls_outermost.clear();
  State& s = state();
  std::lock_guard lock(s.mu);
  if (generation_ != s.generation) return;  // take() already ran and dropped this record
  Record& r = s.records[size_t(slot_)];
  try {
    if (r.device.is_cuda())
      r.stop->record(current_stream(r.device));
    else
      r.t1 = Clock::now();
    r.ended = true;
  } catch (...) {
    // The device is failing anyway; take() leaves this record out.
  }
}

std::string_view current_scope() {
  return tls_outermost;
}

std::vector<OpTime> take() {
  State& s = state();
  std::lock_guard lock(s.mu);
  CZ_ASSERT(tls_depth == 0, "profiler::take() called inside a profiling scope");
  std::map<std::string, OpTime> by_name;
  for (Record& r : s.records) {
    if (!r.ended) continue;  // its end failed, or it is still open on another thread
    double ms = 0;
    if (r.device.is_cuda()) {
      r.stop->synchronize();
      ms = double(r.start->elapsed_ms(*r.stop));
      auto& pool = s.free_events[r.device.index];
      pool.push_back(std::move(r.start));
      pool.push_back(std::move(r.stop));
    } else {
      ms = std::chrono::duration<double, std::milli>(r.t1 - r.t0).count();
    }
    OpTime& t = by_name[r.name];
    t.name = r.name;
    t.calls += 1;
    t.ms += ms;
  }
  s.records.clear();
  ++s.generation;
  std::vector<OpTime> out;
  out.reserve(by_name.size());
  for (auto& [name, t] : by_name) out.push_back(std::move(t));
  std::stable_sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace cz::profiler
