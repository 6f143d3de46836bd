// The CUDA runtime behind the seam in runtime.h: device discovery, streams, events and async copies.
#include "tensor/cuda/runtime.h"

#include <cstdio>
#include <mutex>

#include "tensor/cuda/allocator.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/status.h"

namespace cz::cuda_runtime {
namespace {
cudaEvent_t ev(void* e) {
  return static_cast<cudaEvent_t>(e);
}
}  // namespace

bool built() {
  return true;
}

int device_count() {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st == cudaSuccess) return n;
  (void)cudaGetLastError();
  // No GPU or no driver is the normal state of a CPU machine; anything else (a driver that does not match the
  // toolkit, a broken install) also leaves us without a GPU, but deserves a line on stderr so it is noticed.
  if (st != cudaErrorNoDevice && st != cudaErrorInsufficientDriver) {
    std::fprintf(stderr, "%sCUDA: no usable device: %s (%s)\n", log_prefix().c_str(), cudaGetErrorName(st),
                 cudaGetErrorString(st));
  }
  return 0;
}

void set_device(int index) {
  const int n = cuda_device_count();
  CZ_CHECK_DEVICE(index >= 0 && index < n, "set_device: cuda:{} is not available ({} visible)", index, n);
  cuda::set_device(index);
}

Allocator& device_allocator(int index) {
  return cuda::device_allocator(index);
}

Allocator& pinned_allocator() {
  return cuda::pinned_allocator();
}

void* stream_create(int device) {
  cuda::DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  CZ_CHECK_STATUS(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(void* stream) {
  if (stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));  // from destructors: never throws
}

void stream_synchronize(Stream stream) {
  cuda::DeviceGuard guard(stream.device.index);  // the legacy default stream means the current device's
  CZ_CHECK_STATUS(cudaStreamSynchronize(cuda::native(stream)));
}

void* event_create(int device) {
  cuda::DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  CZ_CHECK_STATUS(cudaEventCreate(&e));  // with timing: Event::elapsed_ms needs it
  return e;
}

void event_destroy(void* event) {
  if (event) (void)cudaEventDestroy(ev(event));  // from destructors: never throws
}

void event_record(void* event, Stream stream) {
  cuda::DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(cudaEventRecord(ev(event), cuda::native(stream)));
}

void event_wait(void* event, Stream stream) {
  cuda::DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(cudaStreamWaitEvent(cuda::native(stream), ev(event), 0));
}

bool event_query(void* event) {
  cuda::adopt_default_device();
  const cudaError_t st = cudaEventQuery(ev(event));
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  CZ_CHECK_STATUS(st);
  return true;
}

void event_synchronize(void* event) {
  cuda::adopt_default_device();
  CZ_CHECK_STATUS(cudaEventSynchronize(ev(event)));
}

float event_elapsed_ms(void* start, void* end) {
  cuda::adopt_default_device();
  float ms = 0;
  CZ_CHECK_STATUS(cudaEventElapsedTime(&ms, ev(start), ev(end)));
  return ms;
}

void graph_begin_capture(Stream stream) {
  CZ_CHECK_DEVICE(stream.device.is_cuda() && stream.handle,
                  "CUDA graph capture needs a stream of its own, not the legacy default stream");
  cuda::DeviceGuard guard(stream.device.index);
  cuda::begin_capture(stream);
  // Relaxed: the caching allocator may still cudaMalloc a block the warm-up did not leave in the pool.
  const cudaError_t st = cudaStreamBeginCapture(cuda::native(stream), cudaStreamCaptureModeRelaxed);
  if (st != cudaSuccess) cuda::end_capture(stream);
  CZ_CHECK_STATUS(st);
}

void* graph_end_capture(Stream stream) {
  cuda::DeviceGuard guard(stream.device.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t st = cudaStreamEndCapture(cuda::native(stream), &graph);
  cuda::end_capture(stream);
  CZ_CHECK_STATUS(st);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  CZ_CHECK_STATUS(inst);
  return exec;
}

void graph_launch(void* graph, Stream stream) {
  cuda::DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), cuda::native(stream)));
}

void graph_destroy(void* graph) {
  if (graph) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

void graph_release_blocks(int device) {
  cuda::release_graph_blocks(device);
}

size_t cudnn_workspace_bytes(int device) {
  return cuda::context(device).cudnn_workspace_bytes();
}

void memcpy_async(void* dst, const void* src, size_t nbytes, CopyKind kind, Stream stream) {
  if (nbytes == 0) return;
  CZ_CHECK_DEVICE(stream.device.is_cuda(), "memcpy_async: {} is not a CUDA stream", stream.device.str());
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  cuda::DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(cudaMemcpyAsync(dst, src, nbytes, k, cuda::native(stream)));
}

}  // namespace cz::cuda_runtime
