// Host reductions. f32/f64 loops are left to the compiler's vectoriser (checked with -fopt-info-vec); the
// 16-bit types are widened to f32 a block at a time, added there, and narrowed back with tensor/cpu/simd.h's
// conversions (F16C/AVX-512 for f16, half.h's round-to-nearest-even for bf16).
#include "dist/comm/reduce_kernels.h"

#include <algorithm>
#include <vector>

#include "tensor/check.h"
#include "tensor/cpu/simd.h"

namespace cz::dist {
namespace {

template <class T>
void add_float(T* dst, const T* a, const T* b, int64_t n, T scale) {
  if (scale == T(1)) {
    for (int64_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = (a[i] + b[i]) * scale;
  }
}

template <class T>
void scale_float(T* dst, const T* src, int64_t n, T scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

// dst = (a + b) * scale for 16-bit storage types, in f32 blocks on the stack: each value is widened exactly,
// added (and scaled) in f32 and rounded once. A block is read whole before it is written, so dst may be a or
// b.
void add_16bit(bool bf16, uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, float scale) {
  constexpr int64_t kBlock = 256;
  alignas(64) float va[kBlock], vb[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    cpu::simd::widen_16bit(bf16, a + i, len, va);
    cpu::simd::widen_16bit(bf16, b + i, len, vb);
    add_float(va, va, vb, len, scale);
    cpu::simd::narrow_16bit(bf16, va, len, dst + i);
  }
}

// dst = src * scale, by way of (src + 0) * scale: adding zero is exact and keeps one code path (a -0 input
// becomes +0, which no average cares about).
void scale_16bit(bool bf16, uint16_t* dst, const uint16_t* src, int64_t n, float scale) {
  constexpr int64_t kBlock = 256;
  const std::vector<uint16_t> zeros(size_t(kBlock), 0);
  for (int64_t i = 0; i < n; i += kBlock)
    add_16bit(bf16, dst + i, src + i, zeros.data(), std::min(kBlock, n - i), scale);
}

}  // namespace

void reduce_add(DType dtype, void* dst, const void* a, const void* b, int64_t n, double scale) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::f32:
      return add_float(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b),
                       n, float(scale));
    case DType::f64:
      return add_float(static_cast<double*>(dst), static_cast<const double*>(a),
                       static_cast<const double*>(b), n, scale);
    case DType::bf16:
    case DType::f16:
      return add_16bit(dtype == DType::bf16, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                       static_cast<const uint16_t*>(b), n, float(scale));
    default:
      throw DtypeError(
          fmt::format("reduce_add: collectives reduce f32, f64, f16 or bf16, not {}", dtype_name(dtype)));
  }
}

void scale_copy(DType dtype, void* dst, const void* src, int64_t n, double scale) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::f32:
      return scale_float(static_cast<float*>(dst), static_cast<const float*>(src), n, float(scale));
    case DType::f64:
      return scale_float(static_cast<double*>(dst), static_cast<const double*>(src), n, scale);
    case DType::bf16:
    case DType::f16:
      return scale_16bit(dtype == DType::bf16, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                         n, float(scale));
    default:
      throw DtypeError(
          fmt::format("scale_copy: collectives reduce f32, f64, f16 or bf16, not {}", dtype_name(dtype)));
  }
}

}  // namespace cz::dist
