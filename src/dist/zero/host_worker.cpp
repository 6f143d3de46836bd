// The offload worker thread.
#include "dist/zero/host_worker.h"

#include <omp.h>

#include "tensor/cuda/runtime.h"
#include "tensor/parallel.h"
#include "tensor/trace.h"

namespace cz::zero {

HostWorker::HostWorker(Device device) : stream_{device, nullptr} {
  if (device.is_cuda()) stream_.handle = cuda_runtime::stream_create(device.index);
  thread_ = std::thread([this] { loop(); });
}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (stream_.handle) cuda_runtime::stream_destroy(stream_.handle);
}

void HostWorker::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void HostWorker::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return (jobs_.empty() && !running_) || error_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    jobs_.clear();
    idle_cv_.wait(lock, [this] { return !running_; });
    std::rethrow_exception(e);
  }
}

void HostWorker::loop() {
  // OpenMP's thread count is per thread: this one must use the rank's share of the cores too (Note [CPU
  // threads per rank]), not the machine's, or its parallel regions oversubscribe the cores the ranks' compute
  // runs on.
  omp_set_num_threads(cpu_threads());
  trace::set_thread_lane("offload worker");  // --trace: its jobs and their ops (Note [Trace lanes])
  if (stream_.device.is_cuda()) {
    cuda_runtime::set_device(stream_.device.index);
    set_current_stream(stream_);
  }
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
    }
    std::exception_ptr failed;
    try {
      const trace::Span span("offload job", "optimizer");
      job();
    } catch (...) {
      failed = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      if (failed && !error_) error_ = failed;
      if (error_) jobs_.clear();
    }
    idle_cv_.notify_all();
  }
}

}  // namespace cz::zero
