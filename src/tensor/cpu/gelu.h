// Exact (erf) GELU on SIMD vectors: the normal CDF and density, vectorizable and branch-free for f32
// (relative error of Phi about 4e-7 over the whole f32 range), std::erfc for f64. Shared by the GELU kernels
// and the fused linear + GELU kernels.
#pragma once

#include <cmath>

#include "tensor/cpu/simd.h"

namespace cz::cpu::gelu_math {

using simd::bitcast;
using simd::Elem;
using simd::kLanes;
using simd::splat;

// The int32 vector (or int32_t) with the lanes of a float vector V.
template <class V>
struct IntOfT {
  using type = simd::Vec<int32_t, int(sizeof(V))>;
};
template <>
struct IntOfT<float> {
  using type = int32_t;
};
template <class V>
using IntOf = typename IntOfT<V>::type;

// exp(hi + lo) for hi in [-87, 0] and |lo| < 0.1: Cody-Waite reduction by ln 2 (split in a part with few
// bits and a correction, so n * kLn2Hi is exact), then the degree-7 Taylor polynomial on |r| <= 0.45
// (truncation error < 4e-8). `lo` carries what f32 cannot hold of the argument.
template <class V>
inline V exp_split(V hi, V lo) {
  using I = IntOf<V>;
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 0x1.8p23f;  // adding it rounds to an integer held in the low mantissa bits
  const V t = hi * kLog2e + kRound;
  const V n = t - kRound;
  const V r = (hi - n * kLn2Hi) - n * kLn2Lo + lo;
  V p = splat<V>(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const I ni = bitcast<I>(t) - bitcast<I>(splat<V>(kRound));
  return p * bitcast<V>((ni + 127) << 23);
}

// For f32 vectors: cdf = Phi(x), e = exp(-x^2 / 2).
// Phi(-|x|) = erfc(|x| / sqrt 2) / 2 = exp(-x^2 / 2) * erfcx(|x| / sqrt 2) / 2, where the scaled erfc,
// erfcx(t) = exp(t^2) erfc(t), is smooth and bounded on [0, inf). It is approximated as s * P(s) with
// s = 1 / (1 + t / 2) in (0, 1] and P of degree 9, fitted to erfcx in a weighted least-squares (Lawson)
// iteration on relative error against mpmath (max fitted relative error 2e-8). Computing Phi(x) for x > 0 as
// 1 - Phi(-x) then loses nothing, and the tail x < 0 keeps its relative accuracy. x^2 is split exactly into
// hi + lo (x with 12 significant bits squares exactly), without which exp(-x^2/2) would lose up to 5e-6
// relative accuracy at |x| ~ 12.
template <class V>
inline void normal_cdf_pdf(V x, V& cdf, V& e) {
  using I = IntOf<V>;
  const V ax = bitcast<V>(bitcast<I>(x) & 0x7fffffff);
  const V s = 1.0f / (1.0f + ax * 0.353553391f);  // 1 / (1 + |x| / (2 sqrt 2))
  V q = splat<V>(0.0138519825f);
  q = q * s - 0.13161619f;
  q = q * s + 0.448173136f;
  q = q * s - 0.695049107f;
  q = q * s + 0.441482127f;
  q = q * s - 0.108793095f;
  q = q * s + 0.229017779f;
  q = q * s + 0.237934932f;
  q = q * s + 0.282937825f;
  q = q * s + 0.282060593f;
  q = q * s;
  const V xh = bitcast<V>(bitcast<I>(x) & int32_t(0xfffff000));
  const V hi = xh * xh * -0.5f;              // exact
  const V lo = (x - xh) * (x + xh) * -0.5f;  // x^2 = xh^2 + (x - xh)(x + xh)
  const V y = hi + lo;
  e = exp_split(hi > -87.0f ? hi : splat<V>(-87.0f), lo);
  e = y > -87.0f ? e : splat<V>(0.0f);
  const V half_tail = 0.5f * q * e;  // Phi(-|x|)
  cdf = x < 0.0f ? half_tail : 1.0f - half_tail;
}

inline constexpr double kInvSqrt2Pi = 0.3989422804014327, kSqrtHalf = 0.7071067811865476;

template <class V>
inline V gelu(V x) {
  if constexpr (std::is_same_v<Elem<V>, double>) {
    return 0.5 * x * std::erfc(-x * kSqrtHalf);
  } else {
    V cdf, e;
    normal_cdf_pdf(x, cdf, e);
    return x * cdf;
  }
}

// d gelu / dx = Phi(x) + x phi(x).
template <class V>
inline V gelu_grad(V x) {
  if constexpr (std::is_same_v<Elem<V>, double>) {
    return 0.5 * std::erfc(-x * kSqrtHalf) + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi;
  } else {
    V cdf, e;
    normal_cdf_pdf(x, cdf, e);
    return cdf + x * e * float(kInvSqrt2Pi);
  }
}

}  // namespace cz::cpu::gelu_math
