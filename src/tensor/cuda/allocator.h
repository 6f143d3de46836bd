// The CUDA caching allocators: device memory (one per GPU, cudaMalloc) and page-locked host memory
// (cudaHostAlloc), with the MemoryStats of Note [Allocator statistics] and the stream rules of
// Note [Cross-stream frees] (allocator.cpp).
#pragma once

#include <cstddef>

#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/stream.h"

namespace cz {
class Tensor;
}

namespace cz::cuda {

// cudaMalloc failed even after the cache was returned to the driver. The message carries the request and the
// allocator's statistics.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

Allocator& device_allocator(int device);  // DeviceError for a device that is not visible
Allocator& pinned_allocator();

// Device bytes for work queued on `stream` (on stream.device). Allocator::allocate() is the same with the
// device's current stream; kernels use this for temporaries, so the block goes back to the pool of the
// stream the kernel ran on.
DataPtr allocate(size_t nbytes, Stream stream);

// Declares that `t`'s storage is used by work on `stream` besides the stream it was allocated for, so that
// when freed it is not handed out again before that work has finished. Works for CUDA tensors and for CPU
// tensors in pinned memory (async copies); a no-op for other CPU tensors.
void record_stream(const Tensor& t, Stream stream);

// Note [Allocations during capture] (block_pool.h), for the device allocator of `stream`'s device.
void begin_capture(Stream stream);
void end_capture(Stream stream);
void release_graph_blocks(int device);

}  // namespace cz::cuda
