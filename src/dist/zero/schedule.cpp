// Note [One schedule]
// The engine's scheduling rules (which gradient launches which reduction, the in-flight limit, stage 3's
// gathers, prefetches and releases, the layout's alignment) decide both what a step allocates and when its
// collectives run. Three programs need them: the engine (zero/grad_reducer.cpp, unit_gatherer.cpp), the
// planner's replay of a step (plan/engine_events.cpp) and the what-if's timelines (plan/what_if.cpp). They
// live here once, in types that hold no tensors: each program drives them from the same points (the
// parameters' grad-ready hooks, the units' module hooks, flush) and carries out the events they emit on what
// it has (buffers and collectives, a MemoryEvents, simulated timelines). A change to a rule is made here and
// every program follows; StepEvents (tests/dist/plan/test_step_events.cpp) checks that a real step and the
// planner's replay drive them alike, event by event. Every rank takes the same decisions in the same order:
// they depend on the order and counts of the hooks, never on timing, so the collectives match across ranks.
#include "dist/zero/schedule.h"

#include <algorithm>

#include "dist/zero/gather_codec.h"
#include "tensor/check.h"

namespace cz::zero {
namespace {
std::vector<ScheduleEvent>* g_log = nullptr;
void note(ScheduleEvent::Kind kind, size_t index) {
  if (g_log) g_log->push_back({kind, index});
}
}  // namespace

void set_schedule_log(std::vector<ScheduleEvent>* log) {
  g_log = log;
}

ReduceKind reduce_kind(bool scatter, int64_t quant_block, int group, bool two_hop) {
  if (quant_block > 0 && group > 1) {
    if (!scatter) return two_hop ? ReduceKind::two_hop_all_reduce : ReduceKind::quantized_all_reduce;
    return two_hop ? ReduceKind::two_hop_reduce_scatter : ReduceKind::quantized_reduce_scatter;
  }
  return scatter ? ReduceKind::reduce_scatter : ReduceKind::all_reduce;
}

LayoutRule layout_rule(bool sharded, bool reduce_int8, int64_t quant_block, const GatherCodec& codec,
                       int world) {
  if (reduce_int8) return {quant_block, sharded ? 1 : world};
  return {sharded ? codec.align() : 16, 1};
}

ReduceSchedule::ReduceSchedule(const ZeroLayout& layout, bool buckets) : layout_(layout), buckets_(buckets) {
  const size_t np = layout_.partitions.size();
  for (size_t p = 0; p < np; ++p)
    for (size_t i = layout_.partitions[p].first_param; i < layout_.partitions[p].end_param; ++i)
      partition_of_.push_back(p);
  remaining_.assign(np, 0);
  launched_.assign(np, false);
}

void ReduceSchedule::begin_backward(bool last_micro_step) {
  last_ = last_micro_step;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    remaining_[p] = int(layout_.partitions[p].end_param - layout_.partitions[p].first_param);
    launched_[p] = false;
  }
}

void ReduceSchedule::grad_ready(size_t param, Sink& sink) {
  const size_t p = partition_of_.at(param);
  if (counts() && --remaining_[p] == 0) launch(p, sink);
}

void ReduceSchedule::flush(Sink& sink) {
  if (counts())
    for (size_t p = 0; p < layout_.partitions.size(); ++p)
      if (!launched_[p]) launch(p, sink);
  while (!in_flight_.empty()) finish_oldest(sink);
}

void ReduceSchedule::launch(size_t p, Sink& sink) {
  launched_[p] = true;
  sink.prepare(p);
  while (in_flight_.size() >= kMaxInFlight) finish_oldest(sink);
  in_flight_.push_back(p);
  note(ScheduleEvent::launch, p);
  sink.launch(p);
}

void ReduceSchedule::finish_oldest(Sink& sink) {
  const size_t p = in_flight_.front();
  in_flight_.pop_front();
  note(ScheduleEvent::finish, p);
  sink.finish(p);
}

UnitSchedule::UnitSchedule(size_t units, int prefetch)
    : prefetch_(prefetch), state_(units, State::released), position_(units, 0) {}

void UnitSchedule::assume_order(std::vector<size_t> order) {
  order_ = std::move(order);
  for (size_t i = 0; i < order_.size(); ++i) position_.at(order_[i]) = i;
  recording_ = false;
}

void UnitSchedule::end_backward(bool finished) {
  backward_ = false;
  if (finished) recording_ = false;
}

void UnitSchedule::gather(size_t u, Sink& sink) {
  if (state_[u] != State::released) return;
  state_[u] = State::gathering;
  note(ScheduleEvent::gather, u);
  sink.gather(u);
}

void UnitSchedule::use(size_t u, Sink& sink) {
  gather(u, sink);
  if (state_[u] != State::gathering) return;
  state_[u] = State::resident;
  note(ScheduleEvent::use, u);
  sink.use(u);
}

void UnitSchedule::release(size_t u, Sink& sink) {
  if (state_[u] == State::released) return;
  state_[u] = State::released;
  note(ScheduleEvent::release, u);
  sink.release(u);
}

void UnitSchedule::release_all(Sink& sink) {
  for (size_t u = 0; u < state_.size(); ++u) release(u, sink);
}

void UnitSchedule::prefetch_after(size_t u, bool backward, Sink& sink) {
  if (recording_ || prefetch_ == 0) return;
  const int64_t at = int64_t(position_[u]), n = int64_t(order_.size());
  for (int64_t k = 1; k <= prefetch_; ++k) {
    const int64_t j = backward ? at - k : at + k;
    if (j < 0 || j >= n) break;
    gather(order_[size_t(j)], sink);
  }
}

void UnitSchedule::forward_pre(size_t u, Sink& sink) {
  if (recording_ && std::find(order_.begin(), order_.end(), u) == order_.end()) {
    position_[u] = order_.size();
    order_.push_back(u);
  }
  use(u, sink);
  prefetch_after(u, backward_, sink);
}

void UnitSchedule::forward_post(size_t u, Sink& sink) {
  if (!backward_) release(u, sink);
}

void UnitSchedule::backward_pre(size_t u, Sink& sink) {
  use(u, sink);
  prefetch_after(u, true, sink);
}

ChunkSchedule::ChunkSchedule(size_t partitions, bool decode_at_once)
    : at_once_(decode_at_once), pending_(partitions, false) {}

void ChunkSchedule::after_update(Sink& sink) {
  for (size_t p = 0; p < pending_.size(); ++p) {
    CZ_ASSERT(!pending_[p], "chunk schedule: partition {} gathered again before use", p);
    note(ScheduleEvent::gather, p);
    pending_[p] = true;
    sink.gather_partition(p);
  }
  if (at_once_) use_all(sink);
}

void ChunkSchedule::forward_pre(const std::vector<size_t>& parts, Sink& sink) {
  for (size_t p : parts)
    if (pending_[p]) {
      note(ScheduleEvent::use, p);
      pending_[p] = false;
      sink.use_partition(p);
    }
}

void ChunkSchedule::use_all(Sink& sink) {
  for (size_t p = 0; p < pending_.size(); ++p)
    if (pending_[p]) {
      note(ScheduleEvent::use, p);
      pending_[p] = false;
      sink.use_partition(p);
    }
}

}  // namespace cz::zero
