// The CUDA caching allocator's bookkeeping (Note [Cross-stream frees], cuda/block_pool.h) driven on the CPU
// by fake streams and events whose completion the test controls: no GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tensor/cuda/block_pool.h"

namespace cz {
namespace {

struct FakeOom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A pretend GPU: per stream, how many work items were queued and how many have finished; a memory capacity.
class FakeGpu {
 public:
  explicit FakeGpu(size_t capacity = size_t(1) << 40) : capacity_(capacity) {}

  void launch(const Stream& s) {
    std::lock_guard<std::mutex> lock(mu_);
    ++queued_[s.handle];
  }
  void finish_one(const Stream& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_[s.handle] < queued_[s.handle]) ++done_[s.handle];
  }
  void finish(const Stream& s) {
    std::lock_guard<std::mutex> lock(mu_);
    done_[s.handle] = queued_[s.handle];
  }

  // The backend's side.
  std::pair<void*, int64_t> record(const Stream& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_record) throw DeviceError("fake: cudaEventRecord failed");
    ++events_out;
    ++events_recorded;
    return {s.handle, queued_[s.handle]};
  }
  bool completed(void* stream, int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    ++queries;
    return done_[stream] >= seq;
  }
  void wait(void* stream, int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    ++syncs;
    done_[stream] = std::max(done_[stream], seq);  // the host waited until the stream got there
  }
  void* alloc(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ + n > capacity_) return nullptr;
    void* p = std::malloc(n);
    used_ += n;
    sizes_[p] = n;
    return p;
  }
  void free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    ASSERT_NE(it, sizes_.end()) << "system_free of a pointer the system never gave out (double free?)";
    used_ -= it->second;
    sizes_.erase(it);
    std::free(p);
    ++system_frees;
  }
  size_t used() {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

  bool fail_record = false;
  int events_out = 0;  // recorded and not yet recycled
  int events_recorded = 0;
  int queries = 0;
  int syncs = 0;
  int system_frees = 0;
  int warnings = 0;
  int64_t kept_for_graphs = -1;  // as the last out_of_memory was told

 private:
  std::mutex mu_;
  size_t capacity_;
  size_t used_ = 0;
  std::map<void*, int64_t> queued_, done_;
  std::map<void*, size_t> sizes_;
};

struct FakeBackend {
  struct Event {
    void* stream;
    int64_t seq;  // completes once the stream has finished this many work items
  };
  FakeGpu* gpu;

  Event record(const Stream& s) {
    auto [h, seq] = gpu->record(s);
    return {h, seq};
  }
  bool query(const Event& e) { return gpu->completed(e.stream, e.seq); }
  void synchronize(const Event& e) { gpu->wait(e.stream, e.seq); }
  void recycle(const Event&) { --gpu->events_out; }
  void* system_alloc(size_t cls) { return gpu->alloc(cls); }
  void system_free(void* p) { gpu->free(p); }
  [[noreturn]] void out_of_memory(size_t cls, size_t, const MemoryStats&, int64_t kept_for_graphs) {
    gpu->kept_for_graphs = kept_for_graphs;
    throw FakeOom("fake out of memory for " + std::to_string(cls));
  }
  void warn_release_failure(const std::exception&) noexcept { ++gpu->warnings; }
};

using Pool = cuda::BlockPool<FakeBackend>;

Stream stream(uintptr_t id) {
  return Stream{Device::cuda(0), reinterpret_cast<void*>(id)};
}
const Stream kLegacy = stream(0);  // handle nullptr, the legacy default stream
const Stream kA = stream(0x10), kB = stream(0x20), kSide = stream(0x30), kSide2 = stream(0x40);
constexpr size_t kSize = 1'000'000;
const int64_t kCls = int64_t(round_to_size_class(kSize));

