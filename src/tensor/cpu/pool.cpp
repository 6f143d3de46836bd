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

// Calls f(src, dst, N, HW, C, inv) with `src` and `dst` as pointers of the float dtype of `images` (N, H, W,
// C), HW = H * W and inv = 1 / HW.
template <class F>
void with_pool_shape(const Tensor& images, const Tensor& src, Tensor& dst, F&& f) {
  visit_float(images.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t HW = images.size(1) * images.size(2);
    f(static_cast<const T*>(src.data<T>()), dst.data<T>(), images.size(0), HW, images.size(3), T(1) / T(HW));
  });
}

}  // namespace

void global_avg_pool_forward(const Tensor& x, Tensor& y) {
  with_pool_shape(x, x, y, [&](const auto* px, auto* py, int64_t N, int64_t HW, int64_t C, auto inv) {
    using T = decltype(inv);
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
  with_pool_shape(dx, gy, dx, [&](const auto* pg, auto* pd, int64_t N, int64_t HW, int64_t C, auto inv) {
    using T = decltype(inv);
#pragma omp parallel for schedule(static) if (dx.numel() >= kParallelGrain)
    for (int64_t row = 0; row < N * HW; ++row) {
      const T* gr = pg + (row / HW) * C;
      T* dr = pd + row * C;
      scale_row(gr, dr, inv, C);
    }
  });
}

}  // namespace cz::cpu
