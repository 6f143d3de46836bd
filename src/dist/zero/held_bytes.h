// The unit of the ZeRO engine's memory figures (state bytes, communication buffers): what a buffer holds in
// its caching allocator, its storage's bytes rounded to their size class, as the memory planner replays it.
#pragma once

#include <cstdint>

#include "tensor/allocator.h"
#include "tensor/tensor.h"

namespace cz::zero {

// 0 for an undefined tensor.
inline int64_t held_bytes(const Tensor& t) {
  return t.defined() ? int64_t(round_to_size_class(t.storage()->nbytes())) : 0;
}

}  // namespace cz::zero
