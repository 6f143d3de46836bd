// Stages 1-2's parameter gatherer: the updated chunks all-gathered into the full compute copy.
#include "dist/zero/param_gatherer.h"

#include <algorithm>
#include <map>

#include "dist/zero/held_bytes.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz::zero {

ParamGatherer::~ParamGatherer() {
  for (auto& [m, id] : hooks_) m->remove_hook(id);
}

int64_t ParamGatherer::state_bytes() const {
  return held_bytes(records_);
}

void ParamGatherer::allocate_records() {
  if (codec_.direct()) return;
  int64_t n = 0;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    record_offset_.push_back(n);
    n += codec_.record_numel(layout_.chunk(p));
  }
  records_ = zeros({n}, codec_.wire_dtype(), group_.device());
}

Tensor ParamGatherer::record(size_t p) const {
  return records_.narrow(0, record_offset_[p], codec_.record_numel(layout_.chunk(p)));
}

void ParamGatherer::encode_all() {
  if (codec_.direct()) return;
  CZ_ASSERT(sources_.size() == layout_.partitions.size(), "gather: {} sources for {} partitions",
            sources_.size(), layout_.partitions.size());
  NoGradGuard no_grad;
  for (size_t p = 0; p < sources_.size(); ++p) codec_.encode(sources_[p], record(p));
}

ChunkGatherer::ChunkGatherer(const ZeroLayout& layout, nn::Module& model, Tensor full,
                             std::vector<Tensor> chunks, dist::ProcessGroup group, CommMeter& meter,
                             const GatherCodec& codec)
    : ParamGatherer(layout, std::move(group), meter, codec),
      full_(std::move(full)),
      chunks_(std::move(chunks)),
      work_(layout.partitions.size()) {
  std::map<std::string, size_t> partition_of;  // parameter name -> partition
  for (size_t p = 0; p < layout_.partitions.size(); ++p)
    for (size_t i = layout_.partitions[p].first_param; i < layout_.partitions[p].end_param; ++i)
      partition_of[layout_.flat.segments[i].name] = p;
  for (auto& [prefix, m] : model.named_modules()) {
    std::vector<size_t> parts;
    for (const auto& [local, t] : m->local_parameters()) {
      const size_t p = partition_of.at(prefix.empty() ? local : prefix + "." + local);
      if (std::find(parts.begin(), parts.end(), p) == parts.end()) parts.push_back(p);
    }
    if (parts.empty()) continue;
    hooks_.emplace_back(
        m, m->register_forward_pre_hook([this, parts](nn::Module&, const Tensor&) { wait(parts); }));
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

void ChunkGatherer::after_update() {
  if (!codec_.direct()) return gather_records();
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const Partition& part = layout_.partitions[p];
    Tensor full = full_.narrow(0, part.begin, part.numel);
    work_[p] = group_.all_gather(chunks_[p], full);
    meter_.sent(group_, part.numel * int64_t(dtype_size(full_.dtype())), dist::Collective::all_gather);
  }
}

// Every partition's records launched, then each decoded as soon as it has arrived (while the later ones
// travel), its wire buffer freed.
void ChunkGatherer::gather_records() {
  encode_all();
  const size_t np = layout_.partitions.size();
  const int64_t n = group_.size();
  std::vector<Tensor> wire(np);
  for (size_t p = 0; p < np; ++p) {
    wire[p] = empty({n * codec_.record_numel(layout_.chunk(p))}, codec_.wire_dtype(), group_.device());
    work_[p] = group_.all_gather(record(p), wire[p]);
    meter_.sent(group_, wire[p].nbytes(), dist::Collective::all_gather);
    meter_.hold(int64_t(round_to_size_class(wire[p].storage()->nbytes())));
  }
  NoGradGuard no_grad;
  for (size_t p = 0; p < np; ++p) {
    meter_.wait(work_[p]);
    work_[p].reset();
    const Partition& part = layout_.partitions[p];
    codec_.decode(wire[p], n, layout_.chunk(p), full_.narrow(0, part.begin, part.numel));
    meter_.hold(-int64_t(round_to_size_class(wire[p].storage()->nbytes())));
    wire[p] = Tensor();
  }
}

void ChunkGatherer::wait(const std::vector<size_t>& partitions) {
  for (size_t p : partitions)
    if (work_[p]) {
      meter_.wait(work_[p]);
      work_[p].reset();
    }
}

void ChunkGatherer::wait_all() {
  for (auto& w : work_)
    if (w) {
      meter_.wait(w);
      w.reset();
    }
}

}  // namespace cz::zero
