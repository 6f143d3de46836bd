// The bookkeeping of the CUDA caching allocators (Note [Cross-stream frees] in allocator.cpp): live blocks,
// free blocks pooled per (home stream, size class), blocks waiting for events on other streams, the blocks
// CUDA graphs address, statistics. It calls no CUDA function itself, so tests drive it on a CPU with fake
// streams and events.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/stream.h"

namespace cz::cuda {

// Note [Pinned blocks]: page-locked host memory is dear to get (cudaHostAlloc maps and locks every page and
// synchronises the device), and it is asked for by whatever thread needs it, the launching thread included
// (copy_ahead's packed draws, Tensor::to's staging). Requests of one use may vary from batch to batch: the
// packed draws of the whole recipe (random erasing's values) are 2-5 MB a batch at 224 px, batch 128, a
// different size each time. By the device's exact classes (64 per power of two above 1 MiB) they fall in
// dozens of classes, each a cudaHostAlloc on the launching thread when first met, cached for good. So:
//  * the pinned pool (a BlockPool without home streams) rounds a request to round_to_pinned_class (8 classes
//    per power of two: at most 12.5% more) and hands it the smallest free block of at most twice its class.
//    A block serves every request down to half its size, and the pool grows only while the blocks held at
//    once (live, or pending on a copy) grow in number, or a request outgrows every block by a class;
//  * the packed draws are asked for at a capacity that only grows (grow_draws_capacity in
//    io/data/model_input.h), so the pool hands the same blocks back batch after batch;
// and after the first batches the pool stays flat (tests/io/test_pinned_draws.cpp replays 200 batches of the
// recipe; its `cuda` case counts the cudaHostAllocs of the real loader). `allocated` counts the class of the
// block handed out, which is what is held. Why not PyTorch's rounding to powers of two: the batches' pixels
// are the largest pinned blocks (19.3 MB at 224 px, batch 128, threads x prefetch of them), and would hold up
// to 2x.
//
// `Backend` does the system side; the pool calls it with its lock held, so it needs no lock of its own:
//   using Event = ...;                                  // a copyable handle
//   Event record(const Stream& s);                      // an event recorded on `s` now (throws on failure)
//   bool query(const Event& e);                         // has it completed (never blocks; throws on error)
//   void synchronize(const Event& e);                   // blocks until it has
//   void recycle(const Event& e);                       // the pool is done with it
//   void* system_alloc(size_t cls);                     // nullptr when out of memory; throws on other errors
//   void system_free(void* p);
//   [[noreturn]] void out_of_memory(size_t cls, size_t requested, const MemoryStats& stats,
//                                   int64_t kept_for_graphs);  // cached bytes live graphs address
//   void warn_release_failure(const std::exception& e) noexcept;
template <class Backend>
class BlockPool {
 public:
  using Event = typename Backend::Event;

  // With `home_streams` false (pinned host memory) every block shares one pool: the host writes a block at
  // once, ordered after nothing on any stream; and blocks are sized and reused by Note [Pinned blocks].
  // `name` ("cuda:0", "pinned host") is for messages.
  BlockPool(Backend backend, bool home_streams, std::string name)
      : backend_(std::move(backend)), home_streams_(home_streams), name_(std::move(name)) {}

  // A block for work on `stream`: of round_to_size_class(nbytes) bytes with home streams (device memory: the
  // memory planner replays that rule), else at least round_to_pinned_class(nbytes) (Note [Pinned blocks]).
  void* allocate(size_t nbytes, const Stream& stream) {
    const size_t cls = home_streams_ ? round_to_size_class(nbytes) : round_to_pinned_class(nbytes);
    void* home = home_of(stream);
    std::lock_guard<std::mutex> lock(mu_);
    if (!capture_) process_pending(/*wait=*/false);  // Note [Allocations during capture]: no event queries
    size_t got = cls;
    void* p = take_cached(home, cls, got);
    if (!p) {
      p = system_alloc(cls, nbytes);
      stats_.reserved_bytes += int64_t(cls);
      stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
      ++stats_.num_system_allocs;
    }
    // Note [Allocations during capture]: a block the graph may use that is not of the capture stream's pool.
    live_.emplace(p, Block{got, home, {}, capture_ && home != capture_home_});
    stats_.allocated_bytes += int64_t(got);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    ++stats_.num_allocs;
    return p;
  }

