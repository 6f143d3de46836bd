// The pieces of Note [Sampling] (loader.h) as pure functions: the epoch's permutation and which positions of
// a global batch a rank takes, drawn from the counter-based streams of io/image/counter_rng.h.
#pragma once

#include <cstdint>
#include <vector>

#include "io/image/counter_rng.h"

namespace cz {

// Epoch `epoch`'s order of the indices 0..n-1: a Fisher-Yates permutation drawn from (seed, epoch), or the
// identity with shuffle off.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// A rank's share of one global batch: positions [begin, end) of the epoch's order.
struct BatchSlice {
  int64_t begin = 0, end = 0;
};

// Global batches in an epoch of n examples: floor(n / batch) with drop_last, else ceil.
int64_t batches_per_epoch(int64_t n, int64_t batch, bool drop_last);

// Rank `rank` of `world`'s slice of global batch `b` of an epoch that starts at position `offset` of its
// order (0, or where a resume at another global batch continues it: Note [Resuming at another global batch],
// loader.h): the batch is positions [offset + b*batch, ...), and of its k examples (batch, or fewer for the
// final one without drop_last) the rank takes [rank*k/world, (rank+1)*k/world), contiguous and even to within
// one.
BatchSlice rank_slice(int64_t n, int64_t batch, int64_t b, int world, int rank, int64_t offset = 0);

}  // namespace cz