// A kSize block handed out on `home`, recorded on `user`, work launched on `user` (e.g. a collective reading
// it on the comm stream) and the block released while that work runs.
void* released_while_used(Pool& pool, FakeGpu& gpu, const Stream& home, const Stream& user) {
  void* p = pool.allocate(kSize, home);
  pool.record_stream(p, user);
  gpu.launch(user);
  pool.release(p);
  return p;
}

TEST(BlockPool, ReusesAFreedBlockOnlyForItsHomeStream) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, /*home_streams=*/true, "fake");
  void* p = pool.allocate(kSize, kA);
  gpu.launch(kA);  // the owner's kernel, still queued when the host frees
  pool.release(p);
  EXPECT_EQ(pool.num_pending(), 0u);  // no other stream: straight back to A's pool

  void* q = pool.allocate(kSize, kB);  // B's work is not ordered after A's kernel
  EXPECT_NE(q, p);
  void* r = pool.allocate(kSize, kA);  // A's is: reuse at once, without waiting
  EXPECT_EQ(r, p);
  EXPECT_EQ(gpu.syncs, 0);

  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 2 * kCls);
  EXPECT_EQ(s.reserved_bytes, 2 * kCls);
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.num_system_allocs, 2);
  pool.release(q);
  pool.release(r);
  EXPECT_EQ(pool.stats().allocated_bytes, 0);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 2 * kCls);
}

TEST(BlockPool, BlockRecordedOnBusySideStreamWaitsForItsEvent) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = released_while_used(pool, gpu, kA, kSide);
  EXPECT_EQ(pool.num_pending(), 1u);
  EXPECT_EQ(pool.stats().allocated_bytes, 0);    // no longer held by a tensor...
  EXPECT_EQ(pool.stats().reserved_bytes, kCls);  // ...but still the allocator's
  gpu.launch(kSide);                             // queued after the free: the block must not wait for it

  void* q = pool.allocate(kSize, kA);  // the side stream is still busy: not handed out
  EXPECT_NE(q, p);
  EXPECT_EQ(pool.num_pending(), 1u);
  pool.release(q);

  gpu.finish_one(kSide);  // the work queued before the free has finished
  void* r = pool.allocate(kSize, kA);
  EXPECT_EQ(pool.num_pending(), 0u);
  EXPECT_TRUE(r == p || r == q);
  void* t = pool.allocate(kSize, kA);
  EXPECT_TRUE((r == p && t == q) || (r == q && t == p));
  EXPECT_EQ(gpu.syncs, 0);       // polled, never waited for
  EXPECT_EQ(gpu.events_out, 0);  // events recycled

  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.num_allocs, 4);
  EXPECT_EQ(s.num_frees, 2);
  EXPECT_EQ(s.num_system_allocs, 2);
  EXPECT_EQ(s.allocated_bytes, 2 * kCls);
  EXPECT_EQ(s.reserved_bytes, 2 * kCls);
}

TEST(BlockPool, PendingBlockGoesBackToItsHomeStreamOnly) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = released_while_used(pool, gpu, kA, kSide);
  gpu.finish(kSide);
  void* q = pool.allocate(kSize, kB);  // the event completed, but the block belongs to A
  EXPECT_NE(q, p);
  EXPECT_EQ(pool.num_pending(), 0u);
  EXPECT_EQ(pool.allocate(kSize, kA), p);
}

TEST(BlockPool, WaitsForEveryRecordedStream) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = pool.allocate(kSize, kA);
  pool.record_stream(p, kSide);
  pool.record_stream(p, kSide2);
  pool.record_stream(p, kSide);  // twice: one event
  pool.record_stream(p, kA);     // the home stream: nothing to record
  gpu.launch(kSide);
  gpu.launch(kSide2);
  gpu.launch(kA);
  pool.release(p);
  EXPECT_EQ(gpu.events_recorded, 2);

  gpu.finish(kSide);
  void* q = pool.allocate(kSize, kA);
  EXPECT_NE(q, p);  // kSide2 is still busy
  gpu.finish(kSide2);
  EXPECT_EQ(pool.allocate(kSize, kA), p);  // kA's own work is not waited for: ordered already
  EXPECT_EQ(gpu.events_out, 0);
}

