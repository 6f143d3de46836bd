// A minimal vector abstraction for the optimizer kernels: one element-wise update is written once as a
// template over `Ops`, and instantiated for AVX-512, AVX2+FMA, or plain scalars. Note [Bitwise-identical
// tails]: the scalar instantiation performs exactly the same IEEE operations (fma where the vector code uses
// fma, correctly rounded sqrt and div), so an element gets the same bits whether it falls in a vector body or
// a scalar tail — which is what makes a sharded update equal to the unsharded one bit for bit, whatever the
// shard boundaries and thread count. This file must be compiled with -ffp-contract=off (set for cz_optim),
// so the compiler does not fuse a*b+c differently in the two instantiations.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace cz::simd {

// Scalar "vectors" of width 1 (float or double).
template <class T>
struct ScalarOps {
  using Elem = T;
  using V = T;
  static constexpr int kWidth = 1;
  static V load(const T* p) { return *p; }
  static void store(T* p, V v) { *p = v; }
  static V set1(T x) { return x; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V sqrt(V a) { return std::sqrt(a); }
#if defined(__FMA__)
  static V fma(V a, V b, V c) {
    return std::fma(a, b, c);
  }  // one vfmadd instruction
#else
  static V fma(V a, V b, V c) {
    return a * b + c;
  }  // no FMA unit: no vector path either, so still consistent
#endif
};

#if defined(__AVX512F__)
struct Avx512F32 {
  using Elem = float;
  using V = __m512;
  static constexpr int kWidth = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  // Zero-masked with a full mask: the same instruction, without GCC 12's false -Wmaybe-uninitialized on
  // _mm512_sqrt_ps.
  static V sqrt(V a) { return _mm512_maskz_sqrt_ps(__mmask16(0xFFFF), a); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
using BestF32 = Avx512F32;
inline constexpr const char* kIsaName = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
struct Avx2F32 {
  using Elem = float;
  using V = __m256;
  static constexpr int kWidth = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
using BestF32 = Avx2F32;
inline constexpr const char* kIsaName = "avx2";
#else
using BestF32 = ScalarOps<float>;
inline constexpr const char* kIsaName = "scalar";
#endif

// The widest instantiation for T: SIMD for float, scalar for double (f64 exists for tests).
template <class T>
struct Best {
  using type = ScalarOps<T>;
};
template <>
struct Best<float> {
  using type = BestF32;
};

// Runs `body.template operator()<Ops>(i)` over [0, n): vectors of Ops::kWidth, then a scalar tail.
template <class T, class Body>
inline void vector_loop(int64_t n, Body&& body) {
  using O = typename Best<T>::type;
  int64_t i = 0;
  if constexpr (O::kWidth > 1) {
    for (; i + O::kWidth <= n; i += O::kWidth) body.template operator()<O>(i);
  }
  for (; i < n; ++i) body.template operator()<ScalarOps<T>>(i);
}

}  // namespace cz::simd
