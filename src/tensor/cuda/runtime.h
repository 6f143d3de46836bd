// The seam between backend-neutral code and the CUDA runtime. With the CUDA backend built these call the CUDA
// runtime (cuda/runtime.cpp); without it they throw a DeviceError saying so (no_cuda.cpp), so a CPU-only
// build reports "built without CUDA" instead of failing to link or crashing.
#pragma once

#include <cstddef>

#include "tensor/allocator.h"
#include "tensor/stream.h"

namespace cz::cuda_runtime {

bool built();
int device_count();  // 0 when not built or no GPU is visible
void set_device(int index);
Allocator& device_allocator(int index);
Allocator& pinned_allocator();

void* stream_create(int device);  // a non-blocking stream
void stream_destroy(void* stream);
void stream_synchronize(Stream stream);
void* event_create(int device);
void event_destroy(void* event);
void event_record(void* event, Stream stream);
void event_wait(void* event, Stream stream);
bool event_query(void* event);
void event_synchronize(void* event);
float event_elapsed_ms(void* start, void* end);

// CUDA graphs (Note [CUDA graphs for the step] in dist/train/graph_plan.h). begin_capture starts recording
// the work this thread queues on `stream` (a stream of stream_create, never the legacy default one) and puts
// the device's caching allocator in capture mode (Note [Allocations during capture]); end_capture stops both
// and returns the instantiated graph, which graph_launch replays on a stream. graph_release_blocks: once
// every graph captured on `device` is destroyed and the device synchronised, the blocks kept for them are
// reusable.
void graph_begin_capture(Stream stream);
void* graph_end_capture(Stream stream);
void graph_launch(void* graph, Stream stream);
void graph_destroy(void* graph);  // never throws
void graph_release_blocks(int device);
// The bytes of the largest cuDNN workspace a stream of `device` holds (DeviceContext::cudnn_workspace), for
// the closing summary beside the plan's (Note [The cuDNN workspace in the plan]); 0 when none or not built.
size_t cudnn_workspace_bytes(int device);

enum class CopyKind { host_to_device, device_to_host, device_to_device };
// Asynchronous on `stream`; when host memory is pageable the runtime makes it synchronous w.r.t. the host.
void memcpy_async(void* dst, const void* src, size_t nbytes, CopyKind kind, Stream stream);

}  // namespace cz::cuda_runtime
