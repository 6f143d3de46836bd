// The CPU side of optimizer offload: one thread that runs host jobs (copying reduced gradient chunks to host
// memory, the CPU optimizer) in submission order while the main thread goes on with backward (Note [CPU
// offload] in offload.cpp).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "tensor/stream.h"

namespace cz::zero {

class HostWorker {
 public:
  // CUDA: device copies the jobs make run on a stream of the worker's own (non-blocking).
  explicit HostWorker(Device device);
  ~HostWorker();  // drains; never throws
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  void submit(std::function<void()> job);
  // Blocks until every job submitted so far has run; rethrows the first failure (later jobs are dropped).
  void drain();
  Stream stream() const { return stream_; }

 private:
  void loop();

  Stream stream_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace cz::zero
