// Internal to the CPU kernels: splitting a shard among OpenMP threads and walking the pieces of each part.
#pragma once

#include <omp.h>

#include <algorithm>
#include <span>

#include "optim/param_groups.h"
#include "tensor/parallel.h"

namespace cz::cpu {

// Calls f(begin, end) for this thread's part of [0, n): contiguous, a multiple of 64 elements (cache lines
// for f32 and f64), one part per thread. The split never changes an element's value (Note [Bitwise-identical
// tails] in tensor/cpu/simd.h), so results do not depend on the thread count.
template <class F>
void for_each_part(int64_t n, F&& f) {
#pragma omp parallel if (n >= kParallelGrain)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (n + threads - 1) / threads;
    const int64_t step = (per + 63) / 64 * 64;
    const int64_t lo = std::min(n, t * step), hi = std::min(n, lo + step);
    if (lo < hi) f(lo, hi);
  }
}

// Calls f(piece, begin, end) for the intersection of every piece with this thread's part of [0, n).
template <class F>
void for_each_piece_part(int64_t n, std::span<const ShardPiece> pieces, F&& f) {
  for_each_part(n, [&](int64_t lo, int64_t hi) {
    auto it = std::upper_bound(pieces.begin(), pieces.end(), lo,
                               [](int64_t x, const ShardPiece& p) { return x < p.end; });
    for (; it != pieces.end() && it->begin < hi; ++it) f(*it, std::max(lo, it->begin), std::min(hi, it->end));
  });
}

}  // namespace cz::cpu
