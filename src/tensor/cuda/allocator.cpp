// The CUDA caching allocators (device and pinned host) behind Note [Cross-stream frees].
#include "tensor/cuda/allocator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/block_pool.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/status.h"
#include "tensor/tensor.h"

namespace cz::cuda {

// Note [Cross-stream frees]
// A freed block may still be read or written by kernels the host has queued but the GPU has not run yet, so
// "free" cannot mean "reusable now". The rule:
//  * Every device block has a home stream: the stream it was allocated for (the device's current stream at
//    Allocator::allocate, or the stream passed to cuda::allocate). Free device blocks are pooled per
//    (home stream, size class) and handed only to later allocations for that same stream. Work queued by the
//    new owner on the home stream runs after everything queued there before, including the old owner's last
//    use, so reuse needs no synchronisation at all.
//  * Work on any other stream must be declared with record_stream(ptr, stream). When such a block is freed,
//    the allocator records an event on each declared stream (at the point of the free) and parks the block in
//    `pending_`. It returns to its home pool only once every one of those events has completed; completion is
//    polled without blocking at each allocation, and waited for only by empty_cache() and the out-of-memory
//    path. Nothing ever blocks the host on the normal path.
//  * Pinned host blocks have no home stream: the host writes into a fresh block immediately, ordered after
//    nothing on the GPU. So every stream that reads or writes a pinned block asynchronously must be recorded,
//    and the block is reused only after all of those events completed. (Tensor::copy_ records the pinned
//    staging block of a host-to-device copy on its stream; device-to-host copies synchronise.) How pinned
//    blocks are sized and matched to requests: Note [Pinned blocks] in block_pool.h.
//  * A stream used without record_stream is a bug of the caller, as with any caching allocator: the block can
//    be handed out while that stream still uses it.
// The bookkeeping lives in BlockPool (block_pool.h), parameterised by the CUDA calls (CudaBackend below), so
// tests/tensor/test_block_pool.cpp checks these rules on a CPU with fake streams and events.
namespace {

std::string bytes_str(int64_t b) {
  const double v = double(b);
  if (v >= double(1 << 30)) return fmt::format("{:.2f} GiB", v / double(1 << 30));
  if (v >= double(1 << 20)) return fmt::format("{:.2f} MiB", v / double(1 << 20));
  if (v >= 1024.0) return fmt::format("{:.2f} KiB", v / 1024.0);
  return fmt::format("{} B", b);
}

// Release-path failures cannot throw (DataPtr's destructor calls release). During process teardown the CUDA
// runtime is already unloading and every call fails; those blocks are simply dropped.
void warn_release_failure(const std::exception& e) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr, "%sCUDA allocator: a freed block could not be made reusable and was dropped: %s\n",
                 log_prefix().c_str(), e.what());
  });
}

// The CUDA side of a BlockPool: events (pooled per device, without timing), cudaMalloc / cudaHostAlloc.
class CudaBackend {
 public:
  struct Event {
    cudaEvent_t ev;
    int device;
  };

  CudaBackend(bool pinned, int device) : pinned_(pinned), device_(device) {}

  Event record(const Stream& s) {
    const int dev = s.device.index;
    auto& pool = events_[dev];
    Event e{nullptr, dev};
    if (!pool.empty()) {
      e.ev = pool.back();
      pool.pop_back();
    }
    try {
      DeviceGuard guard(dev);
      if (!e.ev) CZ_CHECK_STATUS(cudaEventCreateWithFlags(&e.ev, cudaEventDisableTiming));
      CZ_CHECK_STATUS(cudaEventRecord(e.ev, native(s)));
    } catch (...) {
      if (e.ev) pool.push_back(e.ev);
      throw;
    }
    return e;
  }

  bool query(const Event& e) {
    const cudaError_t st = cudaEventQuery(e.ev);
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it so later checks do not see it
      return false;
    }
    CZ_CHECK_STATUS(st);
    return true;
  }

  void synchronize(const Event& e) { CZ_CHECK_STATUS(cudaEventSynchronize(e.ev)); }

  void recycle(const Event& e) { events_[e.device].push_back(e.ev); }

  void* system_alloc(size_t cls) {
    void* p = nullptr;
    cudaError_t st;
    if (!pinned_) {
      DeviceGuard guard(device_);
      st = cudaMalloc(&p, cls);
    } else {
      // Portable: usable from every device. Allocated with the calling thread's current device (see
      // adopt_default_device in CachingAllocator).
      st = cudaHostAlloc(&p, cls, cudaHostAllocPortable);
    }
    if (st == cudaSuccess) return p;
    if (st != cudaErrorMemoryAllocation) CZ_CHECK_STATUS(st);
    (void)cudaGetLastError();  // an allocation failure is not sticky; clear it before retrying or reporting
    return nullptr;
  }

  void system_free(void* p) {
    if (!pinned_) {
      DeviceGuard guard(device_);
      CZ_CHECK_STATUS(cudaFree(p));
    } else {
      CZ_CHECK_STATUS(cudaFreeHost(p));
    }
  }

  [[noreturn]] void out_of_memory(size_t cls, size_t requested, const MemoryStats& stats,
                                  int64_t kept_for_graphs) {
    std::string device_line;
    if (!pinned_) {
      size_t free_b = 0, total_b = 0;
      DeviceGuard guard(device_);
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        device_line = fmt::format("; the device has {} free of {}", bytes_str(int64_t(free_b)),
                                  bytes_str(int64_t(total_b)));
      else
        (void)cudaGetLastError();
    }
    // Note [Graph pools outlive memory pressure]: what live CUDA graphs address stays reserved.
    const std::string graphs_line =
        kept_for_graphs > 0
            ? fmt::format(", of which {} cached for live CUDA graphs (kept until they are destroyed)",
                          bytes_str(kept_for_graphs))
            : std::string();
    throw OutOfMemoryError(fmt::format(
        "{}CUDA out of memory: {} allocator could not get {} (requested {}) even after returning its cache "
        "to the driver. Held by live tensors: {} (peak {}); reserved: {} (peak {}){}{}",
        log_prefix(), pinned_ ? "pinned host" : Device::cuda(device_).str(), bytes_str(int64_t(cls)),
        bytes_str(int64_t(requested)), bytes_str(stats.allocated_bytes),
        bytes_str(stats.peak_allocated_bytes), bytes_str(stats.reserved_bytes),
        bytes_str(stats.peak_reserved_bytes), graphs_line, device_line));
  }

  void warn_release_failure(const std::exception& e) noexcept { cuda::warn_release_failure(e); }

 private:
  const bool pinned_;
  const int device_;                                          // the GPU; unused for pinned memory
  std::unordered_map<int, std::vector<cudaEvent_t>> events_;  // completed events for reuse, by device
};

