// ZeRO-3's parameter gatherer (UnitGatherer, unit_gatherer.h): gather before use, prefetch ahead, release
// after, as UnitSchedule decides (Note [One schedule] in schedule.cpp); this file carries it out.
//
// Note [Stage-3 units]: each unit's parameters view one buffer of the unit's full (padded) size whose
// Storage is released between uses (Note [Releasable storage]): the parameters and what autograd saved of
// them keep their identity while the bytes come and go. A unit is all-gathered from the ranks' chunks just
// before its forward (module forward-pre hook) and released after it (forward hook); gathered again when the
// gradient of its output arrives (backward-pre hook), and released once its gradients have been handed to
// their reduce-scatter (GradReducer::launch). The first forward records the order units run in; from then on
// the next `prefetch` units in that order (reversed in backward) are gathered ahead, so at most 1 + prefetch
// units are resident at a unit's hook, plus units waiting for their gradients in backward. Under activation
// checkpointing the recompute runs the forward hooks again during backward: the pre-hook gathers (if needed)
// and the post-hook keeps the unit, which backward is about to use. Every rank takes the same decisions in
// the same order (they depend on the order and the counts, never on timing), so the collectives match.
//
// Note [hpZ]: with --hpz (ZeRO++'s hierarchical partitioning) the primary shard stays over the world, as
// plain stage 3, and each unit's forward gather still crosses hosts; but once it has arrived the rank keeps
// a secondary copy of its host-local slice, slice l of R equal slices of the unit (R ranks per host, l this
// rank's index on its host), and backward's gather of the unit (activation checkpointing's recompute
// included) is an all-gather of those slices inside the host group, which never leaves the host. The slices
// are copies of the gathered unit, so backward sees the very values forward did: results are bit-identical
// to plain stage 3. After an update (and an EMA swap or a load) the slices are stale until the next forward
// gathers again; a unit whose slice is stale is gathered from the primary shard. Memory: the secondary
// copies of all units are allocated once, Psi/R elements in the compute dtype per rank (Psi the padded
// model), against the primary shard's Psi/W, kept for the run (the planner counts them as parameters:
// Note [ZeRO memory model]). Cross-host bytes per step fall from 3 to 2 all-gathers' worth (forward's
// gather and the gradients' reduce-scatter; backward's gather stays on the host).
#include "dist/zero/unit_gatherer.h"

#include <algorithm>

#include "dist/zero/engine.h"
#include "dist/zero/held_bytes.h"
#include "tensor/autograd/engine.h"
#include "tensor/trace.h"

