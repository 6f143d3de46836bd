// Note [Fletcher-32 by blocks]: HDF5 sums big-endian 16-bit words w_i as `s1 += w_i; s2 += s1` and folds
// both sums to 16 bits (s = (s & 0xffff) + (s >> 16)) after every 360 words. The fold is not a full reduction
// mod 65535, so the result depends on where the folds happen; we keep them exactly where HDF5 has them and
// only replace the inner loop by its closed form: over a block of n words,
//   s2 += n * s1 + sum_i (n - i) * w_i,   s1 += sum_i w_i,
// which is the same integer (mod 2^32, like the loop). The two sums over a block vectorise.
#include "io/h5/fletcher32.h"

#include <array>

namespace cz::h5 {
namespace {

constexpr size_t kBlock = 360;  // words between folds, as in H5_checksum_fletcher32

constexpr std::array<uint32_t, kBlock> make_weights() {
  std::array<uint32_t, kBlock> w{};
  for (size_t i = 0; i < kBlock; ++i) w[i] = uint32_t(kBlock - i);
  return w;
}
constexpr std::array<uint32_t, kBlock> kWeights = make_weights();

uint32_t fold(uint32_t s) {
  return (s & 0xffff) + (s >> 16);
}

}  // namespace

uint32_t fletcher32(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t words = bytes / 2;
  uint32_t s1 = 0, s2 = 0;
  while (words >= kBlock) {
    uint32_t a = 0, b = 0;
    for (size_t i = 0; i < kBlock; ++i) {
      const uint32_t w = (uint32_t(p[2 * i]) << 8) | p[2 * i + 1];
      a += w;
      b += kWeights[i] * w;
    }
    s2 += uint32_t(kBlock) * s1 + b;
    s1 += a;
    s1 = fold(s1);
    s2 = fold(s2);
    p += 2 * kBlock;
    words -= kBlock;
  }
  if (words > 0) {  // the last, shorter block: weights n - i for its n words
    uint32_t a = 0, b = 0;
    for (size_t i = 0; i < words; ++i) {
      const uint32_t w = (uint32_t(p[2 * i]) << 8) | p[2 * i + 1];
      a += w;
      b += uint32_t(words - i) * w;
    }
    s2 += uint32_t(words) * s1 + b;
    s1 += a;
    s1 = fold(s1);
    s2 = fold(s2);
    p += 2 * words;
  }
  if (bytes % 2) {
    s1 += uint32_t(*p) << 8;
    s2 += s1;
    s1 = fold(s1);
    s2 = fold(s2);
  }
  s1 = fold(s1);
  s2 = fold(s2);
  return (s2 << 16) | s1;
}

}  // namespace cz::h5
