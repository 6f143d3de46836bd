// Stages 1-2's parameter gatherer: the updated chunks all-gathered into the full compute copy.
#include "dist/zero/chunk_gatherer.h"

#include "dist/zero/held_bytes.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"
#include "tensor/trace.h"

namespace cz::zero {

ChunkGatherer::ChunkGatherer(const ZeroLayout& layout, nn::Module& model,
                             const std::vector<std::string>& units, Tensor full, std::vector<Tensor> chunks,
                             dist::ProcessGroup group, CommMeter& meter, const GatherCodec& codec,
                             StepSchedule& schedule)
    : ParamGatherer(layout, std::move(group), meter, codec),
      full_(std::move(full)),
      chunks_(std::move(chunks)),
      schedule_(schedule),
      work_(layout.partitions.size()),
      wire_(layout.partitions.size()) {
  for (size_t u = 0; u < units.size(); ++u) {
    nn::Module* m = model.find_module(units[u]);
    CZ_CHECK(m != nullptr, "ZeRO: the model has no module '{}'", units[u]);
    hooks_.emplace_back(m, m->register_forward_pre_hook([this, u](nn::Module&, const Tensor&) {
      schedule_.unit_forward_pre_chunks(u);
    }));
  }
  allocate_records();
}

ChunkGatherer::~ChunkGatherer() {
  for (auto& w : work_)
    if (w) try {
        w->wait();
      } catch (...) {
      }
}

// Not direct: every partition's records launched, then (the schedule's decode_at_once) each decoded as soon
// as it has arrived, while the later ones travel, its wire buffer freed.
void ChunkGatherer::after_update() {
  encode_all();
  schedule_.after_update();
}

void ChunkGatherer::gather_partition(size_t p) {
  const trace::Label label("partition", p);  // --trace (Note [Trace blocks])
  if (codec_.direct()) {
    const Partition& part = layout_.partitions[p];
    Tensor full = full_.narrow(0, part.begin, part.numel);
    work_[p] = group_.all_gather(chunks_[p], full);
    meter_.sent(group_, part.numel * int64_t(dtype_size(full_.dtype())), dist::Collective::all_gather);
    return;
  }
  wire_[p] =
      empty({group_.size() * codec_.record_numel(layout_.chunk(p))}, codec_.wire_dtype(), group_.device());
  work_[p] = group_.all_gather(record(p), wire_[p]);
  meter_.sent(group_, wire_[p].nbytes(), dist::Collective::all_gather);
  meter_.hold(int64_t(round_to_size_class(wire_[p].storage()->nbytes())));
}

void ChunkGatherer::use_partition(size_t p) {
  meter_.wait(work_[p]);
  work_[p].reset();
  if (!wire_[p].defined()) return;
  NoGradGuard no_grad;
  const Partition& part = layout_.partitions[p];
  codec_.decode(wire_[p], group_.size(), layout_.chunk(p), full_.narrow(0, part.begin, part.numel));
  meter_.hold(-int64_t(round_to_size_class(wire_[p].storage()->nbytes())));
  wire_[p] = Tensor();
}

}  // namespace cz::zero
