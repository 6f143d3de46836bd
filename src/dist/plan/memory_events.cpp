// The allocation replay behind the planner (memory_events.h).
#include "dist/plan/memory_events.h"

#include "tensor/allocator.h"
#include "tensor/check.h"

namespace cz::plan {

MemoryEvents::MemoryEvents(int parts, int64_t page_bytes) : page_bytes_(page_bytes) {
  live_.saved_by_part.assign(size_t(parts), 0);
  peak_ = live_;
}

int64_t MemoryEvents::page_extra(int64_t cls) const {
  if (page_bytes_ <= 0 || 2 * cls < page_bytes_) return 0;
  return (cls + page_bytes_ - 1) / page_bytes_ * page_bytes_ - cls;
}

MemoryEvents::Id MemoryEvents::alloc(int64_t bytes, Use use, const char* what, int part, const char* thread) {
  CZ_ASSERT(bytes >= 0, "negative allocation {} for {}", bytes, what);
  const auto cls = int64_t(round_to_size_class(size_t(bytes)));
  if (int64_t& free_blocks = cached_[cls]; free_blocks > 0) {
    --free_blocks;
  } else {
    reserved_ += cls;
  }
  const Id id = Id(blocks_.size());
  blocks_.push_back({bytes, cls, use, part, 1, what, thread});
  live_.total += cls;
  live_.raw[size_t(use)] += bytes;
  if (use == Use::saved) live_.saved_by_part.at(size_t(part)) += bytes;
  live_.page_rounding += page_extra(cls);
  live_.where = where_;
  live_.event = events_;
  if (events_ == capture_event_) {
    for (const Block& b : blocks_)
      if (b.refs > 0) captured_.push_back({b.what, b.bytes, b.use, b.part});
  }
  ++events_;
  if (log_) log_->push_back({true, id, bytes, where_, use, what, thread});
  if (live_.total > peak_.total) peak_ = live_;
  return id;
}

void MemoryEvents::retain(Id id) {
  Block& b = blocks_.at(size_t(id));
  CZ_ASSERT(b.refs > 0, "retain of freed block {} ({})", id, b.what);
  ++b.refs;
}

void MemoryEvents::release(Id id) {
  Block& b = blocks_.at(size_t(id));
  CZ_ASSERT(b.refs > 0, "release of freed block {} ({})", id, b.what);
  if (--b.refs > 0) return;
  if (log_) log_->push_back({false, id, b.bytes, where_, b.use, b.what, b.thread});
  ++cached_[b.cls];
  live_.total -= b.cls;
  live_.raw[size_t(b.use)] -= b.bytes;
  if (b.use == Use::saved) live_.saved_by_part[size_t(b.part)] -= b.bytes;
  live_.page_rounding -= page_extra(b.cls);
}

TraceSnapshot MemoryEvents::now() const {
  TraceSnapshot s = live_;
  s.where = where_;
  return s;
}

}  // namespace cz::plan
