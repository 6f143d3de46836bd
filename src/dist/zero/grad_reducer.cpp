// The gradient reducer's hooks, buckets and collectives, in the order ReduceSchedule decides (at most
// kMaxInFlight collectives in flight; Note [One schedule] in schedule.cpp).
//
// Note [Cross all-reduce]: on a 2-D mesh a partition's reduction is two collectives: the reduce-scatter in
// the shard group, then the all-reduce of this rank's chunk across the replication group. The second may only
// start once the first has written the chunk, and the training thread must not block for it: on the CPU each
// group's collectives run on their own communication thread, so the reducer launches a partition's all-reduce
// from its in-flight queue as soon as it sees the reduce-scatter completed (Work::is_completed, checked at
// every launch and grad-ready hook), and only the wait for the oldest partition blocks, as without a mesh. On
// CUDA the same test queries the reduce-scatter's event: launching at once would order the compute stream
// (Work::wait) behind a collective still running, stalling backward's kernels. The all-reduces are launched
// in the partitions' launch order, which is the same on every rank (timing decides only when, never the
// order), so they match across the group. Both average: the replication group's mean of the shard groups'
// means (all of S ranks) is the world mean.
#include "dist/zero/grad_reducer.h"

#include <algorithm>
#include <cstring>

#include "dist/zero/held_bytes.h"
#include "tensor/autograd/engine.h"
#include "tensor/trace.h"

