// The ZeRO engine's scheduling rules, written once (Note [One schedule]): small types that hold no tensors
// and emit events. GradReducer and UnitGatherer carry the events out on real buffers and collectives; the
// planner's replay (plan/engine_events.cpp) on its MemoryEvents; the what-if (plan/what_if.cpp) on its
// timelines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "dist/zero/partition.h"

namespace cz::zero {

class GatherCodec;

// The ranges of --stage and --prefetch: the flag table (train/flags_zero.cpp) checks them, once; library code
// that is handed a stage or a prefetch depth asserts against these same constants.
inline constexpr int kMaxStage = 3;
inline constexpr int kMaxPrefetch = 64;

// At most this many gradient reductions are in flight: launching another first finishes the oldest, which
// bounds the bucket memory (Note [What the engine allocates]: two in flight and one filling).
inline constexpr size_t kMaxInFlight = 2;

// How a partition's gradients are reduced. One more kind of reduction (a two-hop quantized path, say) is one
// more value here and one more case in each carrier's launch.
enum class ReduceKind {
  all_reduce,                // stage 0
  reduce_scatter,            // stages 1-3 (then the chunk's all-reduce across a mesh's replication group)
  quantized_all_reduce,      // stage 0, --reduce-dtype int8 (Note [Quantized all-reduce])
  quantized_reduce_scatter,  // stages 1-3, --reduce-dtype int8 (Note [Quantized reduction])
  two_hop_reduce_scatter,    // ... in two hops, host then cross (Note [Two-hop quantized reduction])
  two_hop_all_reduce,        // stage 0 in two hops (Note [Two-hop quantized all-reduce])
};
// `scatter`: stages 1-3; `quant_block` > 0: INT8 records; `group`: the ranks of the reduction (a group of one
// has nothing to quantize); `two_hop`: the quantized reduce-scatter goes in two hops (Note [Two-hop choice]).
ReduceKind reduce_kind(bool scatter, int64_t quant_block, int group, bool two_hop = false);

// The layout's alignment and unsharded padding (Note [Flat buffers] in partition.h): INT8 reductions align
// to the quantization block and, unsharded (stage 0), pad each partition over the world (the all-reduce's
// records split it in `world` chunks); unsharded, nothing is gathered, so 16; else what the gather codec
// needs.
struct LayoutRule {
  int64_t align = 16;
  int pad_ranks = 1;
};
LayoutRule layout_rule(bool sharded, bool reduce_int8, int64_t quant_block, const GatherCodec& codec,
                       int world);

// One scheduling decision, as the event log records it (Note [One schedule]).
struct ScheduleEvent {
  enum Kind : char { launch = 'L', finish = 'F', gather = 'G', use = 'U', release = 'R' } kind;
  size_t index;  // the partition (unit)
  bool operator==(const ScheduleEvent&) const = default;
};
// Where the schedules of this process append their events (null: nowhere). For tests: one training thread.
void set_schedule_log(std::vector<ScheduleEvent>* log);

// The reducer's rules: which gradients count (every micro-step with buckets, else the last only), when a
// partition is launched (its last gradient arrived, or flush), the in-flight limit, and the order in which
// reductions finish (launch order).
class ReduceSchedule {
 public:
  struct Sink {
    virtual ~Sink() = default;
    virtual void prepare(size_t p) = 0;  // before anything in flight is finished: its buffer
    virtual void launch(size_t p) = 0;   // its collective
    virtual void finish(size_t p) = 0;   // the oldest in flight: wait for it and hand the result on
  };
  // `buckets`: stages 2-3 (Note [ZeRO step]).
  ReduceSchedule(const ZeroLayout& layout, bool buckets);
  void begin_backward(bool last_micro_step);
  bool last_micro_step() const { return last_; }
  // Whether this micro-step's gradients are reduced now.
  bool counts() const { return buckets_ || last_; }
  size_t partition_of(size_t param) const { return partition_of_[param]; }
  // Parameter `param`'s gradient arrived (and, with buckets, is in its bucket).
  void grad_ready(size_t param, Sink& sink);
  // After backward: the partitions not launched yet (some gradient missing), then everything in flight.
  void flush(Sink& sink);
  bool in_flight() const { return !in_flight_.empty(); }

 private:
  void launch(size_t p, Sink& sink);
  void finish_oldest(Sink& sink);
  const ZeroLayout& layout_;
  bool buckets_;
  bool last_ = true;
  std::vector<size_t> partition_of_;
  std::vector<int> remaining_;
  std::vector<bool> launched_;
  std::deque<size_t> in_flight_;
};

// Stage 3's gather rules (Note [Stage-3 units] in unit_gatherer.cpp): gather before use, prefetch the next
// `prefetch` units of the recorded order ahead (the previous ones in backward), release after forward and
// once the unit's gradients are launched.
class UnitSchedule {
 public:
  struct Sink {
    virtual ~Sink() = default;
    virtual void gather(size_t u) = 0;   // launch the unit's all-gather
    virtual void use(size_t u) = 0;      // wait for it (the unit is needed now)
    virtual void release(size_t u) = 0;  // free it (waiting first if it is still in flight)
  };
  UnitSchedule(size_t units, int prefetch);
  // The what-if's steady state: the order already recorded.
  void assume_order(std::vector<size_t> order);
  void begin_backward() { backward_ = true; }
  void end_backward(bool finished);
  bool backward() const { return backward_; }
  bool resident(size_t u) const { return state_[u] != State::released; }
  void forward_pre(size_t u, Sink& sink);
  void forward_post(size_t u, Sink& sink);
  void backward_pre(size_t u, Sink& sink);
  void release(size_t u, Sink& sink);  // also: the unit's gradients were launched
  void release_all(Sink& sink);

 private:
  enum class State { released, gathering, resident };
  void gather(size_t u, Sink& sink);
  void use(size_t u, Sink& sink);
  void prefetch_after(size_t u, bool backward, Sink& sink);
  int prefetch_;
  bool backward_ = false;
  bool recording_ = true;  // the first forward records the unit order
  std::vector<State> state_;
  std::vector<size_t> order_, position_;
};

// Stages 1-2's gathers after the update (Note [Overlapped parameter all-gather] in engine.cpp): every
// partition's all-gather launched in partition order once the update is done; with records (quantized
// gathers) each then waited for and decoded at once, in order; else each waited for at the first forward of
// a unit (Note [ConvNeXt structure]) holding one of its parameters, in partition order.
class ChunkSchedule {
 public:
  struct Sink {
    virtual ~Sink() = default;
    virtual void gather_partition(size_t p) = 0;  // launch its all-gather
    virtual void use_partition(size_t p) = 0;     // wait for it (and decode it)
  };
  ChunkSchedule(size_t partitions, bool decode_at_once);
  void after_update(Sink& sink);
  // A unit's forward is about to run: `parts` its partitions, ascending.
  void forward_pre(const std::vector<size_t>& parts, Sink& sink);
  void use_all(Sink& sink);  // everything in flight waited for (evaluation, a checkpoint, the destructor)

 private:
  bool at_once_;
  std::vector<bool> pending_;  // gathered, not yet used
};

}  // namespace cz::zero
