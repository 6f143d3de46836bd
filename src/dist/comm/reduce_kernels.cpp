// Vectorised host reductions. f32/f64 loops are left to the compiler's vectoriser (checked with
// -fopt-info-vec); f16 uses F16C conversions when the build targets them; bf16 widens by a shift and narrows
// with integer round-to-nearest-even, which vectorises as written.
#include "dist/comm/reduce_kernels.h"

#include <bit>
#include <cstring>

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "tensor/check.h"

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

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(uint32_t(h) << 16);
}
inline uint16_t f32_to_bf16(float f) {  // same rounding as BFloat16::from_float, without the branch
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

void add_bf16(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, float scale) {
  if (scale == 1.f) {
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16((bf16_to_f32(a[i]) + bf16_to_f32(b[i])) * scale);
  }
}
void scale_bf16(uint16_t* dst, const uint16_t* src, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(bf16_to_f32(src[i]) * scale);
}

void add_f16(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, float scale) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  const __m256 vs = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m256 s = _mm256_add_ps(x, y);
    if (scale != 1.f) s = _mm256_mul_ps(s, vs);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) {
    const float s = (Half::to_float(a[i]) + Half::to_float(b[i])) * scale;
    dst[i] = Half::from_float(s);
  }
}
void scale_f16(uint16_t* dst, const uint16_t* src, int64_t n, float scale) {
  add_f16(dst, src, src, n, 0.5f * scale);  // (x + x) * s/2 == x * s exactly in f32 (a power-of-two step)
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
      return add_bf16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                      static_cast<const uint16_t*>(b), n, float(scale));
    case DType::f16:
      return add_f16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
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
      return scale_bf16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, float(scale));
    case DType::f16:
      return scale_f16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, float(scale));
    default:
      throw DtypeError(
          fmt::format("scale_copy: collectives reduce f32, f64, f16 or bf16, not {}", dtype_name(dtype)));
  }
}

}  // namespace cz::dist
