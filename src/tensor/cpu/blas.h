// The GEMM every CPU kernel calls: row-major, f32 on the library chosen for its shape (Note [CPU GEMM
// libraries]) or with bf16 operands (Note [bf16 on the CPU]), f64 on OpenBLAS; and a row-order column sum.
// Kernels whose rows are the batch's call it through row_tiles.h (Note [Cutting the rows]).
#pragma once

#include <cblas.h>
#include <cstdint>
#include <type_traits>

#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cpu/gemm_choice.h"

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

// Adds the columns of the rows [0, n) of a (n x cols, leading dimension cols) into acc, on the calling
// thread.
template <class T>
void add_column_sums(const T* a, int64_t n, int64_t cols, T* acc) {
  for (int64_t r = 0; r < n; ++r) {
    const T* ar = a + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) acc[j] += ar[j];
  }
}

}  // namespace cz::cpu
