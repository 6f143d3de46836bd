// The world size and batch split of a restart (Note [Same global batch at any size]).
#include "dist/elastic/resize.h"

#include <fmt/format.h>

namespace cz::elastic {

std::optional<BatchShape> resize(const BatchShape& first, int slots, int min_ranks) {
  const int64_t g = first.global_batch();
  for (int w = slots; w >= std::max(1, min_ranks); --w) {
    if (g % w != 0) continue;
    const int64_t per_rank = g / w;  // images per rank per optimizer step
    for (int64_t a = 1; a <= per_rank; ++a) {
      if (per_rank % a == 0 && per_rank / a <= first.micro_batch) return BatchShape{w, per_rank / a, a};
    }
  }
  return std::nullopt;
}

std::string describe(const BatchShape& s) {
  return fmt::format("{} rank{} x micro-batch {} x grad-accum {} = global batch {}", s.world,
                     s.world == 1 ? "" : "s", s.micro_batch, s.grad_accum, s.global_batch());
}

}  // namespace cz::elastic
