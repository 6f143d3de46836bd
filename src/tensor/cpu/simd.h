// The one SIMD layer of the host code (tensor kernels, optimizer updates, collectives' reductions, quantized
// blocks): GCC/Clang vector extensions at the widest width the build targets (-march=native: 64 bytes with
// AVX-512, 32 with AVX2, else 16), plus narrower vectors and plain scalars for channel tails. Kernel bodies
// are templates over the vector type V; a scalar T is a valid V with one lane.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "tensor/half.h"

namespace cz::cpu::simd {

#if defined(__AVX512F__)
inline constexpr int kBytes = 64;
#elif defined(__AVX__)
inline constexpr int kBytes = 32;
#else
inline constexpr int kBytes = 16;
#endif

template <class T, int Bytes>
struct VecOf;
#define CZ_SIMD_VEC(T, B)                           \
  template <>                                       \
  struct VecOf<T, B> {                              \
    typedef T type __attribute__((vector_size(B))); \
  };
CZ_SIMD_VEC(float, 64)
CZ_SIMD_VEC(float, 32)
CZ_SIMD_VEC(float, 16)
CZ_SIMD_VEC(double, 64)
CZ_SIMD_VEC(double, 32)
CZ_SIMD_VEC(double, 16)
CZ_SIMD_VEC(int32_t, 64)
CZ_SIMD_VEC(int32_t, 32)
CZ_SIMD_VEC(int32_t, 16)
#undef CZ_SIMD_VEC

template <class T, int Bytes = kBytes>
using Vec = typename VecOf<T, Bytes>::type;

// Element type and lane count of V (a vector type or a scalar).
template <class V>
struct Traits {
  using Elem = V;
  static constexpr int kLanes = 1;
};
template <class V>
requires requires(V v) {
  v[0];
}
struct Traits<V> {
  using Elem = std::remove_cvref_t<decltype(V{}[0])>;
  static constexpr int kLanes = int(sizeof(V) / sizeof(Elem));
};
template <class V>
inline constexpr int kLanes = Traits<V>::kLanes;
template <class V>
using Elem = typename Traits<V>::Elem;

template <class T>
inline constexpr int kMaxLanes = kBytes / int(sizeof(T));

template <class V>
inline V load(const Elem<V>* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
inline void store(Elem<V>* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}
template <class V>
inline V splat(Elem<V> x) {
  return V{} + x;
}
template <class To, class From>
inline To bitcast(From v);

// Sum of the lanes, as a tree: halves are added down to 16 bytes, then the last lanes one by one.
template <class V>
inline Elem<V> hsum(V v) {
  if constexpr (kLanes<V> == 1) {
    return v;
  } else if constexpr (sizeof(V) <= 16) {
    Elem<V> s = v[0];
    for (int i = 1; i < kLanes<V>; ++i) s += v[i];
    return s;
  } else {
    using H = Vec<Elem<V>, int(sizeof(V)) / 2>;
    H lo, hi;
    std::memcpy(&lo, &v, sizeof(H));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(H), sizeof(H));
    return hsum(lo + hi);
  }
}
template <class To, class From>
inline To bitcast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &v, sizeof(To));
  return t;
}

// Calls f(V{}, c) for blocks covering [begin, end): full-width vectors, then one half-width and one
// quarter-width vector where they fit, then scalars. With AVX-512 and f32, C = 40 runs as 16 + 16 + 8.
template <class T, class F>
inline void for_blocks(int64_t begin, int64_t end, F&& f) {
  constexpr int kL = kMaxLanes<T>;
  int64_t c = begin;
  for (; c + kL <= end; c += kL) f(Vec<T>{}, c);
  if constexpr (kBytes >= 32) {
    if (c + kL / 2 <= end) {
      f(Vec<T, kBytes / 2>{}, c);
      c += kL / 2;
    }
  }
  if constexpr (kBytes >= 64) {
    if (c + kL / 4 <= end) {
      f(Vec<T, kBytes / 4>{}, c);
      c += kL / 4;
    }
  }
  for (; c < end; ++c) f(T{}, c);
}

