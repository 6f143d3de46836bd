// Vectorised host reductions. f32/f64 loops are left to the compiler's vectoriser (checked with
// -fopt-info-vec); the 16-bit types use AVX-512 or AVX2 intrinsics when the build targets them (f16 through
// F16C conversions, bf16 widened by a shift and narrowed with integer round-to-nearest-even), with scalar
// tails that round identically.
#include "dist/comm/reduce_kernels.h"

#include <bit>
#include <cstring>

#include <algorithm>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// GCC 12 reports its own AVX-512 conversion intrinsics (_mm512_undefined_* inside) as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "tensor/check.h"
#include "tensor/half.h"

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
  return bf16_to_float(h);
}
inline uint16_t f32_to_bf16(float f) {
  return bf16_from_float(f);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr int kLanes = 16;
using VecF = __m512;
inline VecF vadd(VecF a, VecF b) {
  return _mm512_add_ps(a, b);
}
inline VecF vmul(VecF a, float s) {
  return _mm512_mul_ps(a, _mm512_set1_ps(s));
}
inline VecF load_bf16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void store_bf16(uint16_t* p, VecF x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), quiet_nan);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline VecF load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store_f16(uint16_t* p, VecF x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#define CZ_HAVE_VEC16 1
#elif defined(__AVX2__) && defined(__F16C__)
constexpr int kLanes = 8;
using VecF = __m256;
inline VecF vadd(VecF a, VecF b) {
  return _mm256_add_ps(a, b);
}
inline VecF vmul(VecF a, float s) {
  return _mm256_mul_ps(a, _mm256_set1_ps(s));
}
inline VecF load_bf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline void store_bf16(uint16_t* p, VecF x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet_nan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  // Narrow 8 x u32 (each <= 0xffff) to 8 x u16: pack within 128-bit lanes, then gather the two halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline VecF load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store_f16(uint16_t* p, VecF x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#define CZ_HAVE_VEC16 1
#endif

// dst = (a + b) * scale for 16-bit storage types: vector body, scalar tail with the same rounding.
template <bool kBf16>
void add_16bit(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, float scale) {
  int64_t i = 0;
#ifdef CZ_HAVE_VEC16
  for (; i + kLanes <= n; i += kLanes) {
    VecF s = kBf16 ? vadd(load_bf16(a + i), load_bf16(b + i)) : vadd(load_f16(a + i), load_f16(b + i));
    if (scale != 1.f) s = vmul(s, scale);
    if (kBf16)
      store_bf16(dst + i, s);
    else
      store_f16(dst + i, s);
  }
#endif
  for (; i < n; ++i) {
    if (kBf16) {
      const float s = bf16_to_f32(a[i]) + bf16_to_f32(b[i]);
      dst[i] = f32_to_bf16(scale == 1.f ? s : s * scale);
    } else {
      const float s = Half::to_float(a[i]) + Half::to_float(b[i]);
      dst[i] = Half::from_float(scale == 1.f ? s : s * scale);
    }
  }
}

// dst = src * scale, by way of (src + 0) * scale: adding zero is exact and keeps one code path (a -0 input
// becomes +0, which no average cares about).
template <bool kBf16>
void scale_16bit(uint16_t* dst, const uint16_t* src, int64_t n, float scale) {
  constexpr int64_t kBlock = 256;
  const std::vector<uint16_t> zeros(size_t(kBlock), 0);
  for (int64_t i = 0; i < n; i += kBlock)
    add_16bit<kBf16>(dst + i, src + i, zeros.data(), std::min(kBlock, n - i), scale);
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
      return add_16bit<true>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                             static_cast<const uint16_t*>(b), n, float(scale));
    case DType::f16:
      return add_16bit<false>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
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
      return scale_16bit<true>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                               float(scale));
    case DType::f16:
      return scale_16bit<false>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                                float(scale));
    default:
      throw DtypeError(
          fmt::format("scale_copy: collectives reduce f32, f64, f16 or bf16, not {}", dtype_name(dtype)));
  }
}

}  // namespace cz::dist
