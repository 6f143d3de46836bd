// Stages 1-2's parameter gatherer: the updated chunks all-gathered into the full compute copy.
#include "dist/zero/param_gatherer.h"

#include <algorithm>
#include <map>

namespace cz::zero {

ParamGatherer::~ParamGatherer() {
  for (auto& [m, id] : hooks_) m->remove_hook(id);
}

ChunkGatherer::ChunkGatherer(const ZeroLayout& layout, nn::Module& model, Tensor full,
                             std::vector<Tensor> chunks, dist::ProcessGroup group, CommMeter& meter)
    : ParamGatherer(layout, std::move(group), meter),
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
}

ChunkGatherer::~ChunkGatherer() {
  for (auto& w : work_)
    if (w) try {
        w->wait();
      } catch (...) {
      }
}

void ChunkGatherer::after_update() {
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const Partition& part = layout_.partitions[p];
    Tensor full = full_.narrow(0, part.begin, part.numel);
    work_[p] = group_.all_gather(chunks_[p], full);
    meter_.sent(group_, part.numel * int64_t(dtype_size(full_.dtype())), dist::Collective::all_gather);
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
