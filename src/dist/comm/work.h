// The handle an asynchronous collective returns. On the CPU the collective runs on the communicator's thread
// and wait() blocks until it has finished; on CUDA it runs on the communicator's stream and wait() orders the
// caller's current stream after it without blocking the host (Note [Comm streams] in communicator.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dist/comm/types.h"
#include "tensor/device.h"

namespace cz::dist {

class Work {
 public:
  // Takes the launching thread's trace label (Note [Trace blocks] in tensor/trace.h) while tracing.
  Work(std::string what, Device device);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Waits for the host-side part (all of it on the CPU; MPI staging of CUDA buffers); then, for CUDA
  // buffers, makes the caller's current stream wait for the device-side part. Throws CommError when the
  // collective failed, timed out or a peer died.
  void wait();
  // Blocks the host until everything, device work included, has finished. Throws like wait().
  void synchronize();
  // Finished (or failed); never blocks, never throws.
  bool is_completed() const;
  // "all_reduce of 4096 bytes on ranks [0, 1]".
  const std::string& what() const { return what_; }

  // Seconds the collective ran, once completed: on the communication thread (from mark_started to mark_done),
  // or on the device between the start and end events (NCCL); 0 before it has completed.
  double run_seconds() const;
  using TimePoint = std::chrono::steady_clock::time_point;
  // When it ran on the communication thread (mark_started to mark_done), on the host's clock, once completed;
  // nullopt before, after a failure, and for device-timed work (NCCL), whose run time is the device's.
  std::optional<std::pair<TimePoint, TimePoint>> host_run_interval() const;

  // What was called, for the comms table (comms_table.h): set by the communicator as it hands the work out,
  // so read it on the thread that launched the collective; bytes as nccl-tests count them (the whole buffer).
  struct Call {
    Collective kind = Collective::barrier;
    int64_t bytes = 0;
    int ranks = 0;
  };
  void set_call(Call call) { call_ = call; }
  const Call& call() const { return call_; }

  // Backend side.
  void set_device_event(void* cuda_event);        // owned from now on; recorded after the device-side work
  void set_device_start_event(void* cuda_event);  // owned; recorded before it (timing)
  void mark_started();
  void mark_done();
  void mark_failed(const std::string& error);
  bool failed() const;
  // --trace (Note [Trace device times]): NCCL's collectives go on `lane` of the timeline once synchronized
  // (trace_device, from CommMeter::finish_step); the host-timed ones at mark_done, on their thread's lane.
  void set_trace_lane(std::string lane) { trace_lane_ = std::move(lane); }
  void trace_device() const;

 private:
  void wait_host();
  void trace_span(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1,
                  const std::string& lane) const;

  std::string what_;
  std::string label_;       // the trace label when it was launched ("bucket 3"), or ""
  std::string trace_lane_;  // NCCL: the communicator's lane
  Device device_;
  Call call_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  void* event_ = nullptr;
  void* start_event_ = nullptr;
  std::chrono::steady_clock::time_point started_, finished_;
  bool timed_ = false;
};

using WorkHandle = std::shared_ptr<Work>;

// Waits for every posted work in `works`, swallowing their errors, then clears it: for destructors and
// unwinding, where a failure was reported already (by a finish()) or is being unwound.
void settle(std::vector<WorkHandle>& works) noexcept;

// The calls a communicator has taken and not yet finished, written once for the backends: the callers' side
// of Note [Back-pressure] (at most max_in_flight admitted and not retired; a caller waits for room) and the
// failure path of Note [Failure handling] (the first error breaks the queue; queued and later calls fail with
// it). Task has a `WorkHandle work`. The mutex also guards what the owner keeps beside the queue.
template <class Task>
class WorkQueue {
 public:
  explicit WorkQueue(int max_in_flight) : max_in_flight_(size_t(max_in_flight)) {}

  std::mutex& mutex() { return mu_; }
  // Notified when a task is queued; the owner's thread waits on it (and the owner notifies it to stop).
  std::condition_variable& ready() { return ready_; }
  // The queued tasks, oldest first; mutex() held.
  std::deque<Task>& tasks() { return tasks_; }

  // Waits (with `lock` on mutex()) until a call may go in flight and counts it; once the queue is broken,
  // fails `work` instead and returns false. fail_all() wakes the wait, so a caller blocked by a hung or dead
  // peer leaves with a failed Work once the running call times out.
  bool admit(std::unique_lock<std::mutex>& lock, Work& work) {
    room_.wait(lock, [&] { return broken_.load() || in_flight_ < max_in_flight_; });
    if (broken_.load()) {
      work.mark_failed(failed_earlier(work, reason_));
      return false;
    }
    ++in_flight_;
    return true;
  }
  // admit(), then queue the task and wake the owner's thread; false (task untouched, its work failed) when
  // the queue is broken.
  bool push(Task&& task) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!admit(lock, *task.work)) return false;
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
    return true;
  }
  // `n` admitted calls have finished: callers waiting in admit() may go on.
  void retire(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_ -= std::min(in_flight_, n);
    }
    room_.notify_all();
  }
  // Breaks the queue (the first error is its reason; admit() refuses from now on) and returns the queued
  // tasks, their works failed as never run.
  std::deque<Task> fail_all(const std::string& error) {
    std::deque<Task> dropped = break_with(error);
    for (auto& t : dropped) t.work->mark_failed(failed_earlier(*t.work, error));
    return dropped;
  }
  // The same, leaving the works to the owner (NCCL's queue holds collectives already on the device).
  std::deque<Task> break_with(const std::string& error) {
    std::deque<Task> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.exchange(true)) reason_ = error;
      dropped.swap(tasks_);
      in_flight_ -= std::min(in_flight_, dropped.size());
    }
    room_.notify_all();
    return dropped;
  }

  bool broken() const { return broken_.load(); }
  // The first error; mutex() not held.
  std::string reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  // The same with mutex() held.
  const std::string& reason_locked() const { return reason_; }

  static std::string failed_earlier(const Work& work, const std::string& error) {
    return fmt::format("{}: the communicator failed earlier: {}", work.what(), error);
  }

 private:
  const size_t max_in_flight_;
  std::mutex mu_;
  std::condition_variable ready_, room_;
  std::deque<Task> tasks_;
  size_t in_flight_ = 0;  // admitted and not retired
  std::atomic<bool> broken_{false};
  std::string reason_;
};

}  // namespace cz::dist
