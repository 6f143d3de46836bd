// Global average pooling over H and W of NHWC data, forward and backward.
#include <algorithm>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/parallel.h"

namespace cz::cpu {

using simd::for_blocks;
using simd::load;
using simd::store;

namespace {

// dst[c] = src[c] * s for c < C (dst may be src).
template <class T>
void scale_row(const T* src, T* dst, T s, int64_t C) {
  for_blocks<T>(0, C, [&](auto v, int64_t c) {
    using V = decltype(v);
    store(dst + c, load<V>(src + c) * s);
  });
}

}  // namespace

void global_avg_pool_forward(const Tensor& x, Tensor& y) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = x.size(0), HW = x.size(1) * x.size(2), C = x.size(3);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T inv = T(1) / T(HW);
    // Sum the image's pixels into its output row (in L1), reading x sequentially.
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      T* yr = py + n * C;
      std::fill_n(yr, C, T(0));
      for (int64_t q = 0; q < HW; ++q) {
        const T* xr = px + (n * HW + q) * C;
        for_blocks<T>(0, C, [&](auto v, int64_t c) {
          using V = decltype(v);
          store(yr + c, load<V>(yr + c) + load<V>(xr + c));
        });
      }
      scale_row(yr, yr, inv, C);
    }
  });
}

void global_avg_pool_backward(const Tensor& gy, Tensor& dx) {
  visit_float(dx.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = dx.size(0), HW = dx.size(1) * dx.size(2), C = dx.size(3);
    const T* pg = gy.data<T>();
    T* pd = dx.data<T>();
    const T inv = T(1) / T(HW);
#pragma omp parallel for schedule(static) if (dx.numel() >= kParallelGrain)
    for (int64_t row = 0; row < N * HW; ++row) {
      const T* gr = pg + (row / HW) * C;
      T* dr = pd + row * C;
      scale_row(gr, dr, inv, C);
    }
  });
}

}  // namespace cz::cpu
