// Explicit streams. A Stream names an ordered queue of work on a device: on CUDA a cudaStream_t, on the CPU
// the calling thread (CPU kernels run in program order, so a CPU stream has no handle). Kernel launchers take
// one; nothing waits on the host unless asked (Stream::synchronize, Event::synchronize).
#pragma once

#include <memory>

#include "tensor/device.h"

namespace cz {

struct Stream {
  Device device;
  void* handle = nullptr;  // cudaStream_t on CUDA; nullptr is the legacy default stream there

  static Stream cpu() { return {Device::cpu(), nullptr}; }
  bool operator==(const Stream&) const = default;
  void synchronize() const;
};

// A marker in a stream's queue: record() it on one stream, wait() for it from another. Cheap on the CPU.
class Event {
 public:
  explicit Event(Device device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream stream);
  void wait(Stream stream) const;  // work queued on `stream` after this waits for the recorded point
  bool query() const;              // has the recorded work finished
  void synchronize() const;        // blocks the host until it has
  float elapsed_ms(const Event& end) const;  // CUDA timing; throws on the CPU
  void* handle() const { return handle_; }

 private:
  Device device_;
  void* handle_ = nullptr;
};

// The stream new work on `device` is queued on by ops (per thread; the default stream until set).
Stream current_stream(Device device);
void set_current_stream(Stream stream);

// Makes `stream` current for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream) : prev_(current_stream(stream.device)) { set_current_stream(stream); }
  ~StreamGuard() { set_current_stream(prev_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

}  // namespace cz