class CachingAllocator final : public Allocator {
 public:
  enum class Kind { device, pinned };

  CachingAllocator(Kind kind, int device)
      : kind_(kind),
        device_(device),
        pool_(CudaBackend(kind == Kind::pinned, device), kind == Kind::device,
              kind == Kind::device ? Device::cuda(device).str() : "pinned") {}

  DataPtr allocate(size_t nbytes) override {
    return allocate_for(nbytes, kind_ == Kind::device ? current_stream(device()) : Stream{});
  }

  DataPtr allocate_for(size_t nbytes, Stream stream) {
    if (kind_ == Kind::device)
      CZ_ASSERT(stream.device == device(), "allocation for a stream on {} from the {} allocator",
                stream.device.str(), device().str());
    adopt_default_device();  // pinned memory and event queries use the current device
    return DataPtr(pool_.allocate(nbytes, stream), nbytes, this);
  }

  Device device() const override { return kind_ == Kind::device ? Device::cuda(device_) : Device::cpu(); }
  MemoryStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }

  void empty_cache() override {
    adopt_default_device();
    pool_.empty_cache();
  }

  void begin_capture(Stream stream) { pool_.begin_capture(stream); }
  void end_capture() { pool_.end_capture(); }
  void release_graph_blocks() { pool_.release_graph_blocks(); }

  void record_stream(void* ptr, Stream stream) override {
    if (!ptr) return;
    CZ_CHECK_DEVICE(stream.device.is_cuda(), "record_stream: {} is not a CUDA stream", stream.device.str());
    if (kind_ == Kind::device)
      CZ_CHECK_DEVICE(stream.device == device(), "record_stream: block on {} used on a stream of {}",
                      device().str(), stream.device.str());
    pool_.record_stream(ptr, stream);
  }

 protected:
  void release(void* ptr, size_t) noexcept override {
    try {
      adopt_default_device();
    } catch (const std::exception& e) {
      warn_release_failure(e);
      return;
    }
    pool_.release(ptr);
  }

 private:
  const Kind kind_;
  const int device_;
  BlockPool<CudaBackend> pool_;
};

constexpr int kMaxDevices = 16;

CachingAllocator& device_caching_allocator(int device) {
  const int n = cuda_device_count();
  CZ_CHECK_DEVICE(device >= 0 && device < n && device < kMaxDevices,
                  "cuda:{} is not available ({} CUDA device{} visible)", device, n, n == 1 ? "" : "s");
  // Never destroyed: tensors held by static objects may be freed after any destruction order we could pick.
  static std::array<std::atomic<CachingAllocator*>, kMaxDevices> allocators{};
  static std::mutex mu;
  CachingAllocator* a = allocators[size_t(device)].load(std::memory_order_acquire);
  if (a) return *a;
  std::lock_guard<std::mutex> lock(mu);
  a = allocators[size_t(device)].load(std::memory_order_relaxed);
  if (!a) {
    a = new CachingAllocator(CachingAllocator::Kind::device, device);
    allocators[size_t(device)].store(a, std::memory_order_release);
  }
  return *a;
}

}  // namespace

Allocator& device_allocator(int device) {
  return device_caching_allocator(device);
}

Allocator& pinned_allocator() {
  CZ_CHECK_DEVICE(cuda_available(), "pinned host memory needs a visible CUDA device");
  static auto* pinned = new CachingAllocator(CachingAllocator::Kind::pinned, 0);
  return *pinned;
}

DataPtr allocate(size_t nbytes, Stream stream) {
  CZ_CHECK_DEVICE(stream.device.is_cuda(), "cuda::allocate: {} is not a CUDA stream", stream.device.str());
  return device_caching_allocator(stream.device.index).allocate_for(nbytes, stream);
}

void begin_capture(Stream stream) {
  device_caching_allocator(stream.device.index).begin_capture(stream);
}
void end_capture(Stream stream) {
  device_caching_allocator(stream.device.index).end_capture();
}
void release_graph_blocks(int device) {
  device_caching_allocator(device).release_graph_blocks();
}

void record_stream(const Tensor& t, Stream stream) {
  if (!t.defined() || !t.storage()) return;
  Allocator* a = t.storage()->allocator();
  if (a) a->record_stream(t.storage()->data(), stream);
}

}  // namespace cz::cuda
