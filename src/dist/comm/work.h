// The handle an asynchronous collective returns. On the CPU the collective runs on the communicator's thread
// and wait() blocks until it has finished; on CUDA it runs on the communicator's stream and wait() orders the
// caller's current stream after it without blocking the host (Note [Comm streams] in communicator.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

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

}  // namespace cz::dist