TEST(BlockPool, RecordOnHomeStreamNeedsNoEvent) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = released_while_used(pool, gpu, kLegacy, kLegacy);
  EXPECT_EQ(pool.num_pending(), 0u);
  EXPECT_EQ(gpu.events_recorded, 0);
  EXPECT_EQ(pool.allocate(kSize, kLegacy), p);
}

TEST(BlockPool, EmptyCacheWaitsForPendingBlocksAndReturnsEverything) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = pool.allocate(kSize, kA);
  void* q = pool.allocate(kSize, kB);
  void* live = pool.allocate(100, kA);
  pool.record_stream(p, kSide);
  gpu.launch(kSide);
  pool.release(p);
  pool.release(q);
  EXPECT_EQ(pool.num_pending(), 1u);
  EXPECT_EQ(pool.num_cached(), 1u);

  pool.empty_cache();
  EXPECT_EQ(gpu.syncs, 1);  // waited for the side stream's event
  EXPECT_EQ(pool.num_pending(), 0u);
  EXPECT_EQ(pool.num_cached(), 0u);
  EXPECT_EQ(gpu.system_frees, 2);
  EXPECT_EQ(gpu.used(), size_t(round_to_size_class(100)));  // only the live block is still held
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, int64_t(round_to_size_class(100)));
  EXPECT_EQ(s.allocated_bytes, int64_t(round_to_size_class(100)));
  EXPECT_EQ(s.peak_reserved_bytes, 2 * kCls + int64_t(round_to_size_class(100)));
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_reserved_bytes, s.reserved_bytes);
  pool.release(live);
}

TEST(BlockPool, OutOfMemoryReturnsTheCacheAndRetriesOnce) {
  FakeGpu gpu(3 * size_t(kCls));
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* a = pool.allocate(kSize, kA);
  void* b = pool.allocate(kSize, kB);
  void* keep = pool.allocate(kSize, kA);
  pool.record_stream(b, kSide);
  gpu.launch(kSide);
  pool.release(a);
  pool.release(b);  // pending on the busy side stream

  // A different size class needs room: the cached block and the pending one (after waiting) are returned.
  void* big = pool.allocate(2 * kSize, kA);
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(gpu.syncs, 1);
  EXPECT_EQ(gpu.system_frees, 2);
  EXPECT_EQ(pool.num_pending(), 0u);
  const int64_t big_cls = int64_t(round_to_size_class(2 * kSize));
  MemoryStats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, kCls + big_cls);
  EXPECT_EQ(s.allocated_bytes, kCls + big_cls);
  EXPECT_EQ(s.num_system_allocs, 4);

  // Nothing left to return: the error comes out, and the statistics are unchanged.
  EXPECT_THROW(pool.allocate(4 * kSize, kA), FakeOom);
  const MemoryStats t = pool.stats();
  EXPECT_EQ(t.allocated_bytes, s.allocated_bytes);
  EXPECT_EQ(t.reserved_bytes, s.reserved_bytes);
  EXPECT_EQ(t.num_allocs, s.num_allocs);
  EXPECT_EQ(t.num_system_allocs, s.num_system_allocs);
  pool.release(big);
  pool.release(keep);
  pool.empty_cache();
  EXPECT_EQ(gpu.used(), 0u);
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
}