  // Declares that the block starting at `ptr` is used by work on `stream` (ValueError if it is not one).
  void record_stream(void* ptr, const Stream& stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    CZ_CHECK(it != live_.end(), "record_stream: {} is not the start of a live block of the {} allocator", ptr,
             name_);
    Block& b = it->second;
    if (home_streams_ && stream.handle == b.home) return;  // ordered on the home stream already
    if (std::find(b.streams.begin(), b.streams.end(), stream) == b.streams.end()) b.streams.push_back(stream);
  }

  // Returns a block: to its home pool at once, or, when recorded on other streams, after events recorded on
  // each of them now have completed. Never throws (called from destructors).
  void release(void* ptr) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) return;  // not ours: nothing sane to do in a destructor
      Block b = std::move(it->second);
      live_.erase(it);
      stats_.allocated_bytes -= int64_t(b.cls);
      ++stats_.num_frees;
      // Note [Allocations during capture]: kept for the graph, neither reused nor waited for with events.
      if (b.graph || (capture_ && (b.home != capture_home_ || !b.streams.empty()))) {
        graph_held_.push_back({ptr, b.cls, b.home, {}});
        return;
      }
      if (b.streams.empty()) {
        free_[{b.home, b.cls}].push_back(ptr);
        return;
      }
      Pending pending{ptr, b.cls, b.home, {}};
      try {
        for (const Stream& s : b.streams) pending.events.push_back(backend_.record(s));
      } catch (const std::exception& e) {
        // Without the events nobody can tell when the other streams are done with the block: drop it (it
        // stays counted in `reserved`, which is the truth: the bytes are still held).
        for (const Event& ev : pending.events) backend_.recycle(ev);
        backend_.warn_release_failure(e);
        return;
      }
      pending_.push_back(std::move(pending));
    } catch (const std::exception& e) {
      backend_.warn_release_failure(e);
    }
  }

  // Waits for pending blocks, then returns every cached block to the system but those of the pools live CUDA
  // graphs address (Note [Graph pools outlive memory pressure]).
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    CZ_CHECK(!capture_, "{} allocator: empty_cache during a CUDA graph capture", name_);
    release_cache();
  }

  // Note [Allocations during capture]: from begin_capture to end_capture a CUDA graph records the work queued
  // on `stream`. Meanwhile the pool queries and records no events (a capture forbids both where they touch
  // captured work), never returns memory to the system (cudaFree would end the capture), and every block the
  // graph may hold an address of stays out of reuse: the capture stream's own blocks go back to its pool,
  // which only graph work uses (the caller's promise: nothing but warm-ups, captures and replays runs on that
  // stream); a block of another pool freed during the capture, or allocated during it and freed at any time
  // later, and a block used on other streams freed during the capture, are held for the graph until
  // release_graph_blocks().
  //
  // Note [Graph pools outlive memory pressure]: a graph replays the addresses it was captured with, so every
  // block it may write must stay the process's until it is destroyed, also when memory runs short. Those are
  // the capture stream's free blocks (its pool is the graph's private pool: any of them may be one a capture
  // used), the held blocks above, and live blocks (never freed by anyone but their owner). So from
  // begin_capture on, the capture stream's pool is a graph pool: empty_cache() and the out-of-memory retry
  // return the other pools' cached blocks to the system and keep the graph pools' (and the held blocks), and
  // an allocation that still fails says how much they keep. release_graph_blocks() ends that, as PyTorch's
  // caching allocator frees a graph's private pool only once no graph uses it.
  void begin_capture(const Stream& stream) {
    std::lock_guard<std::mutex> lock(mu_);
    CZ_CHECK(home_streams_, "{} allocator: a CUDA graph captures device memory only", name_);
    CZ_CHECK(!capture_, "{} allocator: a CUDA graph capture is already under way", name_);
    capture_ = true;
    capture_home_ = stream.handle;
    if (std::find(graph_homes_.begin(), graph_homes_.end(), stream.handle) == graph_homes_.end())
      graph_homes_.push_back(stream.handle);
  }
  void end_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    capture_ = false;
    capture_home_ = nullptr;
  }
  // Once no graph that was captured can run again (destroyed, and the device synchronised): the held blocks
  // go back to their home pools, blocks still live from a capture become ordinary ones, and the graph pools
  // ordinary pools (Note [Graph pools outlive memory pressure]).
  void release_graph_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    CZ_CHECK(!capture_, "{} allocator: release_graph_blocks during a capture", name_);
    for (const Pending& h : graph_held_) free_[{h.home, h.cls}].push_back(h.ptr);
    graph_held_.clear();
    for (auto& [ptr, b] : live_) b.graph = false;
    graph_homes_.clear();
  }

  MemoryStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

  // For tests: blocks waiting for events, and blocks cached for reuse.
  size_t num_pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }
  size_t num_cached() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [key, blocks] : free_) n += blocks.size();
    return n;
  }
  size_t num_graph_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return graph_held_.size();
  }
  // Cached bytes that empty_cache() and the out-of-memory retry keep for live graphs.
  int64_t kept_for_graphs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return graph_kept_bytes();
  }

 private:
  struct Block {
    size_t cls;
    void* home;                   // home stream handle; nullptr without home streams
    std::vector<Stream> streams;  // other streams recorded with record_stream
    bool graph = false;           // allocated during a capture for another pool than the capture stream's
  };
  struct Pending {
    void* ptr;
    size_t cls;
    void* home;
    std::vector<Event> events;
  };
  // Ordered by home, then class, so that a pool's classes from `cls` up are one range (Note [Pinned blocks]).
  struct PoolKey {
    void* home;
    size_t cls;
  };
  struct PoolKeyLess {
    bool operator()(const PoolKey& a, const PoolKey& b) const {
      if (a.home != b.home) return std::less<void*>()(a.home, b.home);
      return a.cls < b.cls;
    }
  };

  void* home_of(const Stream& s) const { return home_streams_ ? s.handle : nullptr; }

  // A cached block of `home`'s pool for a request of class `cls`: of that class exactly with home streams;
  // without, the smallest free one of at most twice it (Note [Pinned blocks]). `got`: its class.
  void* take_cached(void* home, size_t cls, size_t& got) {
    const size_t largest = home_streams_ ? cls : 2 * cls;
    for (auto it = free_.lower_bound({home, cls}); it != free_.end() && it->first.home == home; ++it) {
      if (it->first.cls > largest) break;
      if (it->second.empty()) continue;
      void* p = it->second.back();
      it->second.pop_back();
      got = it->first.cls;
      return p;
    }
    return nullptr;
  }

  bool graph_pool(void* home) const {
    return std::find(graph_homes_.begin(), graph_homes_.end(), home) != graph_homes_.end();
  }
  int64_t graph_kept_bytes() const {
    int64_t n = 0;
    for (const auto& [key, blocks] : free_)
      if (graph_pool(key.home)) n += int64_t(key.cls * blocks.size());
    for (const Pending& h : graph_held_) n += int64_t(h.cls);
    return n;
  }

  // Moves pending blocks whose events have all completed to their pools; with `wait`, waits for all of them.
  void process_pending(bool wait) {
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      bool done = true;
      for (const Event& ev : p.events) {
        if (wait) {
          backend_.synchronize(ev);
        } else if (!backend_.query(ev)) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      for (const Event& ev : p.events) backend_.recycle(ev);
      free_[{p.home, p.cls}].push_back(p.ptr);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  // Waits for pending blocks, then returns every cached block to the system but the graph pools'
  // (Note [Graph pools outlive memory pressure]). Caller holds mu_.
  void release_cache() {
    process_pending(/*wait=*/true);
    for (auto it = free_.begin(); it != free_.end();) {
      if (graph_pool(it->first.home)) {
        ++it;
        continue;
      }
      std::vector<void*>& blocks = it->second;
      while (!blocks.empty()) {  // one at a time, so a failure leaves the statistics true
        backend_.system_free(blocks.back());
        blocks.pop_back();
        stats_.reserved_bytes -= int64_t(it->first.cls);
      }
      it = free_.erase(it);
    }
  }

  // On failure, waits for pending frees, returns the cache (less the graph pools) to the system and tries
  // once more.
  void* system_alloc(size_t cls, size_t requested) {
    if (void* p = backend_.system_alloc(cls)) return p;
    if (capture_)  // freeing the cache would end the capture
      backend_.out_of_memory(cls, requested, stats_, graph_kept_bytes());
    release_cache();
    if (void* p = backend_.system_alloc(cls)) return p;
    backend_.out_of_memory(cls, requested, stats_, graph_kept_bytes());
  }

  Backend backend_;
  const bool home_streams_;
  const std::string name_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::map<PoolKey, std::vector<void*>, PoolKeyLess> free_;
  std::vector<Pending> pending_;
  std::vector<Pending> graph_held_;  // Note [Allocations during capture] (no events)
  bool capture_ = false;
  void* capture_home_ = nullptr;
  std::vector<void*> graph_homes_;  // Note [Graph pools outlive memory pressure]: streams captured on
  MemoryStats stats_;
};

}  // namespace cz::cuda
