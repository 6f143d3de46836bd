// CPU caching allocator: statistics and reuse; the heap policy the CPU backend sets.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "tensor/allocator.h"
#include "tensor/tensor.h"

namespace cz {
namespace {

TEST(Allocator, SizeClassesWasteAtMostAnEighth) {
  for (size_t n : {1ul, 63ul, 64ul, 65ul, 4096ul, 4097ul, 10000ul, 1ul << 20, (1ul << 20) + 1, 123456789ul}) {
    const size_t c = round_to_size_class(n);
    EXPECT_GE(c, n);
    if (n > 4096) {
      EXPECT_LE(double(c), double(n) * 1.125 + 1) << n;
    }
    if (n > (1ul << 20)) {
      EXPECT_LE(double(c), double(n) * (1 + 1.0 / 64) + 1) << n;
    }
  }
}

// Note [Pinned blocks]: the pinned pool's classes, eight per power of two at every size, put the recipe's
// packed draws (2.5-4.5 MB a batch) in a handful of classes where the device's exact ones make dozens.
TEST(Allocator, PinnedClassesAreEightPerPowerOfTwo) {
  for (size_t n : {1ul, 65ul, 4097ul, 10000ul, 1ul << 20, (1ul << 20) + 1, 3'000'001ul, 123456789ul}) {
    const size_t c = round_to_pinned_class(n);
    EXPECT_GE(c, n);
    if (n <= (1ul << 20)) EXPECT_EQ(c, round_to_size_class(n)) << n;
    if (n > 4096) EXPECT_LE(double(c), double(n) * 1.125 + 1) << n;
  }
  std::map<size_t, int> pinned, device;
  for (size_t n = 2'500'000; n <= 4'500'000; n += 1000) {
    ++pinned[round_to_pinned_class(n)];
    ++device[round_to_size_class(n)];
  }
  EXPECT_LE(pinned.size(), 9u);
  EXPECT_GE(device.size(), 50u);
}

TEST(Allocator, StatisticsTrackLiveCachedAndPeak) {
  Allocator& a = allocator_for(Device::cpu());
  a.empty_cache();
  a.reset_peak();
  const MemoryStats s0 = a.stats();
  const size_t big = round_to_size_class(10'000'000);
  {
    Tensor t = empty({2'500'000}, DType::f32);  // 10 MB
    const MemoryStats s1 = a.stats();
    EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, int64_t(big));
    EXPECT_GE(s1.reserved_bytes - s0.reserved_bytes, int64_t(big));
    EXPECT_EQ(s1.num_allocs - s0.num_allocs, 1);
  }
  const MemoryStats s2 = a.stats();
  EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s2.peak_allocated_bytes - s0.allocated_bytes, int64_t(big));
  EXPECT_GE(s2.reserved_bytes - s0.reserved_bytes, int64_t(big));  // still cached

  {  // Same size class again: served from the cache.
    Tensor t = empty({2'500'000}, DType::f32);
    EXPECT_EQ(a.stats().num_system_allocs, s2.num_system_allocs);
  }
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, a.stats().allocated_bytes);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, a.stats().allocated_bytes);
}

TEST(Allocator, PinnedHostAllocatorKeepsItsOwnStatistics) {
  Allocator& p = pinned_host_allocator();
  const MemoryStats before = allocator_for(Device::cpu()).stats();
  {
    DataPtr d = p.allocate(1 << 20);
    ASSERT_NE(d.get(), nullptr);
    EXPECT_GE(p.stats().allocated_bytes, 1 << 20);
  }
  EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, before.num_allocs);
}

TEST(Allocator, EmptyPinnedIsAContiguousHostTensorFromThePinnedAllocator) {
  const MemoryStats cpu_before = allocator_for(Device::cpu()).stats();
  const int64_t pinned_before = pinned_host_allocator().stats().num_allocs;
  Tensor t = empty_pinned({3, 4}, DType::f64);
  EXPECT_TRUE(t.is_cpu());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::f64);
  t.fill_(2.5);
  EXPECT_EQ(t.select(0, 2).select(0, 3).item(), 2.5);
  EXPECT_EQ(pinned_host_allocator().stats().num_allocs, pinned_before + 1);
  EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, cpu_before.num_allocs);
}

// Note [Freed heap memory stays mapped]: what a library mallocs and frees on every call (oneDNN's packed
// weights) is not faulted in again on the next call, on the main thread and on another (glibc arena).
int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Pages faulted in by the second of two malloc / touch / free rounds of `bytes`.
int64_t faults_of_second_round(size_t bytes) {
  int64_t faults = 0;
  for (int round = 0; round < 2; ++round) {
    const int64_t before = minor_faults();
    auto* p = static_cast<volatile char*>(std::malloc(bytes));
    EXPECT_NE(p, nullptr);
    for (size_t i = 0; i < bytes; i += 4096) p[i] = char(i);
    std::free(const_cast<char*>(p));
    faults = minor_faults() - before;
  }
  return faults;
}

TEST(HeapPolicy, FreedLibraryBuffersStayMapped) {
  allocator_for(Device::cpu());  // applies the policy, as every process's first tensor does
  const HeapPolicy wanted =
      decide_heap_policy([](const char* name) -> const char* { return std::getenv(name); });
  if (!wanted.applied) GTEST_SKIP() << "the environment keeps glibc's settings: " << wanted.reason;
  ASSERT_TRUE(heap_policy().applied) << heap_policy().reason;
  // 30 MiB: under the 32 MiB threshold, above what anything in this process freed before (glibc's own rule
  // would map it, unmap it on free and fault all 7680 pages in again).
  const size_t bytes = size_t(30) << 20, pages = bytes / 4096;
  EXPECT_LT(faults_of_second_round(bytes), int64_t(pages / 10)) << "main thread";
  int64_t worker = 0;
  std::thread([&] { worker = faults_of_second_round(bytes); }).join();
  EXPECT_LT(worker, int64_t(pages / 10)) << "another thread";
}

TEST(HeapPolicy, TheUsersOwnGlibcSettingsWin) {
  static std::map<std::string, std::string> env;
  const auto lookup = [](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  env = {};
  EXPECT_TRUE(decide_heap_policy(lookup).applied);
  env = {{"GLIBC_TUNABLES", "glibc.rtld.nns=4"}};
  EXPECT_TRUE(decide_heap_policy(lookup).applied);
  for (const auto& [name, value] :
       std::map<std::string, std::string>{{"MALLOC_MMAP_THRESHOLD_", "65536"},
                                          {"MALLOC_TRIM_THRESHOLD_", "0"},
                                          {"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"}}) {
    env = {{name, value}};
    const HeapPolicy p = decide_heap_policy(lookup);
    EXPECT_FALSE(p.applied) << name;
    EXPECT_NE(p.reason.find(name == "GLIBC_TUNABLES" ? "glibc.malloc" : name), std::string::npos) << p.reason;
  }
}

}  // namespace
}  // namespace cz
