// Row-major f32 GEMM on each of OpenBLAS, oneDNN, BLIS and libxsmm (Note [CPU GEMM libraries]).
#include "tensor/cpu/gemm_libraries.h"

#include <cblas.h>
#include <libxsmm.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

// BLIS's header is named by path (its folder holds a cblas.h of its own) and so is not a system header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtype-limits"
#include CZ_BLIS_HEADER
#pragma GCC diagnostic pop

#include "tensor/check.h"
#include "tensor/parallel.h"

#ifndef CZ_XSMM_VERSION
#define CZ_XSMM_VERSION "unknown"
#endif

namespace cz::cpu {
namespace {

// Inside a parallel region each library runs on the calling thread: OpenBLAS's and oneDNN's OpenMP builds
// see omp_in_parallel() themselves; BLIS and our libxsmm tiling are told so.
int threads_here() {
  return omp_in_parallel() ? 1 : cpu_threads();
}

void onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // dnnl_sgemm is row-major, like ours.
  const dnnl_status_t s =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  CZ_CHECK(s == dnnl_success, "oneDNN dnnl_sgemm failed with status {} (m={} n={} k={} lda={} ldb={} ldc={})",
           int(s), m, n, k, lda, ldb, ldc);
}

void blis_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // BLIS takes a row and a column stride per operand: a transposed row-major operand is the same buffer
  // with the strides swapped. The thread count goes in a runtime object of this call, not BLIS's global.
  rntm_t rntm;
  bli_rntm_init(&rntm);
  bli_rntm_set_num_threads(threads_here(), &rntm);
  const inc_t rsa = ta ? 1 : lda, csa = ta ? lda : 1, rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
  bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<float*>(a), rsa, csa,
               const_cast<float*>(b), rsb, csb, &beta, c, ldc, 1, nullptr, &rntm);
}

// libxsmm makes small-matrix kernels (JIT) and hands anything large to the BLAS it was linked with, so a
// large GEMM on it is ours: tiles of C, each a sum of libxsmm kernels over blocks of k. In libxsmm's
// column-major terms row-major C = op(A) op(B) is C^T = op(B)^T op(A)^T, so B is the kernel's first operand.
// Transposed operands are first copied untransposed (the kernels here take no transpose flags).
constexpr int64_t kXsmmRows = 64, kXsmmCols = 64, kXsmmDepth = 256;

std::vector<float> transposed(const float* src, int64_t rows, int64_t cols, int64_t ld, int threads) {
  // src: (rows x cols, ld) -> (cols x rows, ld = rows)
  std::vector<float> t(size_t(rows * cols));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) t[size_t(j * rows + i)] = src[i * ld + j];
  return t;
}

libxsmm_smmfunction xsmm_kernel(int64_t mc, int64_t nc, int64_t kc, int64_t lda, int64_t ldb, int64_t ldc,
                                float beta) {
  const libxsmm_blasint M = mc, N = nc, K = kc, LDA = lda, LDB = ldb, LDC = ldc;
  const float one = 1;
  const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_PREFETCH_NONE;
  libxsmm_smmfunction f = libxsmm_smmdispatch(M, N, K, &LDA, &LDB, &LDC, &one, &beta, &flags, &prefetch);
  CZ_CHECK(f != nullptr, "libxsmm: no kernel for a {}x{}x{} block (lda={} ldb={} ldc={})", mc, nc, kc, lda,
           ldb, ldc);
  return f;
}

void xsmm_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  static const bool initialised = (libxsmm_init(), true);
  (void)initialised;
  const int threads = threads_here();
  if (k == 0) {  // C = beta C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.f : beta * c[i * ldc + j];
    return;
  }
  std::vector<float> at, bt;
  if (ta) {  // a: (k x m, lda) -> (m x k, k)
    at = transposed(a, k, m, lda, threads);
    a = at.data(), lda = k;
  }
  if (tb) {  // b: (n x k, ldb) -> (k x n, n)
    bt = transposed(b, n, k, ldb, threads);
    b = bt.data(), ldb = n;
  }
  const bool direct = alpha == 1 && (beta == 0 || beta == 1);
  const int64_t row_tiles = (m + kXsmmRows - 1) / kXsmmRows, col_tiles = (n + kXsmmCols - 1) / kXsmmCols;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<float> buf(direct ? 0 : size_t(kXsmmRows * kXsmmCols));
#pragma omp for collapse(2) schedule(static)
    for (int64_t ti = 0; ti < row_tiles; ++ti)
      for (int64_t tj = 0; tj < col_tiles; ++tj) {
        const int64_t i0 = ti * kXsmmRows, j0 = tj * kXsmmCols;
        const int64_t mc = std::min(kXsmmRows, m - i0), nc = std::min(kXsmmCols, n - j0);
        // Where the kernel writes: C itself, or a (mc x nc) tile with ld nc that alpha and beta apply to.
        float* out = direct ? c + i0 * ldc + j0 : buf.data();
        const int64_t ldo = direct ? ldc : nc;
        for (int64_t p0 = 0; p0 < k; p0 += kXsmmDepth) {
          const int64_t kc = std::min(kXsmmDepth, k - p0);
          const float first_beta = direct ? beta : 0;
          const libxsmm_smmfunction f = xsmm_kernel(nc, mc, kc, ldb, lda, ldo, p0 == 0 ? first_beta : 1);
          f(b + p0 * ldb + j0, a + i0 * lda + p0, out);
        }
        if (!direct)
          for (int64_t i = 0; i < mc; ++i) {
            float* cr = c + (i0 + i) * ldc + j0;
            const float* o = out + i * nc;
            for (int64_t j = 0; j < nc; ++j) cr[j] = alpha * o[j] + (beta == 0 ? 0.f : beta * cr[j]);
          }
      }
  }
}

}  // namespace

std::string_view gemm_library_name(GemmLibrary lib) {
  switch (lib) {
    case GemmLibrary::openblas:
      return "openblas";
    case GemmLibrary::onednn:
      return "onednn";
    case GemmLibrary::blis:
      return "blis";
    case GemmLibrary::libxsmm:
      return "libxsmm";
  }
  return "?";
}

std::optional<GemmLibrary> parse_gemm_library(std::string_view name) {
  for (GemmLibrary lib : kGemmLibraries)
    if (gemm_library_name(lib) == name) return lib;
  return std::nullopt;
}

std::string gemm_library_version(GemmLibrary lib) {
  switch (lib) {
    case GemmLibrary::openblas:
      return fmt::format("{} ({})", openblas_get_config(), openblas_get_corename());
    case GemmLibrary::onednn: {
      const dnnl_version_t* v = dnnl_version();
      return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
    }
    case GemmLibrary::blis:
      return fmt::format("BLIS {}", bli_info_get_version_str());
    case GemmLibrary::libxsmm:
      return fmt::format("libxsmm {}", CZ_XSMM_VERSION);
  }
  return "?";
}

std::string openblas_core_name() {
  return openblas_get_corename();
}

void sgemm_on(GemmLibrary lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  switch (lib) {
    case GemmLibrary::openblas:
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
                  int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
      return;
    case GemmLibrary::onednn:
      return onednn_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmLibrary::blis:
      return blis_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmLibrary::libxsmm:
      return xsmm_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace cz::cpu
