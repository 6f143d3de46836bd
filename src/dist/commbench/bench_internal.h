// What commbench's modes share: a buffer with a host mirror, the deadline per size (--timeout), and the GPU
// peer-copy matrix and check (commbench_p2p_cuda.cpp).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm/communicator.h"

#include "tensor/allocator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device.h"
#include "tensor/stream.h"

namespace cz::dist {

// A buffer on the benchmark's device, with a host mirror for filling and checking.
class BenchBuffer {
 public:
  BenchBuffer(Device device, size_t bytes) : device_(device), bytes_(bytes), host_(bytes) {
    data_ = allocator_for(device).allocate(std::max<size_t>(bytes, 64));
  }
  void* data() const { return data_.get(); }
  char* host() { return host_.data(); }
  void upload() {
    if (device_.is_cpu()) {
      std::memcpy(data_.get(), host_.data(), bytes_);
    } else if (bytes_) {
      Stream s = current_stream(device_);
      cuda_runtime::memcpy_async(data_.get(), host_.data(), bytes_, cuda_runtime::CopyKind::host_to_device,
                                 s);
      s.synchronize();
    }
  }
  void download() {
    if (device_.is_cpu()) {
      std::memcpy(host_.data(), data_.get(), bytes_);
    } else if (bytes_) {
      Stream s = current_stream(device_);
      cuda_runtime::memcpy_async(host_.data(), data_.get(), bytes_, cuda_runtime::CopyKind::device_to_host,
                                 s);
      s.synchronize();
    }
  }

 private:
  Device device_;
  size_t bytes_;
  std::vector<char> host_;
  DataPtr data_;
};

// --timeout: while alive, a thread that aborts the communicators once `seconds` pass, as nccl-tests' -T ends
// a test that runs too long. The aborted communicators fail the size's waits with a CommError, which the
// size's loop turns into the message naming the size.
class SizeDeadline {
 public:
  SizeDeadline(double seconds, std::vector<Communicator*> comms) {
    if (seconds <= 0) return;
    thread_ = std::thread([this, seconds, comms = std::move(comms)] {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done_; })) return;
      fired_ = true;
      for (Communicator* c : comms) c->abort();
    });
  }
  ~SizeDeadline() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool fired() {
    std::lock_guard lock(mu_);
    return fired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false, fired_ = false;
  std::thread thread_;
};

// An n x n matrix of figures between ordered pairs (row: from, column: to; the diagonal has none): as a table
// under a "from\to" header, each column `width` wide, and as JSON rows with null on the diagonal.
void print_matrix(std::ostream& out, const std::vector<double>& m, int n, int width);
nlohmann::ordered_json matrix_json(const std::vector<double>& m, int n);

// p2pBandwidthLatencyTest's matrices over the GPUs this process sees, without and with peer access:
// {"devices": [...], "bandwidth_GBps": {"peer_off": [[...]], "peer_on": [[...]]}, "latency_us": {...}}, or
// null without CUDA or with fewer than 2 GPUs (`note` says which). Prints the matrices on `out` when given.
nlohmann::ordered_json cuda_peer_matrix(int64_t bytes, int iters, std::ostream* out, std::string* note);
// Known patterns copied between every ordered pair of the GPUs this process sees, with and without peer
// access; one line per pair whose copy came back wrong ("GPU 0 -> GPU 1 (peer access on): ..."). Empty
// when all were right or there is nothing to check (`note` says why).
std::vector<std::string> cuda_peer_check(int64_t bytes, std::string* note);

}  // namespace cz::dist
