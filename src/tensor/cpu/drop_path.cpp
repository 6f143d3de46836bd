// Per-sample scaling (drop path's mask, forward and backward).
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/parallel.h"

namespace cz::cpu {

void sample_scale(const Tensor& x, const Tensor& scale, Tensor& y) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = x.size(0), inner = N ? x.numel() / N : 0;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    T* py = y.data<T>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T s = ps[n];
      const T* xr = px + n * inner;
      T* yr = py + n * inner;
      simd::for_blocks<T>(0, inner, [&](auto v, int64_t i) {
        using V = decltype(v);
        simd::store(yr + i, simd::load<V>(xr + i) * s);
      });
    }
  });
}

}  // namespace cz::cpu
