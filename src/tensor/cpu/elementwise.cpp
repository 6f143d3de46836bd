// Elementwise CPU kernels and the per-channel (layer scale) kernels with their reductions.
#include <omp.h>

#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/parallel.h"

namespace cz::cpu {

void binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    const int64_t n = out.numel();
    const T al = T(alpha);
    if (op == BinaryOp::add) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + al * pb[i];
    } else {
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) po[i] = pa[i] * pb[i];
    }
  });
}

void residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma, Tensor& out) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t c = gamma.numel(), rows = x.numel() / c;
    const T* px = x.data<T>();
    const T* pg = gamma.data<T>();
    const T* pr = residual.defined() ? residual.data<T>() : nullptr;
    T* po = out.data<T>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + r * c;
      T* orow = po + r * c;
      if (pr) {
        const T* rr = pr + r * c;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) orow[j] = rr[j] + xr[j] * pg[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) orow[j] = xr[j] * pg[j];
      }
    }
  });
}

void channel_scale_backward(const Tensor& g, const Tensor& x, const Tensor& gamma, Tensor& dx,
                            Tensor& dgamma) {
  visit_float(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t c = gamma.numel(), rows = g.numel() / c;
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    const T* pgam = gamma.data<T>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    const bool want_dgamma = dgamma.defined();
    // dgamma by the cut's blocks of rows, added pairwise (Note [Cutting the rows]).
    std::vector<T> sums(static_cast<size_t>(c));
    block_sums<T>(rows, c, vector_sum_cut(rows, c), sums.data(), [&](int64_t r0, int64_t r1, T* part) {
      T* acc = want_dgamma ? part : nullptr;
      for (int64_t r = r0; r < r1; ++r) {
        const T* gr = pg + r * c;
        const T* xr = px + r * c;
        if (pdx) {
          T* dr = pdx + r * c;
#pragma omp simd
          for (int64_t j = 0; j < c; ++j) dr[j] = gr[j] * pgam[j];
        }
        if (acc) {
#pragma omp simd
          for (int64_t j = 0; j < c; ++j) acc[j] += gr[j] * xr[j];
        }
      }
    });
    if (want_dgamma) std::copy_n(sums.data(), c, dgamma.data<T>());
  });
}

}  // namespace cz::cpu