TEST(BlockPool, PinnedBlocksHaveNoHomeStream) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, /*home_streams=*/false, "pinned");
  void* p = pool.allocate(kSize, Stream{});
  pool.release(p);
  EXPECT_EQ(pool.allocate(kSize, kB), p);  // any user: the host writes it at once

  // Recorded on the legacy default stream (handle nullptr, like the pinned pool's key): still an event.
  pool.record_stream(p, kLegacy);
  pool.record_stream(p, kA);
  gpu.launch(kLegacy);  // an async copy out of the block
  pool.release(p);
  EXPECT_EQ(pool.num_pending(), 1u);
  EXPECT_EQ(gpu.events_recorded, 2);
  void* q = pool.allocate(kSize, Stream{});
  EXPECT_NE(q, p);
  gpu.finish(kLegacy);
  EXPECT_EQ(pool.allocate(kSize, Stream{}), p);
  pool.release(q);
}

TEST(BlockPool, RecordStreamRejectsPointersItDidNotHandOut) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = pool.allocate(kSize, kA);
  EXPECT_THROW(pool.record_stream(static_cast<char*>(p) + 64, kSide), ValueError);
  pool.release(p);
  EXPECT_THROW(pool.record_stream(p, kSide), ValueError);  // freed
}

TEST(BlockPool, FailedEventRecordDropsTheBlockButKeepsItCounted) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* p = pool.allocate(kSize, kA);
  pool.record_stream(p, kSide);
  gpu.fail_record = true;
  pool.release(p);  // must not throw
  gpu.fail_record = false;
  EXPECT_EQ(gpu.warnings, 1);
  EXPECT_EQ(pool.num_pending(), 0u);
  EXPECT_EQ(pool.num_cached(), 0u);  // never handed out again: nobody knows when kSide is done with it
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, kCls);  // the bytes are still held
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_NE(pool.allocate(kSize, kA), p);
}

// Note [Allocations during capture]: what a CUDA graph captured on kSide may hold an address of is never
// handed to other work, and the capture sees no event query, no event record and no system free.
TEST(BlockPool, CaptureKeepsTheGraphsBlocksOutOfReuse) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  // Before the capture: a block used on another stream is pending on its event.
  released_while_used(pool, gpu, kA, kB);
  ASSERT_EQ(pool.num_pending(), 1u);
  void* weights = pool.allocate(kSize, kLegacy);  // made eagerly, read by the graph, freed during capture
  void* warm = pool.allocate(kSize, kSide);       // a warm-up's temporary on the capture stream
  pool.release(warm);

  const int queries = gpu.queries, recorded = gpu.events_recorded;
  pool.begin_capture(kSide);
  void* tmp = pool.allocate(kSize, kSide);
  EXPECT_EQ(tmp, warm);  // the capture stream's own pool, filled by the warm-up
  pool.release(tmp);
  EXPECT_EQ(pool.allocate(kSize, kSide), warm);  // reused within the capture: the graph orders it
  void* side_used = pool.allocate(2 * kSize, kSide);
  pool.record_stream(side_used, kB);
  pool.release(side_used);  // used on another stream too: no event during a capture, held instead
  pool.release(weights);    // of another pool: the graph may read it at every replay
  void* other = pool.allocate(kSize, kA);   // another pool's block made during the capture
  void* out = pool.allocate(kSize, kSide);  // the graph's output, alive after the capture
  EXPECT_EQ(gpu.queries, queries);
  EXPECT_EQ(gpu.events_recorded, recorded);
  EXPECT_EQ(pool.num_graph_held(), 2u);
  EXPECT_THROW(pool.empty_cache(), ValueError);
  EXPECT_THROW(pool.begin_capture(kSide), ValueError);
  pool.end_capture();

  pool.release(other);  // allocated during the capture for another pool: held even after it
  EXPECT_EQ(pool.num_graph_held(), 3u);
  EXPECT_NE(pool.allocate(kSize, kLegacy), weights);
  EXPECT_NE(pool.allocate(kSize, kA), other);
  pool.release(out);  // the capture stream's own: back to its pool, which only graph work uses
  EXPECT_EQ(pool.allocate(kSize, kSide), out);
  EXPECT_GT(gpu.queries, queries);  // outside the capture the pending block is polled again
  EXPECT_EQ(gpu.system_frees, 0);

  // The graph is gone: its held blocks return to their home pools.
  pool.release_graph_blocks();
  EXPECT_EQ(pool.num_graph_held(), 0u);
  EXPECT_EQ(pool.allocate(kSize, kLegacy), weights);
  EXPECT_EQ(pool.allocate(kSize, kA), other);
  EXPECT_EQ(pool.allocate(2 * kSize, kSide), side_used);
}

