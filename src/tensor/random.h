// Counter-based random numbers (Philox-4x32-10). A value depends only on (seed, counter), so the same seed
// gives the same numbers on any device and any thread count, and a stream can be split without sharing state.
#pragma once

#include <array>
#include <cstdint>

#include "tensor/tensor.h"

namespace cz {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves `n` Philox blocks (4 x 32 bits each) and returns the counter of the first.
  uint64_t reserve(uint64_t n) {
    const uint64_t first = offset_;
    offset_ += n;
    return first;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// Fill in place (no autograd; allowed on leaves under NoGradGuard). Floating dtypes; values are drawn in f64
// on the host and converted, so every device and dtype sees the same numbers.
void uniform_(Tensor& t, double lo, double hi, Generator& gen);
void normal_(Tensor& t, double mean, double std, Generator& gen);
// Normal(mean, std) restricted to [a, b] (absolute bounds, as timm's trunc_normal_), by resampling.
void trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator& gen);

Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu());
// Integers uniform in [0, high).
Tensor randint(int64_t high, const Shape& shape, Generator& gen, DType dtype = DType::i64,
               Device device = Device::cpu());

}  // namespace cz
