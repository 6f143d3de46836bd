// The four CPU libraries an f32 GEMM can run on (OpenBLAS, oneDNN, BLIS, libxsmm), each behind the same
// row-major call; which one runs for which shape is gemm_choice.h's business (Note [CPU GEMM libraries]).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cz::cpu {

enum class GemmLibrary : uint8_t { openblas, onednn, blis, libxsmm };
inline constexpr std::array<GemmLibrary, 4> kGemmLibraries = {GemmLibrary::openblas, GemmLibrary::onednn,
                                                              GemmLibrary::blis, GemmLibrary::libxsmm};

std::string_view gemm_library_name(GemmLibrary lib);                   // "openblas", "onednn", ...
std::optional<GemmLibrary> parse_gemm_library(std::string_view name);  // nullopt for an unknown name
std::string gemm_library_version(GemmLibrary lib);                     // "oneDNN 2.6.3", ...
std::string openblas_core_name();                                      // openblas_get_corename()

// C = alpha * op(A) op(B) + beta * C on `lib`, row-major, f32: C (m x n, ldc), op(A) (m x k), op(B) (k x n);
// A is (m x k, lda) or, with ta, (k x m, lda); B likewise. Called from inside an OpenMP parallel region it
// runs on the calling thread alone (every library), so kernels may call it on tiles from their own threads;
// outside one it uses cpu_threads() threads.
void sgemm_on(GemmLibrary lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cz::cpu
