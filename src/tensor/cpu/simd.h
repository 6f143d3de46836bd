// Portable SIMD for the CPU kernels: GCC/Clang vector extensions at the widest width the build targets
// (-march=native: 64 bytes with AVX-512, 32 with AVX2, else 16), plus narrower vectors and plain scalars for
// channel tails. Kernel bodies are templates over the vector type V; a scalar T is a valid V with one lane.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

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

}  // namespace cz::cpu::simd
