// GEMM-based kernels: matmul and linear forward/backward on OpenBLAS.
#include <cblas.h>
#include <omp.h>

#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

// C = alpha * op(A) op(B) + beta * C, row-major.
template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                int(ldc));
  else
    cblas_dgemm(CblasRowMajor, opa, opb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                int(ldc));
}

// out[j] = sum over rows of g[r][j].
template <class T>
void column_sums(const T* g, int64_t rows, int64_t cols, T* out) {
  const int nt = rows * cols >= kParallelGrain ? cpu_threads() : 1;
  std::vector<T> partial(size_t(nt * cols), T(0));
#pragma omp parallel num_threads(nt)
  {
    T* acc = partial.data() + omp_get_thread_num() * cols;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gr = g + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) acc[j] += gr[j];
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    T s = 0;
    for (int t = 0; t < nt; ++t) s += partial[size_t(t * cols + j)];
    out[j] = s;
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
    if (dw.defined())
      gemm<T>(true, false, out, in, m, T(1), pg, out, x.data<T>(), in, T(0), dw.data<T>(), in);
    if (db.defined()) column_sums<T>(pg, m, out, db.data<T>());
  });
}

}  // namespace cz::cpu