TEST(BlockPool, OutOfMemoryDuringCaptureFreesNothing) {
  FakeGpu gpu(2 * size_t(kCls));
  Pool pool(FakeBackend{&gpu}, true, "fake");
  pool.release(pool.allocate(kSize, kA));  // cached: outside a capture it would be returned and retried
  void* live = pool.allocate(kSize, kSide);
  pool.begin_capture(kSide);
  EXPECT_THROW(pool.allocate(kSize, kSide), FakeOom);
  EXPECT_EQ(gpu.system_frees, 0);
  pool.end_capture();
  EXPECT_NE(pool.allocate(kSize, kSide), nullptr);  // now the cache goes back to the system first
  EXPECT_EQ(gpu.system_frees, 1);
  pool.release(live);
}

// Note [Graph pools outlive memory pressure]: after a capture, the out-of-memory retry and empty_cache return
// the other pools' cached blocks to the system and keep the capture stream's, whose addresses the graph
// replays, until release_graph_blocks.
TEST(BlockPool, GraphPoolsSurviveTheOutOfMemoryRetryAndEmptyCache) {
  FakeGpu gpu(4 * size_t(kCls));
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* warm = pool.allocate(kSize, kSide);  // a warm-up's temporary: the capture takes it again
  pool.release(warm);
  pool.begin_capture(kSide);
  void* tmp = pool.allocate(kSize, kSide);
  ASSERT_EQ(tmp, warm);
  pool.release(tmp);  // free in the graph's pool: the graph writes it at every replay
  pool.end_capture();
  void* other = pool.allocate(kSize, kA);
  pool.release(other);                      // cached in an ordinary pool
  void* live = pool.allocate(kSize, kB);    // 3 of 4 blocks' room in use or cached
  EXPECT_EQ(pool.kept_for_graphs(), kCls);  // the free block of the graph's pool

  // A request the room left cannot serve: the retry frees the other pool's block only.
  void* big = pool.allocate(2 * kSize, kA);
  EXPECT_EQ(gpu.system_frees, 1);
  EXPECT_EQ(pool.num_cached(), 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, int64_t(gpu.used()));
  // One that fails even so: the error says what the graphs keep.
  EXPECT_THROW(pool.allocate(kSize, kB), FakeOom);
  EXPECT_EQ(gpu.kept_for_graphs, kCls);
  EXPECT_EQ(gpu.system_frees, 1);
  pool.release(big);
  pool.empty_cache();  // the same rule
  EXPECT_EQ(gpu.system_frees, 2);
  EXPECT_EQ(pool.allocate(kSize, kSide), warm);  // the replay's address is still the graph's
  pool.release(warm);

  // The graphs are gone: the pool is an ordinary one again.
  pool.release_graph_blocks();
  EXPECT_EQ(pool.kept_for_graphs(), 0);
  pool.empty_cache();
  EXPECT_EQ(gpu.system_frees, 3);
  EXPECT_EQ(gpu.used(), size_t(kCls));  // `live` only
  EXPECT_EQ(pool.stats().reserved_bytes, kCls);
  pool.release(live);
}

