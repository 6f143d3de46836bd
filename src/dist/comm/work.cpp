// Work handles: completion flag and error on the host, a CUDA event for the device-side part.
#include "dist/comm/work.h"

#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dist/comm/communicator.h"

#include "tensor/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"
#include "tensor/trace.h"

namespace cz::dist {

Work::Work(std::string what, Device device)
    : what_(std::move(what)),
      label_(trace::active() ? trace::comm_label() : std::string()),
      device_(device) {}

// "all_reduce of 4096 bytes on ranks [0, 1]" (describe_call) -> "all_reduce bucket 3", with the bytes, the
// group and the label as the span's arguments.
void Work::trace_span(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1,
                      const std::string& lane) const {
  const std::string kind = what_.substr(0, what_.find(' '));
  nlohmann::json args = {{"what", what_}};
  if (const size_t of = what_.find(" of "); of != std::string::npos)
    args["bytes"] = std::strtoll(what_.c_str() + of + 4, nullptr, 10);
  if (const size_t on = what_.find(" on ranks "); on != std::string::npos)
    args["group"] = what_.substr(on + 4);
  if (!label_.empty()) args["for"] = label_;
  if (const std::string_view comm = current_communicator(); !comm.empty()) args["communicator"] = comm;
  trace::complete(label_.empty() ? kind : kind + " " + label_, "comm", t0, t1, lane, args.dump());
}

void Work::trace_device() const {
  if (!trace::active()) return;
  void *start = nullptr, *end = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ || !error_.empty()) return;
    start = start_event_;
    end = event_;
  }
  if (!start || !end) return;
  const auto t0 = trace::device_time(start), t1 = trace::device_time(end);
  if (t0 && t1) trace_span(*t0, *t1, trace_lane_.empty() ? std::string("comm (device)") : trace_lane_);
}

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
  if (trace::active() && timed_) trace_span(started_, finished_, {});
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

void settle(std::vector<WorkHandle>& works) noexcept {
  for (auto& w : works)
    if (w) try {
        w->wait();
      } catch (...) {
      }
  works.clear();
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
