// CPU caching allocator: statistics and reuse.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace cz
