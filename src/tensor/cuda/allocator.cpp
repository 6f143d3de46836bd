// The CUDA caching allocators (device and pinned host) behind Note [Cross-stream frees].
#include "tensor/cuda/allocator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

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
//    and the block is reused only after all of those events completed. (Tensor::copy_ synchronises its own
//    transfers and needs no record.)
//  * A stream used without record_stream is a bug of the caller, as with any caching allocator: the block can
//    be handed out while that stream still uses it.
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

class CachingAllocator final : public Allocator {
 public:
  enum class Kind { device, pinned };

  CachingAllocator(Kind kind, int device) : kind_(kind), device_(device) {}

  DataPtr allocate(size_t nbytes) override {
    return allocate_for(nbytes, kind_ == Kind::device ? current_stream(device()) : Stream{});
  }

  DataPtr allocate_for(size_t nbytes, Stream stream) {
    if (kind_ == Kind::device)
      CZ_ASSERT(stream.device == device(), "allocation for a stream on {} from the {} allocator",
                stream.device.str(), device().str());
    const size_t cls = round_to_size_class(nbytes);
    void* home = kind_ == Kind::device ? stream.handle : nullptr;
    adopt_default_device();  // pinned memory and event queries use the current device
    std::lock_guard<std::mutex> lock(mu_);
    process_pending(/*wait=*/false);
    void* p = take_cached(home, cls);
    if (!p) {
      p = system_alloc(cls, nbytes);
      stats_.reserved_bytes += int64_t(cls);
      stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
      ++stats_.num_system_allocs;
    }
    live_.emplace(p, Block{cls, home, {}});
    stats_.allocated_bytes += int64_t(cls);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    ++stats_.num_allocs;
    return DataPtr(p, nbytes, this);
  }

  Device device() const override { return kind_ == Kind::device ? Device::cuda(device_) : Device::cpu(); }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

  void empty_cache() override {
    adopt_default_device();
    std::lock_guard<std::mutex> lock(mu_);
    release_cache();
  }

  void record_stream(void* ptr, Stream stream) override {
    if (!ptr) return;
    CZ_CHECK_DEVICE(stream.device.is_cuda(), "record_stream: {} is not a CUDA stream", stream.device.str());
    if (kind_ == Kind::device)
      CZ_CHECK_DEVICE(stream.device == device(), "record_stream: block on {} used on a stream of {}",
                      device().str(), stream.device.str());
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    CZ_CHECK(it != live_.end(), "record_stream: {} is not the start of a live block of the {} allocator", ptr,
             kind_ == Kind::device ? device().str() : "pinned");
    Block& b = it->second;
    if (kind_ == Kind::device && stream.handle == b.home) return;  // ordered on the home stream already
    if (std::find(b.streams.begin(), b.streams.end(), stream) == b.streams.end()) b.streams.push_back(stream);
  }

