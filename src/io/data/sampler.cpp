// Epoch permutations and the rank split of Note [Sampling].
#include "io/data/sampler.h"

#include <algorithm>
#include <numeric>

namespace cz {

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
