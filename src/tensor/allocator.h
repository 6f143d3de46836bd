// Caching allocators, one per device, with the memory statistics that ZeRO's savings are measured by.
// Note [Allocator statistics]: `allocated` counts bytes handed to live tensors (rounded to the allocator's
// size class, i.e. what is really held for them); `reserved` adds the bytes cached for reuse. Both have a
// peak that reset_peak() sets back to the current value. The CPU allocator keeps the same figures as the CUDA
// one so that memory savings show on a CPU-only machine.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensor/device.h"
#include "tensor/stream.h"

namespace cz {

struct MemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;  // requests served
  int64_t num_frees = 0;
  int64_t num_system_allocs = 0;  // requests the cache could not serve
};

class Allocator;

// Note [Allocator event log]: an observer sees every request an allocator serves and every block returned to
// it, in the order the allocator serves them, with the bytes asked for. It is called under the allocator's
// lock, from whichever thread allocates or frees, so it must not allocate through the same allocator, and
// it may still be running on another thread just after set_observer(nullptr) returns. The planner's op-by-op
// test (tests/dist/plan/test_step_events.cpp) holds the planner's replay of a step to this log of the real
// step. With no observer set the allocator pays one relaxed atomic load per request. The CPU caching
// allocators report to it; the CUDA one does not (yet).
class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual void allocated(const void* ptr, size_t nbytes) = 0;
  virtual void released(const void* ptr, size_t nbytes) = 0;
};

// Owning pointer to bytes from an Allocator; returns them to it on destruction.
class DataPtr {
 public:
  DataPtr() = default;
  DataPtr(void* ptr, size_t nbytes, Allocator* owner) : ptr_(ptr), nbytes_(nbytes), owner_(owner) {}
  DataPtr(DataPtr&& o) noexcept { swap(o); }
  DataPtr& operator=(DataPtr&& o) noexcept {
    DataPtr tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~DataPtr();
  void* get() const { return ptr_; }
  size_t nbytes() const { return nbytes_; }
  Allocator* owner() const { return owner_; }

 private:
  void swap(DataPtr& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(nbytes_, o.nbytes_);
    std::swap(owner_, o.owner_);
  }
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
  Allocator* owner_ = nullptr;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DataPtr allocate(size_t nbytes) = 0;
  virtual Device device() const = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() = 0;  // returns cached, unused blocks to the system
  // Marks `ptr` as used on `stream`, so it is not handed out again before work queued there has finished
  // (Note [Cross-stream frees] in the CUDA allocator). A no-op on the CPU, where work runs in program order.
  virtual void record_stream(void* ptr, Stream stream) {}
  // Note [Allocator event log]; nullptr stops it. The caller keeps the observer alive until then.
  void set_observer(AllocatorObserver* o) { observer_.store(o, std::memory_order_relaxed); }

 protected:
  friend class DataPtr;
  virtual void release(void* ptr, size_t nbytes) = 0;
  AllocatorObserver* observer() const { return observer_.load(std::memory_order_relaxed); }

 private:
  std::atomic<AllocatorObserver*> observer_{nullptr};
};

Allocator& allocator_for(Device device);
// Host memory for staging device transfers: page-locked when the CUDA backend is built and a GPU is present,
// plain aligned host memory otherwise. Statistics are kept separately from the CPU allocator's.
Allocator& pinned_host_allocator();

// Size-class rounding shared by the caching allocators: small requests round to 64 B, larger ones to one of
// eight steps per power of two (at most 12.5% waste), above 1 MiB one of 64 (at most 1.6%), so freed blocks
// are found again by exact class.
size_t round_to_size_class(size_t nbytes);
// The pinned host pool's classes (Note [Pinned blocks] in cuda/block_pool.h): as round_to_size_class up to
// 1 MiB, and eight steps per power of two above it too (at most 12.5% waste), so that requests whose size
// changes with every batch share a few classes.
size_t round_to_pinned_class(size_t nbytes);

// Note [Freed heap memory stays mapped]: the caching allocators keep our own blocks, but the libraries under
// the kernels take theirs from malloc on every call (oneDNN's sgemm packs the weight into a fresh buffer for
// each GEMM: 9.4 MB at ConvNeXt-T's last stage). glibc returns such a buffer to the kernel when it is freed
// (munmap above its mmap threshold, or a trim of the heap's top), so the next call faults every page in
// again. Where faults are dear, as on this project's 2-core KVM Xeon, that is a large cost: ConvNeXt-T's
// last stage ran fc2's input-gradient GEMM in 30-185 ms on the main thread against 11-12 ms on the other, in
// the kernel's clear_page under oneDNN's code, and the f32 step took 1.16-1.34x as long. So the CPU backend
// sets glibc's mmap threshold to its largest value, 32 MiB (which also stops glibc moving it), and its trim
// threshold to -1 (never trim): freed memory below 32 MiB stays mapped and is handed out again. Larger
// requests are still mapped per call (a ConvNeXt-L/XL weight's pack). The resident peak stays near the peak
// of what is live at once (glibc's fragmentation aside). Set by the first use of the CPU allocator, before
// any kernel runs; a user who sets MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or glibc.malloc tunables
// keeps their own.
inline constexpr size_t kHeapMmapThreshold = size_t(32) << 20;
struct HeapPolicy {
  bool applied = false;
  std::string reason;  // why not, when not applied
};
// The rule above from the environment (`env` is the lookup, so that tests can hand it one).
HeapPolicy decide_heap_policy(const char* (*env)(const char*));
// What the process got (the CPU allocator applies it on first use).
const HeapPolicy& heap_policy();
// For a run's header: what the process got, and how to override it.
std::string heap_policy_note();

}  // namespace cz