 protected:
  void release(void* ptr, size_t) noexcept override {
    try {
      adopt_default_device();
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) return;  // not ours: nothing sane to do in a destructor
      Block b = std::move(it->second);
      live_.erase(it);
      stats_.allocated_bytes -= int64_t(b.cls);
      ++stats_.num_frees;
      if (b.streams.empty()) {
        free_[{b.home, b.cls}].push_back(ptr);
        return;
      }
      Pending pending{ptr, b.cls, b.home, {}};
      try {
        for (const Stream& s : b.streams) {
          cudaEvent_t ev = take_event(s.device.index);
          pending.events.emplace_back(ev, s.device.index);  // owned by `pending` even if the record fails
          DeviceGuard guard(s.device.index);
          CZ_CHECK_STATUS(cudaEventRecord(ev, native(s)));
        }
      } catch (const std::exception& e) {
        // Without the events nobody can tell when the other streams are done with the block: drop it (it
        // stays counted in `reserved`, which is the truth: the bytes are still held).
        for (auto& [ev, dev] : pending.events) events_[dev].push_back(ev);
        warn_release_failure(e);
        return;
      }
      pending_.push_back(std::move(pending));
    } catch (const std::exception& e) {
      warn_release_failure(e);
    }
  }

 private:
  struct Block {
    size_t cls;
    void* home;                   // home stream handle (device blocks); nullptr for pinned blocks
    std::vector<Stream> streams;  // other streams recorded with record_stream
  };
  struct Pending {
    void* ptr;
    size_t cls;
    void* home;
    std::vector<std::pair<cudaEvent_t, int>> events;  // (event, its device)
  };
  struct PoolKey {
    void* home;
    size_t cls;
    bool operator==(const PoolKey&) const = default;
  };
  struct PoolKeyHash {
    size_t operator()(const PoolKey& k) const {
      return std::hash<void*>()(k.home) ^ (std::hash<size_t>()(k.cls) * 0x9E3779B97F4A7C15ull);
    }
  };

  void* take_cached(void* home, size_t cls) {
    auto it = free_.find({home, cls});
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }

  // Moves pending blocks whose events have all completed to their pools; with `wait`, waits for all of them.
  void process_pending(bool wait) {
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      bool done = true;
      for (auto& [ev, dev] : p.events) {
        if (wait) {
          CZ_CHECK_STATUS(cudaEventSynchronize(ev));
          continue;
        }
        const cudaError_t st = cudaEventQuery(ev);
        if (st == cudaErrorNotReady) {
          (void)cudaGetLastError();  // not an error: clear it so later checks do not see it
          done = false;
          break;
        }
        CZ_CHECK_STATUS(st);
      }
      if (!done) {
        ++i;
        continue;
      }
      for (auto& [ev, dev] : p.events) events_[dev].push_back(ev);
      free_[{p.home, p.cls}].push_back(p.ptr);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  // Waits for pending blocks, then returns every cached block to the system. Caller holds mu_.
  void release_cache() {
    process_pending(/*wait=*/true);
    for (auto& [key, blocks] : free_) {
      for (void* p : blocks) system_free(p);
      stats_.reserved_bytes -= int64_t(key.cls * blocks.size());
      blocks.clear();
    }
    free_.clear();
  }

  cudaEvent_t take_event(int dev) {
    auto& pool = events_[dev];
    if (!pool.empty()) {
      cudaEvent_t ev = pool.back();
      pool.pop_back();
      return ev;
    }
    DeviceGuard guard(dev);
    cudaEvent_t ev = nullptr;
    CZ_CHECK_STATUS(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return ev;
  }

  void* system_alloc(size_t cls, size_t requested) {
    for (int attempt = 0;; ++attempt) {
      void* p = nullptr;
      cudaError_t st;
      if (kind_ == Kind::device) {
        DeviceGuard guard(device_);
        st = cudaMalloc(&p, cls);
      } else {
        // Portable: usable from every device. Allocated with the calling thread's current device (see
        // adopt_default_device in allocate_for).
        st = cudaHostAlloc(&p, cls, cudaHostAllocPortable);
      }
      if (st == cudaSuccess) return p;
      if (st != cudaErrorMemoryAllocation) CZ_CHECK_STATUS(st);
      (void)cudaGetLastError();  // an allocation failure is not sticky; clear it before retrying or reporting
      if (attempt == 0) {
        release_cache();
        continue;
      }
      throw OutOfMemoryError(oom_message(cls, requested));
    }
  }

  std::string oom_message(size_t cls, size_t requested) const {
    std::string device_line;
    if (kind_ == Kind::device) {
      size_t free_b = 0, total_b = 0;
      DeviceGuard guard(device_);
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        device_line = fmt::format("; the device has {} free of {}", bytes_str(int64_t(free_b)),
                                  bytes_str(int64_t(total_b)));
      else
        (void)cudaGetLastError();
    }
    return fmt::format(
        "{}CUDA out of memory: {} allocator could not get {} (requested {}) even after returning its cache "
        "to "
        "the driver. Held by live tensors: {} (peak {}); reserved: {} (peak {}){}",
        log_prefix(), kind_ == Kind::device ? device().str() : "pinned host", bytes_str(int64_t(cls)),
        bytes_str(int64_t(requested)), bytes_str(stats_.allocated_bytes),
        bytes_str(stats_.peak_allocated_bytes), bytes_str(stats_.reserved_bytes),
        bytes_str(stats_.peak_reserved_bytes), device_line);
  }

  void system_free(void* p) {
    if (kind_ == Kind::device) {
      DeviceGuard guard(device_);
      CZ_CHECK_STATUS(cudaFree(p));
    } else {
      CZ_CHECK_STATUS(cudaFreeHost(p));
    }
  }

  const Kind kind_;
  const int device_;  // the GPU; unused for pinned memory
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<PoolKey, std::vector<void*>, PoolKeyHash> free_;
  std::vector<Pending> pending_;
  std::unordered_map<int, std::vector<cudaEvent_t>> events_;  // completed events for reuse, by device
  MemoryStats stats_;
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

void record_stream(const Tensor& t, Stream stream) {
  if (!t.defined() || !t.storage()) return;
  Allocator* a = t.storage()->allocator();
  if (a) a->record_stream(t.storage()->data(), stream);
}

}  // namespace cz::cuda
