// Note [Same global batch at any size]: after a lost host the job goes on at the largest world size W that
// the hosts left can hold, no smaller than --min-ranks, and that divides the global batch G = micro-batch x
// grad-accum x ranks of the first launch; then the micro-batch m and accumulation a with m x a x W = G, m no
// larger than the first launch's (a rank's memory was sized for it), and a as small as can be (fewer, larger
// micro-steps are faster). Sampling and drop-path masks follow each sample's index in the global batch (Note
// [Sampling], Note [Drop-path masks]), so the same G gives the same batches and the loss curve goes on; the
// sums' order changes with W, so the numbers are those of a run resumed by hand at the new size, not those of
// the old size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cz::elastic {

struct BatchShape {
  int world = 0;
  int64_t micro_batch = 0;
  int64_t grad_accum = 0;

  int64_t global_batch() const { return micro_batch * grad_accum * world; }
  bool operator==(const BatchShape&) const = default;
};

// The shape for at most `slots` ranks that keeps `first`'s global batch, or nullopt when no world size in
// [min_ranks, slots] divides it.
std::optional<BatchShape> resize(const BatchShape& first, int slots, int min_ranks);

// "3 ranks x micro-batch 4 x grad-accum 1 = global batch 12"
std::string describe(const BatchShape& s);

}  // namespace cz::elastic
