// Per-op timing: where a training step's time goes (`bench_train_step --profile`). Off by default; a disabled
// scope costs one relaxed atomic load.
//
// Note [Op profiling]: ops, backward nodes and the few non-op phases (optimizer, gradient copies) open a
// Scope. Only the outermost scope of a thread is timed, so an op that calls other ops (a backward node
// calling `contiguous`, `linear` calling the GEMM) is charged once, under its own name, for everything it
// queued. On CUDA a scope records an event pair on the device's current stream: the elapsed time is the GPU's
// time from the op's first kernel to its last, including any idle gap while the host was still launching,
// which is also where the step's time goes. On the CPU it is wall time. `take()` waits for the recorded
// events.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/device.h"
#include "tensor/trace.h"

namespace cz::profiler {

namespace detail {
extern std::atomic<bool> g_enabled;
}

inline bool enabled() {
  return detail::g_enabled.load(std::memory_order_relaxed);
}
// Turning it off drops nothing: records made so far stay for take().
void set_enabled(bool on);

class Scope {
 public:
  Scope(std::string_view name, Device device) : traced_(trace::active()) {
    if (enabled()) begin(name, device);
    if (traced_) trace::op_begin(name, device);  // --trace's compute lane (Note [Trace lanes])
  }
  ~Scope() {
    if (slot_ != kOff) end();
    if (traced_) trace::op_end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(std::string_view name, Device device);
  void end() noexcept;
  static constexpr int64_t kOff = -1, kNested = -2;
  int64_t slot_ = kOff;      // index of this scope's record, or kOff (profiling was off), or kNested
  uint64_t generation_ = 0;  // take() calls before this scope began: a record taken early is not touched
  bool traced_;              // recorded on the trace's timeline too
};

// The name of the outermost scope open on this thread, "" outside any (or while profiling is off): which op
// an allocation happens in, for Note [Allocator event log].
std::string_view current_scope();

struct OpTime {
  std::string name;
  int64_t calls = 0;
  double ms = 0;  // summed over the calls
};

// Waits for the timed work, then returns each name's call count and total time, largest total first, and
// clears the records. Scopes still open on other threads are dropped, not misattributed.
std::vector<OpTime> take();

}  // namespace cz::profiler
