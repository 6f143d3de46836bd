// 16-bit float storage types (IEEE half and bfloat16) with round-to-nearest-even conversion. Bit-compatible
// with CUDA's __half and __nv_bfloat16, so buffers move between backends unchanged.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace cz {

// The one bf16 rounding of the host code: round to nearest even, a NaN stays a (quiet) NaN. No branch, so
// that loops over it vectorize (the collectives' reductions, the quantized formats' narrowing).
inline uint16_t bf16_from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
// The same with denormal inputs taken as signed zeros, as AVX512_BF16's VCVTNEPS2BF16 and AMX take them: the
// scalar twin of the CPU's bf16 GEMM operands (tensor/cpu/gemm_bf16.cpp).
inline uint16_t bf16_from_float_daz(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  return bf16_from_float(std::bit_cast<float>(u));
}
inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  operator float() const { return bf16_to_float(bits); }

  static uint16_t from_float(float f) { return bf16_from_float(f); }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
    if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (after rounding) -> inf
    if (u < 0x38800000u) {                                  // subnormal or zero in half
      if (u < 0x33000000u) return uint16_t(sign);           // below half the smallest subnormal
      const uint32_t exp = u >> 23;
      const uint32_t mant = (u & 0x7fffffu) | 0x800000u;
      const uint32_t shift = 126 - exp;  // 14 + (112 - exp) + 1 ... aligns to 2^-24
      uint32_t h = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1);
      const uint32_t half_ulp = 1u << (shift - 1);
      if (rem > half_ulp || (rem == half_ulp && (h & 1u))) ++h;
      return uint16_t(sign | h);
    }
    u += 0xfffu + ((u >> 13) & 1u);  // round mantissa to 10 bits, nearest even
    return uint16_t(sign | (((u - 0x38000000u) >> 13) & 0x7fffu));
  }

  static float to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
      u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
      u = sign;
    } else {  // subnormal: value = mant * 2^-24
      const float f = float(mant) * 0x1p-24f;
      u = sign | std::bit_cast<uint32_t>(f);
    }
    return std::bit_cast<float>(u);
  }
};

}  // namespace cz
