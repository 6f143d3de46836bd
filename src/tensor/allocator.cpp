// The CPU caching allocator (also the pinned-host allocator when there is no GPU) and allocator lookup.
#include "tensor/allocator.h"

#include <malloc.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "tensor/check.h"
#include "tensor/cuda/runtime.h"

namespace cz {

DataPtr::~DataPtr() {
  if (ptr_ && owner_) owner_->release(ptr_, nbytes_);
}

size_t round_to_size_class(size_t nbytes) {
  constexpr size_t kSmall = 4096;
  if (nbytes == 0) return 64;
  if (nbytes <= kSmall) return (nbytes + 63) & ~size_t(63);
  const size_t pow2 = std::bit_ceil(nbytes);
  // Eight classes between pow2/2 and pow2 (at most 12.5% waste); 64 above 1 MiB (at most 1.6%), where the
  // model states and activations live and an eighth of them is real memory (ZeRO's savings are measured by
  // these figures). Training asks for the same sizes every step, so finer classes cost no cache hits.
  const size_t step = nbytes > (size_t(1) << 20) ? pow2 / 128 : pow2 / 16;
  return (nbytes + step - 1) / step * step;
}

size_t round_to_pinned_class(size_t nbytes) {
  if (nbytes <= (size_t(1) << 20)) return round_to_size_class(nbytes);
  const size_t step = std::bit_ceil(nbytes) / 16;
  return (nbytes + step - 1) / step * step;
}

namespace {

// Blocks are cached by exact size class and handed out again on a later request of the same class.
class HostCachingAllocator final : public Allocator {
 public:
  // Note [Freed heap memory stays mapped]: set before the first block, so before any kernel runs.
  explicit HostCachingAllocator(Device device) : device_(device) { heap_policy(); }
  ~HostCachingAllocator() override { empty_cache(); }

  DataPtr allocate(size_t nbytes) override {
    const size_t cls = round_to_size_class(nbytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
      if (!p) {
        p = system_alloc(cls);
        stats_.reserved_bytes += int64_t(cls);
        stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
        ++stats_.num_system_allocs;
      }
      stats_.allocated_bytes += int64_t(cls);
      stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
      ++stats_.num_allocs;
      if (AllocatorObserver* o = observer()) o->allocated(p, nbytes);
    }
    return DataPtr(p, nbytes, this);
  }

  Device device() const override { return device_; }
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
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) std::free(p);
      stats_.reserved_bytes -= int64_t(cls * blocks.size());
      blocks.clear();
    }
  }

 protected:
  void release(void* ptr, size_t nbytes) override {
    const size_t cls = round_to_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_[cls].push_back(ptr);
    stats_.allocated_bytes -= int64_t(cls);
    ++stats_.num_frees;
    if (AllocatorObserver* o = observer()) o->released(ptr, nbytes);
  }

 private:
  static void* system_alloc(size_t cls) {
    // 64-byte alignment suits AVX-512 loads; large blocks get page alignment.
    const size_t align = cls >= (size_t(1) << 20) ? 4096 : 64;
    void* p = std::aligned_alloc(align, (cls + align - 1) / align * align);
    if (!p) throw std::bad_alloc();
    return p;
  }

  Device device_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  MemoryStats stats_;
};

}  // namespace

HeapPolicy decide_heap_policy(const char* (*env)(const char*)) {
  for (const char* var : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (env(var)) return {false, std::string(var) + " is set"};
  if (const char* t = env("GLIBC_TUNABLES"); t && std::strstr(t, "glibc.malloc."))
    return {false, "GLIBC_TUNABLES sets glibc.malloc"};
  return {true, ""};
}

const HeapPolicy& heap_policy() {
  // Note [Freed heap memory stays mapped].
  static const HeapPolicy policy = [] {
    HeapPolicy p = decide_heap_policy([](const char* name) -> const char* { return std::getenv(name); });
    if (p.applied && !(mallopt(M_MMAP_THRESHOLD, int(kHeapMmapThreshold)) && mallopt(M_TRIM_THRESHOLD, -1)))
      p = {false, "glibc refused mallopt"};
    return p;
  }();
  return policy;
}

std::string heap_policy_note() {
  const HeapPolicy& p = heap_policy();
  if (!p.applied) return "host heap: glibc's own rules (" + p.reason + ")";
  const std::string mib = std::to_string(kHeapMmapThreshold >> 20) + " MiB";
  return "host heap: freed memory under " + mib + " stays mapped (glibc's mmap threshold " + mib +
         ", no trimming; MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ overrides)";
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    // Never destroyed: tensors in other static objects may outlive any destruction order we could pick.
    static auto* cpu = new HostCachingAllocator(Device::cpu());
    return *cpu;
  }
  return cuda_runtime::device_allocator(device.index);
}

Allocator& pinned_host_allocator() {
  if (cuda_runtime::built() && cuda_available()) return cuda_runtime::pinned_allocator();
  static auto* pinned = new HostCachingAllocator(Device::cpu());
  return *pinned;
}

}  // namespace cz
