// What the CUDA seam does in a build without the CUDA backend: report that plainly.
#include "tensor/check.h"
#include "tensor/cuda/runtime.h"

namespace cz::cuda_runtime {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw DeviceError(
      fmt::format("{}: this convnext_zero was built without the CUDA backend (reconfigure with a "
                  "CUDA toolkit and -DCZ_WITH_CUDA=ON)",
                  what));
}
}  // namespace

bool built() {
  return false;
}
int device_count() {
  return 0;
}
void set_device(int) {
  no_cuda("set_device");
}
Allocator& device_allocator(int) {
  no_cuda("CUDA allocator");
}
Allocator& pinned_allocator() {
  no_cuda("pinned allocator");
}
void* stream_create(int) {
  no_cuda("stream_create");
}
void stream_destroy(void*) {}
void stream_synchronize(Stream) {
  no_cuda("stream_synchronize");
}
void* event_create(int) {
  no_cuda("event_create");
}
void event_destroy(void*) {}
void event_record(void*, Stream) {
  no_cuda("event_record");
}
void event_wait(void*, Stream) {
  no_cuda("event_wait");
}
bool event_query(void*) {
  no_cuda("event_query");
}
void event_synchronize(void*) {
  no_cuda("event_synchronize");
}
float event_elapsed_ms(void*, void*) {
  no_cuda("event_elapsed_ms");
}
void graph_begin_capture(Stream) {
  no_cuda("CUDA graph capture");
}
void* graph_end_capture(Stream) {
  no_cuda("CUDA graph capture");
}
void graph_launch(void*, Stream) {
  no_cuda("CUDA graph launch");
}
void graph_destroy(void*) {}
void graph_release_blocks(int) {
  no_cuda("CUDA graph");
}
size_t cudnn_workspace_bytes(int) {
  return 0;
}
void memcpy_async(void*, const void*, size_t, CopyKind, Stream) {
  no_cuda("memcpy");
}

}  // namespace cz::cuda_runtime
