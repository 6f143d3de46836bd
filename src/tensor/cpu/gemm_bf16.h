// --precision bf16 on the CPU: fp32 GEMMs whose operands are rounded to bf16 and multiplied on the CPU's bf16
// units (AMX or AVX512_BF16, through oneDNN's matmul), accumulated and returned in fp32. Note [bf16 on the
// CPU].
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace cz::cpu {

enum class MatmulPrecision { fp32, bf16 };

namespace detail {
inline std::atomic<MatmulPrecision> matmul_precision{MatmulPrecision::fp32};
}

// Process-wide, as PyTorch's torch.set_float32_matmul_precision: every cz::cpu::gemm<float> reads it. bf16
// throws (require_bf16) where this CPU lacks AVX512_BF16 and AMX.
void set_matmul_precision(MatmulPrecision p);
inline MatmulPrecision matmul_precision() {
  return detail::matmul_precision.load(std::memory_order_relaxed);
}

// Sets the precision for a scope (tests), restoring the previous one.
class ScopedMatmulPrecision {
 public:
  explicit ScopedMatmulPrecision(MatmulPrecision p) : prev_(matmul_precision()) { set_matmul_precision(p); }
  ~ScopedMatmulPrecision() { detail::matmul_precision.store(prev_); }
  ScopedMatmulPrecision(const ScopedMatmulPrecision&) = delete;
  ScopedMatmulPrecision& operator=(const ScopedMatmulPrecision&) = delete;

 private:
  MatmulPrecision prev_;
};

// C = alpha * op(A) op(B) + beta * C, row-major, as cz::cpu::gemm, with A and B rounded to bf16 first.
// Callable from inside an OpenMP parallel region (it then runs on the calling thread).
void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y[i] = x[i] rounded to bf16 (round to nearest even; NaN stays NaN; denormals flush to signed zero, as the
// VCVTNE2PS2BF16 instruction does), as its upper 16 bits.
void round_to_bf16(const float* x, uint16_t* y, int64_t n);

// What runs the bf16 GEMMs: the ISA and oneDNN's implementation, e.g. "AMX-BF16 (oneDNN 2.6.3
// brg:avx512_core_amx)". Throws as set_matmul_precision where the CPU has neither.
std::string bf16_gemm_engine();

}  // namespace cz::cpu
