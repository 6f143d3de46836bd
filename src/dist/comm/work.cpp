// Work handles: completion flag and error on the host, a CUDA event for the device-side part.
#include "dist/comm/work.h"

#include <fmt/format.h>

#include "tensor/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"
#include "tensor/trace.h"

namespace cz::dist {

Work::~Work() {
  if (event_) cuda_runtime::event_destroy(event_);
  if (start_event_) cuda_runtime::event_destroy(start_event_);
}

void Work::set_device_start_event(void* cuda_event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (start_event_) cuda_runtime::event_destroy(start_event_);
  start_event_ = cuda_event;
}

void Work::set_device_event(void* cuda_event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (event_) cuda_runtime::event_destroy(event_);
  event_ = cuda_event;
}

void Work::mark_started() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = std::chrono::steady_clock::now();
  timed_ = true;
}

double Work::run_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_ || !error_.empty()) return 0.0;
  if (start_event_ && event_)
    return cuda_runtime::event_query(event_) ? cuda_runtime::event_elapsed_ms(start_event_, event_) / 1e3
                                             : 0.0;
  return timed_ ? std::chrono::duration<double>(finished_ - started_).count() : 0.0;
}

std::optional<std::pair<Work::TimePoint, Work::TimePoint>> Work::host_run_interval() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_ || !error_.empty() || !timed_ || (start_event_ && event_)) return std::nullopt;
  return std::make_pair(started_, finished_);
}

void Work::mark_done() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = std::chrono::steady_clock::now();
    done_ = true;
  }
  // --trace: the collective as it ran on the communication thread (Note [Trace lanes]). what_ is set at
  // construction; call_ is not read here, as the launching thread sets it after submit.
  if (trace::active() && timed_) {
    const std::string kind = what_.substr(0, what_.find(' '));
    trace::complete(kind, "comm", started_, finished_, {}, fmt::format("{{\"what\": \"{}\"}}", what_));
  }
  cv_.notify_all();
}

void Work::mark_failed(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = error;
    done_ = true;
  }
  cv_.notify_all();
}

bool Work::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !error_.empty();
}

void Work::wait_host() {
  std::unique_lock<std::mutex> lock(mu_);
  // The backend bounds every collective by its timeout and always marks the work, so this cannot hang.
  cv_.wait(lock, [&] { return done_; });
  if (!error_.empty()) throw CommError(error_);
}

void Work::wait() {
  wait_host();
  std::lock_guard<std::mutex> lock(mu_);
  if (event_ && device_.is_cuda()) cuda_runtime::event_wait(event_, current_stream(device_));
}

void Work::synchronize() {
  wait_host();
  void* ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ev = event_;
  }
  if (ev) cuda_runtime::event_synchronize(ev);
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw CommError(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return false;
  if (!error_.empty() || !event_) return true;
  try {
    return cuda_runtime::event_query(event_);
  } catch (...) {
    return true;  // a broken device reports through wait()
  }
}

}  // namespace cz::dist