namespace cz::zero {
GradReducer::GradReducer(const ZeroLayout& layout, std::vector<Tensor> params, Tensor grads,
                         dist::ProcessGroup group, dist::ProcessGroup replicate, CommMeter& meter,
                         StepSchedule& schedule)
    : layout_(layout),
      params_(std::move(params)),
      grads_(std::move(grads)),
      group_(std::move(group)),
      replicate_(std::move(replicate)),
      meter_(meter),
      schedule_(schedule),
      defer_zero_(group_.device().is_cpu()) {
  CZ_ASSERT(group_.size() == plan().reduce_group(),
            "reducer: a group of {} for the plan's reductions over {}", group_.size(), plan().reduce_group());
  buckets_.resize(layout_.partitions.size());
  arrived_.assign(params_.size(), 0);
  for (const Partition& part : layout_.partitions) {
    auto& gaps = padding_.emplace_back();
    int64_t at = part.begin;
    for (size_t i = part.first_param; i < part.end_param; ++i) {
      const FlatSegment& s = layout_.flat.segments[i];
      if (s.offset > at) gaps.emplace_back(at - part.begin, s.offset - at);
      at = s.offset + s.numel;
    }
    if (part.begin + part.numel > at) gaps.emplace_back(at - part.begin, part.begin + part.numel - at);
  }
  for (size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(params_[i].register_grad_ready_hook([this, i](Tensor& t) { on_grad_ready(i, t); }));
}

GradReducer::~GradReducer() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_grad_ready_hook(hooks_[i]);
  // Collectives still in flight (an exception mid-backward) must not outlive the buffers they use.
  for (auto& f : in_flight_)
    for (auto* w : {&f.work, &f.cross})  // (a quantized one waits in its destructor)
      if (*w) try {
          (*w)->wait();
        } catch (...) {
        }
}

namespace {
// Elements [offset, offset + n) of a contiguous CPU buffer to zero (all-zero bits in every float dtype).
void zero_elements(const Tensor& buf, int64_t offset, int64_t n) {
  const size_t es = dtype_size(buf.dtype());
  std::memset(static_cast<char*>(buf.raw_data()) + size_t(offset) * es, 0, size_t(n) * es);
}
}  // namespace

void GradReducer::begin_step() {
  NoGradGuard no_grad;
  std::fill(arrived_.begin(), arrived_.end(), 0);
  if (!grads_.defined()) return;
  if (!defer_zero_) {
    grads_.zero_();
    return;
  }
  for (size_t p = 0; p < layout_.partitions.size(); ++p)
    for (const auto& [offset, n] : padding_[p])
      zero_elements(grads_, layout_.partitions[p].begin + offset, n);
  for (Tensor& param : params_) param.defer_grad_zero();
}

Tensor& GradReducer::bucket(size_t p) {
  if (!buckets_[p].defined()) {  // at its first gradient (none arrived: the gradient is zero on this rank)
    const int64_t numel = layout_.partitions[p].numel;
    if (defer_zero_) {
      buckets_[p] = empty({numel}, plan().bucket_dtype(), group_.device());
      for (const auto& [offset, n] : padding_[p]) zero_elements(buckets_[p], offset, n);
    } else {
      buckets_[p] = zeros({numel}, plan().bucket_dtype(), group_.device());
    }
    meter_.hold(held_bytes(buckets_[p]));
  }
  return buckets_[p];
}

void GradReducer::zero_missing(size_t p, const Tensor& buf) {
  const Partition& part = layout_.partitions[p];
  for (size_t i = part.first_param; i < part.end_param; ++i) {
    const FlatSegment& s = layout_.flat.segments[i];
    if (plan().buckets()) {
      if (!arrived_[i]) zero_elements(buf, s.offset - part.begin, s.numel);
      arrived_[i] = 0;
    } else {
      params_[i].grad();  // zeroes a .grad no gradient reached since begin_step
    }
  }
}

void GradReducer::on_grad_ready(size_t i, Tensor& param) {
  advance();
  if (plan().buckets()) {
    NoGradGuard no_grad;
    const Partition& part = layout_.partitions[schedule_.partition_of(i)];
    const FlatSegment& s = layout_.flat.segments[i];
    Tensor& b = bucket(schedule_.partition_of(i));
    const Tensor g = param.grad();
    if (g.defined()) {
      b.narrow(0, s.offset - part.begin, s.numel).view(s.shape).copy_streaming_(g);
      arrived_[i] = 1;
    }
    param.set_grad(Tensor());
  }
  schedule_.grad_ready(i);
}

void GradReducer::prepare(size_t p) {
  NoGradGuard no_grad;
  const Partition& part = layout_.partitions[p];
  prepared_ = plan().buckets() ? bucket(p) : grads_.narrow(0, part.begin, part.numel);
  if (defer_zero_) zero_missing(p, prepared_);
  if (!plan().buckets() && prepared_.dtype() != plan().bucket_dtype()) {
    prepared_ = prepared_.to(plan().bucket_dtype());
    meter_.hold(held_bytes(prepared_));
  }
}

void GradReducer::launch(size_t p) {
  const trace::Label label("bucket", p);  // --trace: the collectives it launches (Note [Trace blocks])
  NoGradGuard no_grad;
  const Partition& part = layout_.partitions[p];
  Tensor buf = std::move(prepared_);
  prepared_ = Tensor();
  dist::WorkHandle w;
  const int64_t bytes = part.numel * int64_t(dtype_size(plan().bucket_dtype()));
  const int64_t qb = plan().quant_block();
  std::unique_ptr<QuantizedReduceScatter> quantized;
  std::unique_ptr<QuantizedAllReduce> quantized_all;
  std::unique_ptr<TwoHopQuantizedReduceScatter> two_hop;
  std::unique_ptr<TwoHopQuantizedAllReduce> two_hop_all;
  switch (plan().reduce_kind()) {
    case ReduceKind::two_hop_reduce_scatter:
      two_hop = std::make_unique<TwoHopQuantizedReduceScatter>(group_, host_, cross_, hosts_, buf,
                                                               layout_.chunk(p), qb, meter_);
      break;
    case ReduceKind::two_hop_all_reduce:
      two_hop_all =
          std::make_unique<TwoHopQuantizedAllReduce>(group_, host_, cross_, hosts_, buf, qb, meter_);
      break;
    case ReduceKind::quantized_reduce_scatter:
      quantized = std::make_unique<QuantizedReduceScatter>(group_, buf, layout_.chunk(p), qb, meter_);
      break;
    case ReduceKind::quantized_all_reduce:
      quantized_all = std::make_unique<QuantizedAllReduce>(group_, buf, qb, meter_);
      break;
    case ReduceKind::reduce_scatter: {
      Tensor mine = buf.narrow(0, own_offset(p), layout_.chunk(p));
      w = group_.reduce_scatter(buf, mine, dist::ReduceOp::avg);
      meter_.sent(group_, bytes, dist::Collective::reduce_scatter);
      break;
    }
    case ReduceKind::all_reduce:
      w = group_.all_reduce(buf, dist::ReduceOp::avg);
      meter_.sent(group_, bytes, dist::Collective::all_reduce);
      break;
  }
  // Flat (or stage 0): nothing to all-reduce across replicas.
  in_flight_.push_back({p, std::move(w), buf, nullptr, !plan().sharded() || replicate_.size() == 1,
                        std::move(quantized), std::move(quantized_all), std::move(two_hop),
                        std::move(two_hop_all)});
  advance();
}

void GradReducer::launch_cross(InFlight& f) {
  const trace::Label label("bucket", f.partition);
  NoGradGuard no_grad;
  meter_.wait(f.work);  // completed (advance), or the oldest, which finish() waits for anyway
  f.work.reset();
  Tensor mine = f.buffer.narrow(0, own_offset(f.partition), layout_.chunk(f.partition));
  f.cross = replicate_.all_reduce(mine, dist::ReduceOp::avg);
  meter_.sent(replicate_, mine.nbytes(), dist::Collective::all_reduce);
  f.crossed = true;
}

void GradReducer::advance() {
  for (InFlight& f : in_flight_) {
    // Two hops: the second as soon as the first has arrived, in launch order (Note [Two-hop quantized
    // reduction]).
    if (f.two_hop) {
      const trace::Label label("bucket", f.partition);  // not the launching bucket's
      if (!f.two_hop->post_hop2_if_ready()) break;
    }
    if (f.crossed) continue;
    if (f.work && !f.work->is_completed()) break;
    launch_cross(f);
  }
}

void GradReducer::finish(size_t p) {
  CZ_ASSERT(!in_flight_.empty() && in_flight_.front().partition == p,
            "reducer: partition {} is not the oldest", p);
  advance();
  if (!in_flight_.front().crossed) launch_cross(in_flight_.front());  // the oldest: wait for it
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const trace::Label label("bucket", p);  // the quantized paths' second exchanges
  meter_.wait(f.work);
  meter_.wait(f.cross);
  if (f.quantized) f.quantized->finish(1.0 / group_.size());  // the average, as ReduceOp::avg
  if (f.quantized_all) f.quantized_all->finish(1.0 / group_.size());
  if (f.two_hop) f.two_hop->finish(1.0 / group_.size());
  if (f.two_hop_all) f.two_hop_all->finish(1.0 / group_.size());
  NoGradGuard no_grad;
  const Tensor mine = f.buffer.narrow(0, own_offset(p), layout_.chunk(p));  // this rank's averaged chunk
  const bool converted = !plan().buckets() && f.buffer.dtype() != grads_.dtype();
  if (sink_)
    sink_(p, mine, schedule_.last_micro_step());
  else if (converted)
    grad_chunk(p).copy_(mine);
  if (plan().buckets()) {
    meter_.hold(-held_bytes(buckets_[p]));
    buckets_[p] = Tensor();
  } else if (converted) {
    meter_.hold(-held_bytes(f.buffer));
  }
}

Tensor GradReducer::grad_chunk(size_t p) const {
  return grads_.narrow(0, layout_.partitions[p].begin + own_offset(p), layout_.chunk(p));
}

int64_t GradReducer::state_bytes() const {
  return held_bytes(grads_);
}

}  // namespace cz::zero