// Note [Bitwise-identical tails]: fma and sqrt give a lane the same bits in every width, scalars included —
// fma rounds once wherever the build has FMA (a vfmadd for each width) and twice everywhere without it, sqrt
// is correctly rounded, and + - * / are IEEE operations already. So an element's result does not depend on
// whether for_blocks hands it to a vector body or a tail, which is what makes a sharded optimizer update
// equal the unsharded one bit for bit, whatever the shard boundaries and thread count. A file that relies on
// it is compiled with -ffp-contract=off (cz_optim's kernels), so the compiler fuses no a * b + c on its own.
template <class V>
inline V fma(V a, V b, V c) {
  static_assert(std::is_floating_point_v<Elem<V>>);
#if defined(__FMA__)
  constexpr bool kF32 = std::is_same_v<Elem<V>, float>;
  if constexpr (kLanes<V> == 1) {
    return std::fma(a, b, c);
#if defined(__AVX512F__)
  } else if constexpr (sizeof(V) == 64) {
    if constexpr (kF32)
      return V(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c)));
    else
      return V(_mm512_fmadd_pd(__m512d(a), __m512d(b), __m512d(c)));
#endif
  } else if constexpr (sizeof(V) == 32) {
    if constexpr (kF32)
      return V(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c)));
    else
      return V(_mm256_fmadd_pd(__m256d(a), __m256d(b), __m256d(c)));
  } else {
    static_assert(sizeof(V) == 16);
    if constexpr (kF32)
      return V(_mm_fmadd_ps(__m128(a), __m128(b), __m128(c)));
    else
      return V(_mm_fmadd_pd(__m128d(a), __m128d(b), __m128d(c)));
  }
#else
  return a * b + c;
#endif
}

template <class V>
inline V sqrt(V a) {
  static_assert(std::is_floating_point_v<Elem<V>>);
  constexpr bool kF32 = std::is_same_v<Elem<V>, float>;
  if constexpr (kLanes<V> == 1) {
    return std::sqrt(a);
#if defined(__AVX512F__)
  } else if constexpr (sizeof(V) == 64) {
    // Zero-masked with a full mask: the same instruction, without GCC 12's false -Wmaybe-uninitialized on
    // _mm512_sqrt_ps.
    if constexpr (kF32)
      return V(_mm512_maskz_sqrt_ps(__mmask16(0xFFFF), __m512(a)));
    else
      return V(_mm512_maskz_sqrt_pd(__mmask8(0xFF), __m512d(a)));
#endif
#if defined(__AVX__)
  } else if constexpr (sizeof(V) == 32) {
    if constexpr (kF32)
      return V(_mm256_sqrt_ps(__m256(a)));
    else
      return V(_mm256_sqrt_pd(__m256d(a)));
#endif
#if defined(__SSE2__)
  } else if constexpr (sizeof(V) == 16) {
    if constexpr (kF32)
      return V(_mm_sqrt_ps(__m128(a)));
    else
      return V(_mm_sqrt_pd(__m128d(a)));
#endif
  } else {
    V r = a;
    for (int i = 0; i < kLanes<V>; ++i) r[i] = std::sqrt(a[i]);
    return r;
  }
}

// The widest vectors the updates run in, for benchmark labels.
inline constexpr const char* kIsaName = kBytes == 64 ? "avx512" : kBytes == 32 ? "avx2" : "sse";

// Runs of 16-bit floats widened to f32 and narrowed back, len values. bf16 through tensor/half.h's functions
// (branch-free, so the loops vectorize); f16 through F16C/AVX-512 conversions, which are exact when widening
// and round to nearest even when narrowing, as Half's scalar ones that take the tails.
inline void widen_bf16(const uint16_t* x, int64_t len, float* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = bf16_to_float(x[i]);
}
inline void narrow_bf16(const float* v, int64_t len, uint16_t* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = bf16_from_float(v[i]);
}
// GCC 12 reports its own AVX-512 conversion intrinsics (_mm512_undefined_* inside) as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
inline void widen_f16(const uint16_t* x, int64_t len, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= len; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
#elif defined(__F16C__)
  for (; i + 8 <= len; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
  for (; i < len; ++i) out[i] = Half::to_float(x[i]);
}
inline void narrow_f16(const float* v, int64_t len, uint16_t* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= len; i += 16)
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out + i),
        _mm512_cvtps_ph(_mm512_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  for (; i + 8 <= len; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < len; ++i) out[i] = Half::from_float(v[i]);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
inline void widen_16bit(bool bf16, const uint16_t* x, int64_t len, float* out) {
  bf16 ? widen_bf16(x, len, out) : widen_f16(x, len, out);
}
inline void narrow_16bit(bool bf16, const float* v, int64_t len, uint16_t* out) {
  bf16 ? narrow_bf16(v, len, out) : narrow_f16(v, len, out);
}

}  // namespace cz::cpu::simd