namespace cz::zero {

int64_t hpz_secondary_numel(const ZeroLayout& layout, int ranks_per_host) {
  int64_t n = 0;
  for (const Partition& p : layout.partitions) n += p.numel / ranks_per_host;
  return n;
}

UnitGatherer::UnitGatherer(const ZeroLayout& layout, nn::Module& model, const std::vector<Tensor>& params,
                           Tensor shard, StepSchedule& schedule, dist::ProcessGroup group, CommMeter& meter,
                           const GatherCodec& codec, std::optional<dist::ProcessGroup> host)
    : ParamGatherer(layout, std::move(group), meter, codec),
      schedule_(schedule),
      shard_(std::move(shard)),
      host_(std::move(host)) {
  const size_t np = layout_.partitions.size();
  gathered_.resize(np);
  work_.resize(np);
  for (size_t p = 0; p < np; ++p) {
    const Partition& part = layout_.partitions[p];
    gathered_[p] = empty({part.numel}, shard_.dtype(), shard_.device());
    for (size_t i = part.first_param; i < part.end_param; ++i)
      repoint_parameter(params[i], gathered_[p], layout_.flat.segments[i].offset - part.begin);
    gathered_[p].storage()->release();
  }
  wired_.assign(np, false);
  if (!codec_.direct()) {
    const int64_t n = group_.size();
    for (size_t p = 0; p < np; ++p) {
      wire_.push_back(
          empty({n * codec_.record_numel(layout_.chunk(p))}, codec_.wire_dtype(), shard_.device()));
      wire_.back().storage()->release();
    }
  }
  slice_valid_.assign(np, false);
  from_host_.assign(np, false);
  if (host_) {
    const int r = host_->size();
    for (const Partition& part : layout_.partitions)
      CZ_CHECK(part.numel % r == 0,
               "ZeRO-3 hpZ: unit '{}' of {} elements does not split over {} ranks per host", part.name,
               part.numel, r);
    secondary_ = empty({hpz_secondary_numel(layout_, r)}, shard_.dtype(), shard_.device());
    int64_t off = 0;
    for (const Partition& part : layout_.partitions) {
      slice_.push_back(secondary_.narrow(0, off, part.numel / r));
      off += part.numel / r;
    }
  }
  for (size_t p = 0; p < np; ++p) {
    nn::Module* m = model.find_module(layout_.partitions[p].name);
    CZ_CHECK(m != nullptr, "ZeRO-3: the model has no module '{}'", layout_.partitions[p].name);
    hooks_.emplace_back(m, m->register_forward_pre_hook(
                               [this, p](nn::Module&, const Tensor&) { schedule_.unit_forward_pre(p); }));
    hooks_.emplace_back(m, m->register_forward_hook([this, p](nn::Module&, const Tensor&, const Tensor&) {
      schedule_.unit_forward_post(p);
    }));
    hooks_.emplace_back(
        m, m->register_backward_pre_hook([this, p](nn::Module&) { schedule_.unit_backward_pre(p); }));
  }
  allocate_records();
}

UnitGatherer::~UnitGatherer() {
  for (auto& w : work_)
    if (w) try {
        w->wait();
      } catch (...) {
      }
}

int64_t UnitGatherer::gathered_bytes() const {
  int64_t n = 0;
  for (size_t p = 0; p < gathered_.size(); ++p)
    if (resident(p)) n += held_bytes(gathered_[p]);
  return n;
}

int64_t UnitGatherer::state_bytes() const {
  int64_t n = ParamGatherer::state_bytes() + held_bytes(shard_);
  if (secondary_.defined()) n += held_bytes(secondary_);
  return n;
}

void UnitGatherer::after_update() {
  slice_valid_.assign(slice_valid_.size(), false);
  encode_all();
}

void UnitGatherer::gather(size_t p) {
  const trace::Label label("unit", p);  // --trace (Note [Trace blocks])
  Storage& storage = *gathered_[p].storage();
  storage.restore(allocator_for(shard_.device()).allocate(storage.nbytes()));
  // hpZ: backward gathers inside the host from the slices its forward kept (Note [hpZ]).
  from_host_[p] = host_ && schedule_.plan().host_local_gather(schedule_.in_backward()) && slice_valid_[p];
  const dist::ProcessGroup& group = from_host_[p] ? *host_ : group_;
  meter_.hold(int64_t(round_to_size_class(storage.nbytes())));
  if (!from_host_[p] && !codec_.direct()) {  // the records, decoded at use (Note [Quantized gathers])
    Storage& w = *wire_[p].storage();
    w.restore(allocator_for(shard_.device()).allocate(w.nbytes()));
    wired_[p] = true;
    meter_.hold(int64_t(round_to_size_class(w.nbytes())));
    work_[p] = group.all_gather(record(p), wire_[p]);
    meter_.sent(group, wire_[p].nbytes(), dist::Collective::all_gather);
    return;
  }
  const Tensor mine = from_host_[p] ? slice_[p] : shard_.narrow(0, layout_.local_offset(p), layout_.chunk(p));
  // A group of one copies its shard's bytes (Note [Releasable storage]: not an in-place write).
  work_[p] = group.all_gather(mine, gathered_[p]);
  meter_.sent(group, gathered_[p].nbytes(), dist::Collective::all_gather);
}

void UnitGatherer::drop_wire(size_t p) {
  if (!wired_[p]) return;
  meter_.hold(-held_bytes(wire_[p]));
  wire_[p].storage()->release();
  wired_[p] = false;
}

void UnitGatherer::use(size_t p) {
  meter_.wait(work_[p]);
  work_[p].reset();
  if (wired_[p]) {
    NoGradGuard no_grad;
    codec_.decode(wire_[p], group_.size(), layout_.chunk(p), gathered_[p]);
    drop_wire(p);
  }
  if (host_ && !from_host_[p]) {  // hpZ: keep the host-local slice for backward
    NoGradGuard no_grad;
    const int64_t n = layout_.partitions[p].numel / host_->size();
    slice_[p].copy_(gathered_[p].narrow(0, host_->rank() * n, n));
    slice_valid_[p] = true;
  }
}

void UnitGatherer::release(size_t p) {
  if (work_[p]) {
    meter_.wait(work_[p]);
    work_[p].reset();
  }
  drop_wire(p);
  meter_.hold(-held_bytes(gathered_[p]));
  gathered_[p].storage()->release();
}

}  // namespace cz::zero
