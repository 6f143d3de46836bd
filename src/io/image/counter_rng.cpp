// Counter-based random streams: Philox blocks drawn in order, and the keys of a seed's domains and samples.
#include "io/image/counter_rng.h"

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

}  // namespace cz
