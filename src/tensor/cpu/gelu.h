// Exact (erf) GELU on SIMD vectors: the normal CDF and density, vectorizable and branch-free for f32
// (relative error below 5e-7 over the whole f32 range), std::erfc for f64. Shared by the GELU kernels
// and the fused linear + GELU kernels.
#pragma once

#include <cmath>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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
// bits and a correction, so n * kLn2Hi is exact), then a degree-6 polynomial on |r| <= 0.46 (minimax for
// relative error, 1.3e-8). `lo` carries what f32 cannot hold of the argument.
template <class V>
inline V exp_split(V hi, V lo) {
  using I = IntOf<V>;
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 0x1.8p23f;  // adding it rounds to an integer held in the low mantissa bits
  const V t = hi * kLog2e + kRound;
  const V n = t - kRound;
  const V r = (hi - n * kLn2Hi) - n * kLn2Lo + lo;
  V p = splat<V>(0.00137973204f);
  p = p * r + 0.0084061129f;
  p = p * r + 0.0416714884f;
  p = p * r + 0.166659117f;
  p = p * r + 0.499999583f;
  p = p * r + 1.00000024f;
  p = p * r + 1.0f;
  // 2^n: n + 127 in the exponent field. The low bits of t hold n plus those of kRound; subtracting
  // bits(kRound) - 127 leaves n + 127.
  const I biased = bitcast<I>(t) - (bitcast<int32_t>(kRound) - 127);
  return p * bitcast<V>(biased << 23);
}

// 1 / d for f32 lanes d >= 1. With AVX-512 on 16 lanes: VRCP14PS (relative error below 2^-14) and one
// Newton step, r (2 - d r), which squares that error to below 2^-28, under f32's half ulp. It made
// bench_kernels' gelu_fwd and gelu_bwd at ConvNeXt-T's first stage 10% and 14% faster on one thread of a Xeon
// (model 167); where the data come from memory (the fused MLP's epilogues at atto's sizes) the pass is
// bound by the memory and gains nothing. Elsewhere a division (AVX2's 12-bit VRCPPS would need two Newton
// steps to keep the error budget).
template <class V>
inline V recip_from_one(V d) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && std::is_same_v<Elem<V>, float>) {
    const V r = V(_mm512_maskz_rcp14_ps(__mmask16(0xffff), __m512(d)));
    return r * (2.0f - d * r);
  }
#endif
  return 1.0f / d;
}

// For f32 vectors: cdf = Phi(x), e = exp(-x^2 / 2).
// Phi(-|x|) = erfc(|x| / sqrt 2) / 2 = exp(-x^2 / 2) * erfcx(|x| / sqrt 2) / 2, where the scaled erfc,
// erfcx(t) = exp(t^2) erfc(t), is smooth and bounded on [0, inf). erfcx(t) / 2 is approximated as s * P(s)
// with s = 1 / (1 + 0.3 t) in (0, 1] and P of degree 8, fitted in a weighted least-squares (Lawson)
// iteration on relative error against mpmath (max fitted relative error 2e-8). Computing Phi(x) for x > 0 as
// 1 - Phi(-x) then loses nothing, and the tail x < 0 keeps its relative accuracy. x^2 is split exactly into
// hi + lo (x with 12 significant bits squares exactly), without which exp(-x^2/2) would lose up to 5e-6
// relative accuracy at |x| ~ 12. Measured over [-15, 15]: relative error of x Phi(x) below 5e-7
// (test_op_behaviour).
template <class V>
inline void normal_cdf_pdf(V x, V& cdf, V& e) {
  using I = IntOf<V>;
  const V ax = bitcast<V>(bitcast<I>(x) & 0x7fffffff);
  const V s = recip_from_one(1.0f + ax * 0.212132034f);  // 1 / (1 + 0.3 |x| / sqrt 2)
  V q = splat<V>(-0.0647170544f);
  q = q * s + 0.242548287f;
  q = q * s - 0.255613357f;
  q = q * s + 0.273197681f;
  q = q * s - 0.0468157344f;
  q = q * s + 0.107218184f;
  q = q * s + 0.074241206f;
  q = q * s + 0.0853459686f;
  q = q * s + 0.0845948085f;
  q = q * s;
  const V xh = bitcast<V>(bitcast<I>(x) & int32_t(0xfffff000));
  const V hi = xh * xh * -0.5f;              // exact
  const V lo = (x - xh) * (x + xh) * -0.5f;  // x^2 = xh^2 + (x - xh)(x + xh)
  e = exp_split(hi > -87.0f ? hi : splat<V>(-87.0f), lo);
  e = hi + lo > -87.0f ? e : splat<V>(0.0f);
  const V tail = q * e;  // Phi(-|x|)
  cdf = x < 0.0f ? tail : 1.0f - tail;
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

// gelu(x) and gelu'(x) from one evaluation of the normal CDF and density, bit for bit what gelu(x) and
// gelu_grad(x) give.
template <class V>
inline void gelu_and_grad(V x, V& y, V& d) {
  if constexpr (std::is_same_v<Elem<V>, double>) {
    y = gelu(x);
    d = gelu_grad(x);
  } else {
    V cdf, e;
    normal_cdf_pdf(x, cdf, e);
    y = x * cdf;
    d = cdf + x * e * float(kInvSqrt2Pi);
  }
}

}  // namespace cz::cpu::gelu_math
