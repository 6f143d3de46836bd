// Streams and events: CPU work runs in program order, so CPU streams and events are trivial; CUDA ones go
// through the runtime seam.
#include "tensor/stream.h"

#include <array>
#include <chrono>

#include "tensor/check.h"
#include "tensor/cuda/runtime.h"

namespace cz {
namespace {
constexpr int kMaxDevices = 16;
thread_local std::array<void*, kMaxDevices> tls_current_stream{};
}  // namespace

void Stream::synchronize() const {
  if (device.is_cuda()) cuda_runtime::stream_synchronize(*this);
}

Event::Event(Device device) : device_(device) {
  if (device.is_cuda()) handle_ = cuda_runtime::event_create(device.index);
}
Event::~Event() {
  if (handle_) cuda_runtime::event_destroy(handle_);
}
void Event::record(Stream stream) {
  CZ_CHECK_DEVICE(stream.device == device_, "Event::record: event on {} but stream on {}", device_.str(),
                  stream.device.str());
  if (handle_) cuda_runtime::event_record(handle_, stream);
}
void Event::wait(Stream stream) const {
  if (handle_ && stream.device.is_cuda())
    cuda_runtime::event_wait(handle_, stream);
  else if (handle_)
    synchronize();  // a CPU stream waiting on GPU work: the host must wait
}
bool Event::query() const {
  return handle_ ? cuda_runtime::event_query(handle_) : true;
}
void Event::synchronize() const {
  if (handle_) cuda_runtime::event_synchronize(handle_);
}
float Event::elapsed_ms(const Event& end) const {
  CZ_CHECK_DEVICE(handle_ && end.handle_, "Event::elapsed_ms needs CUDA events; time CPU work with a clock");
  return cuda_runtime::event_elapsed_ms(handle_, end.handle_);
}

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream::cpu();
  CZ_CHECK_DEVICE(device.index >= 0 && device.index < kMaxDevices, "device index {} out of range",
                  device.index);
  return Stream{device, tls_current_stream[size_t(device.index)]};
}

void set_current_stream(Stream stream) {
  if (stream.device.is_cpu()) return;
  CZ_CHECK_DEVICE(stream.device.index >= 0 && stream.device.index < kMaxDevices,
                  "device index {} out of range", stream.device.index);
  tls_current_stream[size_t(stream.device.index)] = stream.handle;
}

bool cuda_available() {
  return cuda_device_count() > 0;
}
int cuda_device_count() {
  static const int n = cuda_runtime::built() ? cuda_runtime::device_count() : 0;
  return n;
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos && idx.size() < 4)
      return Device::cuda(std::stoi(idx));
  }
  throw ValueError(fmt::format("unknown device '{}' (expected cpu, cuda or cuda:N)", s));
}

}  // namespace cz