// Blocks held for a graph (freed during a capture from another pool) stay out of both as well.
TEST(BlockPool, BlocksHeldForAGraphSurviveTheOutOfMemoryRetry) {
  FakeGpu gpu(2 * size_t(kCls));
  Pool pool(FakeBackend{&gpu}, true, "fake");
  void* weights = pool.allocate(kSize, kLegacy);
  pool.begin_capture(kSide);
  pool.release(weights);  // the graph may read it at every replay
  pool.end_capture();
  EXPECT_EQ(pool.kept_for_graphs(), kCls);
  void* a = pool.allocate(kSize, kA);
  EXPECT_THROW(pool.allocate(kSize, kB), FakeOom);  // the room is the held block's and a's
  EXPECT_EQ(gpu.system_frees, 0);
  pool.empty_cache();
  EXPECT_EQ(gpu.system_frees, 0);
  pool.release_graph_blocks();
  pool.empty_cache();
  EXPECT_EQ(gpu.system_frees, 1);
  pool.release(a);
}

// Note [Pinned blocks]: without home streams a request takes the smallest free block of at most twice its
// class, and counts that block's class; the device pools keep exact classes (the memory planner's rule).
TEST(BlockPool, PinnedRequestsTakeTheSmallestFreeBlockUpToTwiceTheirClass) {
  FakeGpu gpu;
  Pool pinned(FakeBackend{&gpu}, /*home_streams=*/false, "pinned");
  void* b3 = pinned.allocate(3'000'000, Stream{});
  void* b4 = pinned.allocate(4'400'000, Stream{});
  void* b9 = pinned.allocate(9'000'000, Stream{});
  pinned.release(b9);
  pinned.release(b4);
  pinned.release(b3);
  EXPECT_EQ(pinned.allocate(2'500'000, Stream{}), b3);  // the smallest that fits, not the last freed
  EXPECT_EQ(pinned.stats().allocated_bytes, int64_t(round_to_pinned_class(3'000'000)));
  EXPECT_EQ(pinned.allocate(2'500'000, Stream{}), b4);  // 4.5 MiB <= twice 2.5 MiB
  void* fresh = pinned.allocate(2'500'000, Stream{});   // 9 MB would hold over twice the request
  EXPECT_NE(fresh, b9);
  EXPECT_EQ(pinned.allocate(5'000'000, Stream{}), b9);
  const MemoryStats s = pinned.stats();
  EXPECT_EQ(s.num_system_allocs, 4);
  EXPECT_EQ(s.allocated_bytes, s.reserved_bytes);
  EXPECT_EQ(s.reserved_bytes, int64_t(round_to_pinned_class(3'000'000) + round_to_pinned_class(4'400'000) +
                                      round_to_pinned_class(9'000'000) + round_to_pinned_class(2'500'000)));

  Pool device(FakeBackend{&gpu}, /*home_streams=*/true, "fake");
  void* d = device.allocate(2 * kSize, kA);
  device.release(d);
  EXPECT_NE(device.allocate(kSize + 1, kA), d);  // a larger class is not handed out on the device
}

TEST(BlockPool, StatisticsStayConsistentUnderConcurrentUse) {
  FakeGpu gpu;
  Pool pool(FakeBackend{&gpu}, true, "fake");
  constexpr int kThreads = 4, kIters = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Stream home = stream(0x100 + uintptr_t(t));
      for (int i = 0; i < kIters; ++i) {
        void* p = pool.allocate(size_t(64 * (1 + i % 5)), home);
        if (i % 3 == 0) {
          pool.record_stream(p, kSide);
          gpu.launch(kSide);
        }
        if (i % 7 == 0) gpu.finish(kSide);
        pool.release(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  gpu.finish(kSide);
  void* last = pool.allocate(64, kA);  // polls the pending list
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.num_allocs, kThreads * kIters + 1);
  EXPECT_EQ(s.num_frees, kThreads * kIters);
  EXPECT_EQ(s.allocated_bytes, 64);
  EXPECT_EQ(pool.num_pending(), 0u);
  EXPECT_EQ(gpu.events_out, 0);
  EXPECT_EQ(s.reserved_bytes, int64_t(gpu.used()));
  pool.release(last);
  pool.empty_cache();
  EXPECT_EQ(gpu.used(), 0u);
}

}  // namespace
}  // namespace cz
