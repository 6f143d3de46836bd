// GELU forward and backward: one pass over memory, vectorized with the f32 erf approximation in gelu.h.
#include <algorithm>

#include "tensor/cpu/gelu.h"
#include "tensor/cpu/kernels.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

using simd::for_blocks;
using simd::load;
using simd::store;

// Splits [0, n) into chunks (a multiple of every vector width) spread over the threads; f(begin, end).
template <class F>
void parallel_chunks(int64_t n, F&& f) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < chunks; ++b) f(b * kChunk, std::min(n, (b + 1) * kChunk));
}

}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_chunks(x.numel(), [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, double>) {
        for (int64_t i = begin; i < end; ++i) py[i] = gelu_math::gelu(px[i]);
      } else {
        for_blocks<T>(begin, end, [&](auto v, int64_t i) {
          using V = decltype(v);
          store(py + i, gelu_math::gelu(load<V>(px + i)));
        });
      }
    });
  });
}

void gelu_backward(const Tensor& gy, const Tensor& x, Tensor& dx) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pg = gy.data<T>();
    T* pd = dx.data<T>();
    parallel_chunks(x.numel(), [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, double>) {
        for (int64_t i = begin; i < end; ++i) pd[i] = pg[i] * gelu_math::gelu_grad(px[i]);
      } else {
        for_blocks<T>(begin, end, [&](auto v, int64_t i) {
          using V = decltype(v);
          store(pd + i, load<V>(pg + i) * gelu_math::gelu_grad(load<V>(px + i)));
        });
      }
    });
  });
}

}  // namespace cz::cpu
