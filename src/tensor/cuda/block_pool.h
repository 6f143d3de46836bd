// The bookkeeping of the CUDA caching allocators (Note [Cross-stream frees] in allocator.cpp): live blocks,
// free blocks pooled per (home stream, size class), blocks waiting for events on other streams, statistics.
// It calls no CUDA function itself, so tests drive it on a CPU with fake streams and events.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/stream.h"

namespace cz::cuda {

// `Backend` does the system side; the pool calls it with its lock held, so it needs no lock of its own:
//   using Event = ...;                                  // a copyable handle
//   Event record(const Stream& s);                      // an event recorded on `s` now (throws on failure)
//   bool query(const Event& e);                         // has it completed (never blocks; throws on error)
//   void synchronize(const Event& e);                   // blocks until it has
//   void recycle(const Event& e);                       // the pool is done with it
//   void* system_alloc(size_t cls);                     // nullptr when out of memory; throws on other errors
//   void system_free(void* p);
//   [[noreturn]] void out_of_memory(size_t cls, size_t requested, const MemoryStats& stats);
//   void warn_release_failure(const std::exception& e) noexcept;
template <class Backend>
class BlockPool {
 public:
  using Event = typename Backend::Event;

  // With `home_streams` false (pinned host memory) every block shares one pool: the host writes a block at
  // once, ordered after nothing on any stream.
  // `name` ("cuda:0", "pinned host") is for messages.
  BlockPool(Backend backend, bool home_streams, std::string name)
      : backend_(std::move(backend)), home_streams_(home_streams), name_(std::move(name)) {}

  // A block of round_to_size_class(nbytes) bytes for work on `stream`.
  void* allocate(size_t nbytes, const Stream& stream) {
    const size_t cls = round_to_size_class(nbytes);
    void* home = home_of(stream);
    std::lock_guard<std::mutex> lock(mu_);
    if (!capture_) process_pending(/*wait=*/false);  // Note [Allocations during capture]: no event queries
    void* p = take_cached(home, cls);
    if (!p) {
      p = system_alloc(cls, nbytes);
      stats_.reserved_bytes += int64_t(cls);
      stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
      ++stats_.num_system_allocs;
    }
    // Note [Allocations during capture]: a block the graph may use that is not of the capture stream's pool.
    live_.emplace(p, Block{cls, home, {}, capture_ && home != capture_home_});
    stats_.allocated_bytes += int64_t(cls);
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

  // Waits for pending blocks, then returns every cached block to the system.
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
  void begin_capture(const Stream& stream) {
    std::lock_guard<std::mutex> lock(mu_);
    CZ_CHECK(home_streams_, "{} allocator: a CUDA graph captures device memory only", name_);
    CZ_CHECK(!capture_, "{} allocator: a CUDA graph capture is already under way", name_);
    capture_ = true;
    capture_home_ = stream.handle;
  }
  void end_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    capture_ = false;
    capture_home_ = nullptr;
  }
  // Once no graph that was captured can run again (destroyed, and the device synchronised): the held blocks
  // go back to their home pools, and blocks still live from a capture become ordinary ones.
  void release_graph_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    CZ_CHECK(!capture_, "{} allocator: release_graph_blocks during a capture", name_);
    for (const Pending& h : graph_held_) free_[{h.home, h.cls}].push_back(h.ptr);
    graph_held_.clear();
    for (auto& [ptr, b] : live_) b.graph = false;
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

  void* home_of(const Stream& s) const { return home_streams_ ? s.handle : nullptr; }

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

  // Waits for pending blocks, then returns every cached block to the system. Caller holds mu_.
  void release_cache() {
    process_pending(/*wait=*/true);
    for (auto& [key, blocks] : free_) {
      while (!blocks.empty()) {  // one at a time, so a failure leaves the statistics true
        backend_.system_free(blocks.back());
        blocks.pop_back();
        stats_.reserved_bytes -= int64_t(key.cls);
      }
    }
    free_.clear();
  }

  // On failure, waits for pending frees, returns the whole cache to the system and tries once more.
  void* system_alloc(size_t cls, size_t requested) {
    if (void* p = backend_.system_alloc(cls)) return p;
    if (capture_) backend_.out_of_memory(cls, requested, stats_);  // freeing the cache would end the capture
    release_cache();
    if (void* p = backend_.system_alloc(cls)) return p;
    backend_.out_of_memory(cls, requested, stats_);
  }

  Backend backend_;
  const bool home_streams_;
  const std::string name_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<PoolKey, std::vector<void*>, PoolKeyHash> free_;
  std::vector<Pending> pending_;
  std::vector<Pending> graph_held_;  // Note [Allocations during capture] (no events)
  bool capture_ = false;
  void* capture_home_ = nullptr;
  MemoryStats stats_;
};

}  // namespace cz::cuda
