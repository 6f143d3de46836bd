// Helpers shared by the GEMM-based CPU kernels (linear, patchify convolution): row-major GEMM (f32 on the
// library chosen for its shape, Note [CPU GEMM libraries]; f64 on OpenBLAS) and per-column sums (bias
// gradients).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cpu/gemm_choice.h"
#include "tensor/parallel.h"

namespace cz::cpu {

// C = alpha * op(A) op(B) + beta * C, row-major. f32 under --precision bf16 on the CPU: operands rounded to
// bf16, fp32 accumulation (Note [bf16 on the CPU]); otherwise on the library chosen for the shape. Safe to
// call from inside an OpenMP parallel region (it then runs on the calling thread).
template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (matmul_precision() == MatmulPrecision::bf16)
      return gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    cblas_dgemm(CblasRowMajor, opa, opb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                int(ldc));
  }
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

}  // namespace cz::cpu
