// The pieces of Note [Sampling] (loader.h) as pure functions: counter-based random streams, the epoch's
// permutation, and which positions of a global batch a rank takes.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace cz {

// Uniform draws from Philox blocks (seed, first_block), (seed, first_block + 1), ...: a stream that is a pure
// function of its key and start, so any thread can recreate it.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t first_block) : seed_(seed), block_(first_block) {}
  uint32_t next_u32();
  double uniform();  // [0, 1), 53 bits
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t below(int64_t n);  // [0, n), n > 0

 private:
  uint64_t seed_, block_;
  std::array<uint32_t, 4> buf_{};
  int used_ = 4;
};

// Independent Philox keys for the different uses of one user seed (shuffling, augmentation, synthetic
// images, the held-out eval split, Mixup/CutMix, RandAugment, random erasing).
enum class RngDomain : uint64_t {
  shuffle = 1,
  augment = 2,
  synthetic = 3,
  holdout = 4,
  mix = 5,
  randaugment = 6,
  erase = 7
};
uint64_t rng_key(uint64_t seed, RngDomain domain);

// A stream of its own for the sample at position `pos` of epoch `epoch`: Philox keyed by a bijective hash of
// (domain's key, epoch << 36 | pos), from block 0, so distinct samples never share a key. For augmentations
// whose number of draws has no small bound (RandAugment's layers, random erasing's per-pixel values); the
// crop's few draws use counters of the domain key instead (Note [Sampling]).
CounterRng sample_stream(uint64_t seed, RngDomain domain, int64_t epoch, int64_t pos);

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
