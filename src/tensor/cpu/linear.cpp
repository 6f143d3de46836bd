// GEMM-based kernels: matmul and linear forward/backward on OpenBLAS.
#include <algorithm>
#include <vector>

#include "tensor/cpu/blas.h"
#include "tensor/cpu/kernels.h"

namespace cz::cpu {
namespace {

// The weight gradient of a layer with many rows and a small weight (ConvNeXt's first stages: 8192 rows, a
// 160 x 40 weight) gives OpenBLAS a GEMM whose output is too small to split well across threads and whose
// long reduction it packs in one piece. Splitting the rows instead, each thread runs a one-thread GEMM
// (OpenBLAS's OpenMP build does inside a parallel region) on its slice, with the bias gradient's column sums
// of the same rows while they are in cache; the partial results are then added in thread order (deterministic
// for a given thread count).
bool split_rows_for_weight_grad(int64_t m, int64_t in, int64_t out, int threads) {
  return threads > 1 && m >= 2048 && m >= 16 * std::max(in, out) && in * out <= (int64_t(1) << 16);
}

template <class T>
void weight_grad_split_rows(const T* g, const T* x, int64_t m, int64_t in, int64_t out, T* dw, T* db,
                            int threads) {
  const int64_t wsize = out * in;
  std::vector<T> partial(size_t(threads - 1) * size_t(wsize + out));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t r0 = m * t / nt, r1 = m * (t + 1) / nt;
    T* pw = t == 0 ? dw : partial.data() + size_t(t - 1) * size_t(wsize + out);
    T* pb = t == 0 ? db : pw + wsize;
    gemm<T>(true, false, out, in, r1 - r0, T(1), g + r0 * out, out, x + r0 * in, in, T(0), pw, in);
    if (db) {
      for (int64_t j = 0; j < out; ++j) pb[j] = T(0);
      for (int64_t r = r0; r < r1; ++r) {
        const T* gr = g + r * out;
#pragma omp simd
        for (int64_t j = 0; j < out; ++j) pb[j] += gr[j];
      }
    }
  }
  for (int t = 1; t < threads; ++t) {
    const T* pw = partial.data() + size_t(t - 1) * size_t(wsize + out);
#pragma omp simd
    for (int64_t i = 0; i < wsize; ++i) dw[i] += pw[i];
    if (db)
      for (int64_t j = 0; j < out; ++j) db[j] += pw[wsize + j];
  }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
    gemm<T>(false, false, m, n, k, T(1), a.data<T>(), k, b.data<T>(), n, T(0), out.data<T>(), n);
  });
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  visit_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    T* py = y.data<T>();
    T beta = T(0);
    if (bias.defined()) {
      const T* pb = bias.data<T>();
#pragma omp parallel for schedule(static) if (m * out >= kParallelGrain)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < out; ++j) py[r * out + j] = pb[j];
      beta = T(1);
    }
    gemm<T>(false, true, m, out, in, T(1), x.data<T>(), in, w.data<T>(), in, beta, py, out);
  });
}

void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db) {
  visit_float(gy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    const T* pg = gy.data<T>();
    if (dx.defined())
      gemm<T>(false, false, m, in, out, T(1), pg, out, w.data<T>(), in, T(0), dx.data<T>(), in);
    const int threads = cpu_threads();
    if (dw.defined() && split_rows_for_weight_grad(m, in, out, threads)) {
      weight_grad_split_rows<T>(pg, x.data<T>(), m, in, out, dw.data<T>(),
                                db.defined() ? db.data<T>() : nullptr, threads);
      return;
    }
    if (dw.defined())
      gemm<T>(true, false, out, in, m, T(1), pg, out, x.data<T>(), in, T(0), dw.data<T>(), in);
    if (db.defined()) column_sums<T>(pg, m, out, db.data<T>());
  });
}

}  // namespace cz::cpu
