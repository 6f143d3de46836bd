// ZeRO-3's unit life cycle: gather before use, prefetch ahead, release after.
//
// Note [Stage-3 units]: each unit's parameters view one buffer of the unit's full (padded) size whose
// Storage is released between uses (Note [Releasable storage]): the parameters and what autograd saved of
// them keep their identity while the bytes come and go. A unit is all-gathered from the ranks' chunks just
// before its forward (module forward-pre hook) and released after it (forward hook); gathered again when the
// gradient of its output arrives (backward-pre hook), and released once its gradients have been handed to
// their reduce-scatter (launch_reduce). The first forward records the order units run in; from then on the
// next `prefetch` units in that order (reversed in backward) are gathered ahead, so at most 1 + prefetch
// units are resident at a unit's hook, plus units waiting for their gradients in backward. Under activation
// checkpointing the recompute runs the forward hooks again during backward: the pre-hook gathers (if needed)
// and the post-hook keeps the unit, which backward is about to use. Every rank takes the same decisions in
// the same order (they depend on the order and the counts, never on timing), so the collectives match.
#include "dist/zero/engine.h"

#include <algorithm>

#include <cstring>

#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::zero {
namespace {

// A world of one "gathers" by copying its shard. Not through copy_: that counts as an in-place write, and the
// views autograd saved of the unit's parameters would refuse the same values (Note [Releasable storage]).
void copy_bytes(const Tensor& dst, const Tensor& src) {
  if (dst.is_cpu())
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
  else
    cuda_runtime::memcpy_async(dst.raw_data(), src.raw_data(), src.nbytes(),
                               cuda_runtime::CopyKind::device_to_device, current_stream(dst.device()));
}

}  // namespace

bool ZeroEngine::unit_resident(size_t p) const {
  return cfg_.stage == 3 && gather_state_[p] != Gather::released;
}

int64_t ZeroEngine::gathered_bytes() const {
  int64_t n = 0;
  for (size_t p = 0; p < gathered_.size(); ++p)
    if (unit_resident(p)) n += int64_t(round_to_size_class(gathered_[p].storage()->nbytes()));
  return n;
}

void ZeroEngine::gather(size_t p) {
  if (gather_state_[p] != Gather::released) return;
  Storage& storage = *gathered_[p].storage();
  storage.restore(allocator_for(cfg_.device).allocate(storage.nbytes()));
  Tensor mine = param_shard_.narrow(0, layout_.local_offset(p), layout_.chunk(p));
  if (comm_) {
    gather_work_[p] = comm_->all_gather(mine, gathered_[p]);
    count_sent(gathered_[p].nbytes(), 1);
  } else {
    copy_bytes(gathered_[p].narrow(0, 0, mine.numel()), mine);
  }
  gather_state_[p] = Gather::gathering;
  note_comm_buffers();
}

void ZeroEngine::use(size_t p) {
  gather(p);
  if (gather_state_[p] == Gather::gathering) {
    wait(gather_work_[p]);
    gather_work_[p].reset();
    gather_state_[p] = Gather::resident;
  }
}

void ZeroEngine::release(size_t p) {
  if (gather_state_[p] == Gather::released) return;
  if (gather_work_[p]) {
    wait(gather_work_[p]);
    gather_work_[p].reset();
  }
  gathered_[p].storage()->release();
  gather_state_[p] = Gather::released;
}

void ZeroEngine::prefetch_after(size_t p, bool backward) {
  if (recording_ || cfg_.prefetch == 0) return;
  const int64_t at = int64_t(position_[p]), n = int64_t(order_.size());
  for (int64_t k = 1; k <= cfg_.prefetch; ++k) {
    const int64_t j = backward ? at - k : at + k;
    if (j < 0 || j >= n) break;
    gather(order_[size_t(j)]);
  }
}

void ZeroEngine::on_unit_forward_pre(size_t p) {
  if (recording_ && std::find(order_.begin(), order_.end(), p) == order_.end()) {
    position_[p] = order_.size();
    order_.push_back(p);
  }
  use(p);
  prefetch_after(p, phase_ == Phase::backward);
}

void ZeroEngine::on_unit_forward_post(size_t p) {
  if (phase_ == Phase::forward) release(p);
}

void ZeroEngine::on_unit_backward_pre(size_t p) {
  use(p);
  prefetch_after(p, true);
}

}  // namespace cz::zero
