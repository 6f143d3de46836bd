// A replay of allocations through a caching allocator of the kind in src/tensor/allocator.*: every request
// is rounded to its size class (round_to_size_class), freed blocks are cached by exact class and handed out
// again, and the peak of bytes held by live blocks is recorded with what was live at that moment. The
// planner drives it with the allocations one training step makes (step_replay.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace cz::plan {

// What a buffer is for; the rows of the plan. bucket: gradient buckets (and stage 0-1's cast copies); gather:
// stage-3 gathered units; scratch: the communicator's ring scratch; checkpoint: a background checkpoint
// save's host copy of this rank's state.
enum class Use : uint8_t { state, input, saved, transient, workspace, bucket, gather, scratch, checkpoint };
inline constexpr int kNumUses = 9;

struct LiveBuffer {
  const char* what;
  int64_t bytes;
  Use use;
  int part;  // network part for saved activations, -1 otherwise
};

struct TraceSnapshot {
  int64_t total = 0;                    // class-rounded bytes of live blocks (what the allocator counts)
  std::array<int64_t, kNumUses> raw{};  // requested bytes of live blocks, by use
  std::vector<int64_t> saved_by_part;   // requested bytes of live saved activations, by network part
  int64_t page_rounding = 0;            // see MemoryEvents::MemoryEvents
  int where = -1;                       // label of the op running (MemoryEvents::at)
  int64_t event = -1;                   // index of the allocation that reached it
};

// One request or return of a block, for the op-by-op comparison with the allocator's own log (Note [Allocator
// event log]; Note [One step, two descriptions] in step_replay.cpp).
struct TraceEvent {
  bool alloc;     // false: the block's last reference went
  int32_t block;  // MemoryEvents::Id: which alloc a release returns
  int64_t bytes;  // as requested
  int where;      // label of the op running (MemoryEvents::at)
  Use use;
  const char* what;
  // Whose thread makes the request: nullptr the training thread's; else the communication thread of the
  // communicator of that label (dist::Communicator::label(), dist::current_communicator() on that thread).
  const char* thread;
};

class MemoryEvents {
 public:
  using Id = int32_t;
  // `parts`: network parts saved activations are attributed to. `page_bytes` > 0: also sum, over live
  // blocks of at least half a page, the rounding of each block up to whole pages (how the CUDA driver backs
  // a cudaMalloc).
  explicit MemoryEvents(int parts, int64_t page_bytes = 0);

  // `thread`: TraceEvent::thread (a communicator's label, or nullptr for the training thread).
  Id alloc(int64_t bytes, Use use, const char* what, int part = -1, const char* thread = nullptr);
  void retain(Id id);
  void release(Id id);                    // the block returns to the cache when its last reference goes
  void at(int label) { where_ = label; }  // labels are the caller's (an index into its own list)

  // Records the live buffers when allocation number `event` (TraceSnapshot::event) happens.
  void capture_at(int64_t event) { capture_event_ = event; }
  const std::vector<LiveBuffer>& captured() const { return captured_; }

  const TraceSnapshot& peak() const { return peak_; }
  TraceSnapshot now() const;
  int64_t reserved_peak() const { return reserved_; }  // bytes ever taken from the system (never returned)
  void reset_peak() { peak_ = now(); }
  // Appends every alloc and release from now on to `log` (nullptr: stops). Off, it costs a null test.
  void log_to(std::vector<TraceEvent>* log) { log_ = log; }

 private:
  struct Block {
    int64_t bytes, cls;
    Use use;
    int part;
    int refs;
    const char* what;
    const char* thread;
  };
  int64_t page_extra(int64_t cls) const;

  int64_t page_bytes_;
  std::vector<Block> blocks_;
  TraceSnapshot live_, peak_;
  std::unordered_map<int64_t, int64_t> cached_;  // size class -> free blocks
  int64_t reserved_ = 0;
  int64_t events_ = 0;
  int64_t capture_event_ = -1;
  std::vector<LiveBuffer> captured_;
  int where_ = -1;
  std::vector<TraceEvent>* log_ = nullptr;
};

}  // namespace cz::plan
