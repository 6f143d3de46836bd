// Counter-based random streams (Note [Sampling], data/loader.h): Philox draws that are a pure function of a
// key and a position, so the sampler, the augmentations and synthetic data get the same numbers on any rank
// and thread.
#pragma once

#include <array>
#include <cstdint>

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

}  // namespace cz
