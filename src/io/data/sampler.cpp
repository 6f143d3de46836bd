// Counter-based streams, epoch permutations and the rank split of Note [Sampling].
#include "io/data/sampler.h"

#include <algorithm>
#include <numeric>

#include "tensor/random.h"

namespace cz {

uint32_t CounterRng::next_u32() {
  if (used_ == 4) {
    buf_ = philox4x32(seed_, block_++);
    used_ = 0;
  }
  return buf_[size_t(used_++)];
}

double CounterRng::uniform() {
  const uint64_t hi = next_u32(), lo = next_u32();
  return double((hi << 32 | lo) >> 11) * 0x1p-53;
}

int64_t CounterRng::below(int64_t n) {
  const uint64_t r = uint64_t(next_u32()) << 32 | next_u32();
  // Multiply-shift: the bias is n / 2^64, far below anything a data set size could reveal.
  return int64_t((static_cast<unsigned __int128>(r) * uint64_t(n)) >> 64);
}

uint64_t rng_key(uint64_t seed, RngDomain domain) {
  // splitmix64 finaliser over (seed, domain): nearby seeds get unrelated keys per domain.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t(domain) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

CounterRng sample_stream(uint64_t seed, RngDomain domain, int64_t epoch, int64_t pos) {
  // An odd multiplier and the splitmix64 finaliser are both bijections of 64 bits.
  uint64_t z = rng_key(seed, domain) ^ ((uint64_t(epoch) << 36 | uint64_t(pos)) * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return CounterRng(z ^ (z >> 31), 0);
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!shuffle) return order;
  // Each epoch owns 2^40 blocks of the shuffle key: more than any n needs (n draws, two u32 each).
  CounterRng rng(rng_key(seed, RngDomain::shuffle), uint64_t(epoch) << 40);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng.below(i + 1))]);
  return order;
}

int64_t batches_per_epoch(int64_t n, int64_t batch, bool drop_last) {
  return drop_last ? n / batch : (n + batch - 1) / batch;
}

BatchSlice rank_slice(int64_t n, int64_t batch, int64_t b, int world, int rank, int64_t offset) {
  const int64_t first = offset + b * batch;
  const int64_t k = std::min(batch, n - first);
  return {first + rank * k / world, first + (rank + 1) * k / world};
}

}  // namespace cz
