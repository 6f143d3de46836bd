// The parameter gatherers' common part: hooks, and the records of this rank's chunks (Note [Quantized
// gathers]).
#include "dist/zero/param_gatherer.h"

#include <algorithm>
#include <map>

#include "dist/zero/held_bytes.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"
#include "tensor/trace.h"

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

}  // namespace cz::zero
