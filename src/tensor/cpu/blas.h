// Helpers shared by the GEMM-based CPU kernels (linear, patchify convolution): row-major GEMM (f32 on the
// library chosen for its shape, Note [CPU GEMM libraries]; f64 on OpenBLAS) and per-column sums (bias
// gradients).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
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

// out[j] = sum over rows of g[r][j].
template <class T>
void column_sums(const T* g, int64_t rows, int64_t cols, T* out) {
  const int nt = rows * cols >= kParallelGrain ? cpu_threads() : 1;
  std::vector<T> partial(size_t(nt * cols), T(0));
#pragma omp parallel num_threads(nt)
  {
    T* acc = partial.data() + omp_get_thread_num() * cols;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) add_column_sums(g + r * cols, 1, cols, acc);
  }
  for (int64_t j = 0; j < cols; ++j) {
    T s = 0;
    for (int t = 0; t < nt; ++t) s += partial[size_t(t * cols + j)];
    out[j] = s;
  }
}

// The weight gradient of a layer with many rows and a small weight (ConvNeXt's first stages: 8192 rows, a
// 160 x 40 weight; the stem: 50176 rows, 96 x 48) gives a library a GEMM whose output is too small to split
// well across threads and whose long reduction it packs in one piece (oneDNN 2.6 on 2 threads of a Xeon:
// the stem's 96 x 48 x 50176 at 147 GFLOP/s, 251 split). Splitting the rows instead, each thread runs a
// one-thread GEMM on its slice, with the bias gradient's column sums of the same rows while they are in
// cache; the partial results are then added in thread order (deterministic for a given thread count).
inline bool split_rows_for_weight_grad(int64_t m, int64_t in, int64_t out, int threads) {
  return threads > 1 && m >= 2048 && m >= 16 * std::max(in, out) && in * out <= (int64_t(1) << 16);
}

// dw (out x in) = G^T X over the m rows of g (m x out) and x (m x in), and db (out) = G's column sums; either
// may be null. Rows split across the threads where split_rows_for_weight_grad says so, else one GEMM.
template <class T>
void weight_and_bias_grad(const T* g, const T* x, int64_t m, int64_t in, int64_t out, T* dw, T* db) {
  const int threads = cpu_threads();
  if (!dw || !split_rows_for_weight_grad(m, in, out, threads)) {
    if (dw) gemm<T>(true, false, out, in, m, T(1), g, out, x, in, T(0), dw, in);
    if (db) column_sums<T>(g, m, out, db);
    return;
  }
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
      std::fill_n(pb, out, T(0));
      add_column_sums(g + r0 * out, r1 - r0, out, pb);
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

}  // namespace cz::cpu
