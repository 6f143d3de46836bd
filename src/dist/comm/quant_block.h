// The arithmetic of the block-quantized INT8 format (Note [Quantized blocks], quant.h) as host/device
// functions: the CPU kernels (quant.cpp), the CUDA kernels (cuda/quant_kernels.cu) and the CUDA emulation
// test (tests/dist/comm/test_quant.cpp) all compute through them, so they agree bit for bit. Plain C++ apart
// from CZ_QHD: no CUDA header is needed, and nvcc compiles it as C++17 (no <bit>, no project headers).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CZ_QHD __host__ __device__ __forceinline__
#else
#define CZ_QHD inline
#endif

namespace cz::dist::quant {

inline constexpr int kQMax = 127;         // values are integers in [-127, 127]; -128 never occurs
inline constexpr int64_t kMinBlock = 32;  // block sizes: multiples of 32 (a warp) in [32, 4096]
inline constexpr int64_t kMaxBlock = 4096;
// A block whose largest magnitude is below 127 x FLT_MIN (1.49e-36) is sent as zeros with scale 0: above it,
// the scale (>= FLT_MIN) and its reciprocal (<= 2^126) are normal f32 numbers, so x * (1 / scale) stays
// within
// [-127.0001, 127.0001] and no subnormal scale loses bits. (127 x 2^-126 = 1.984375 x 2^-120.)
inline constexpr uint32_t kMinAmaxBits = 0x03fe0000u;
inline constexpr uint32_t kInfBits = 0x7f800000u;

CZ_QHD uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
CZ_QHD float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// |x| as bits. For non-negative floats the integer order is the float order, and NaNs (0x7f800001 and up)
// sort above Inf above every finite value: the block maximum taken over these is exact, independent of the
// reduction order (so the CPU, the GPU and any thread count agree), and a NaN anywhere wins.
CZ_QHD uint32_t abs_bits(float x) {
  return float_bits(x) & 0x7fffffffu;
}
CZ_QHD uint32_t max_bits(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}

// The block's scale from its largest |x| (as bits): amax / 127 for finite blocks, 0 for zero or tiny blocks,
// Inf (only Infs, no NaN) or NaN for a block holding a non-finite value, so the receiver sees it.
CZ_QHD float block_scale(uint32_t amax_bits) {
  if (amax_bits < kMinAmaxBits) return 0.f;
  return bits_float(amax_bits) / float(kQMax);
}

// INT4 (Note [INT4 blocks] in quant.h): codes in [-7, 7], two per byte (the even element in the low nibble),
// scale amax / 7; tiny below 7 x FLT_MIN (7 x 2^-126 = 1.75 x 2^-124), for the same reason as above.
inline constexpr int kQMax4 = 7;
inline constexpr uint32_t kMinAmaxBits4 = 0x01e00000u;
CZ_QHD float block_scale4(uint32_t amax_bits) {
  if (amax_bits < kMinAmaxBits4) return 0.f;
  return bits_float(amax_bits) / float(kQMax4);
}
CZ_QHD uint8_t pack4(int8_t lo, int8_t hi) {
  return uint8_t((uint8_t(lo) & 0x0fu) | (uint8_t(hi) << 4));
}
CZ_QHD int8_t low4(uint8_t b) {  // the nibble's sign extended
  return int8_t(int8_t(uint8_t(b << 4)) >> 4);
}
CZ_QHD int8_t high4(uint8_t b) {
  return int8_t(int8_t(b) >> 4);
}
CZ_QHD bool finite_scale(float scale) {
  return float_bits(scale) < kInfBits;  // scales are never negative
}
// What values are multiplied by before rounding; 0 marks a block sent as zeros (tiny, zero or non-finite).
CZ_QHD float inverse_scale(float scale) {
  return scale > 0.f && finite_scale(scale) ? 1.f / scale : 0.f;
}

// One value of a block with inverse scale inv > 0: round to nearest, ties to even (the default rounding mode
// on the host; rintf on the device). |v| <= amax gives |v * inv| <= 127.0001, so the result is in [-127, 127]
// without clamping.
CZ_QHD int8_t quantize_value(float v, float inv) {
  return int8_t(int(rintf(v * inv)));
}
CZ_QHD float dequantize_value(int8_t q, float scale) {
  return float(q) * scale;  // a non-finite scale makes the whole block NaN (0 x Inf = NaN)
}
// The error-feedback residual of one value: what the receiver will not see, v - deq(q). A non-finite block's
// residual is 0: that step is skipped by the overflow check, and a NaN kept here would poison every later
// one.
CZ_QHD float residual_value(float v, int8_t q, float scale) {
  return finite_scale(scale) ? fmaf(-float(q), scale, v) : 0.f;
}

// Number of blocks of `block` values covering n values.
CZ_QHD int64_t block_count(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

// Note [Quantization kernels on the GPU]: one CUDA block quantizes one quantized block, with
// quant_threads(block) threads; thread t takes elements t, t + threads, ... (coalesced). Phase 1: each
// thread's largest |v| (thread_amax); the block's maximum of those (warp shuffles, then shared memory; exact
// in any order); phase 2: each thread quantizes its elements with the block's scale (thread_quantize) and
// writes the extra outputs of the source (the f32 sum, the residual). Values are computed twice rather than
// kept in shared memory: a source's value is a pure function of its inputs, so both phases see the same bits.
CZ_QHD int quant_threads(int64_t block) {
  return block < 128 ? int(block) : 128;
}

// Sources: value(i) of element i of the block being quantized, and what else is written once q is known.
// Quantize a stored input (T: the storage type, Cvt::in widens it to float).
template <class T, class Cvt>
struct InputSource {
  const T* x;
  CZ_QHD float value(int64_t i) const { return Cvt::in(x[i]); }
  CZ_QHD void finish(int64_t, float, int8_t, float) const {}
};
// deq(a) + b, one rounding (fma); sum (may be null) receives the f32 value.
struct AddSource {
  const int8_t* aq;
  float a_scale;  // the block's scale of a
  const float* b;
  float* sum;
  CZ_QHD float value(int64_t i) const { return fmaf(float(aq[i]), a_scale, b[i]); }
  CZ_QHD void finish(int64_t i, float v, int8_t, float) const {
    if (sum) sum[i] = v;
  }
};
// deq(a) + deq(b): b's product rounded, then one fma.
struct AddQuantizedSource {
  const int8_t* aq;
  float a_scale;
  const int8_t* bq;
  float b_scale;
  float* sum;
  CZ_QHD float value(int64_t i) const { return fmaf(float(aq[i]), a_scale, float(bq[i]) * b_scale); }
  CZ_QHD void finish(int64_t i, float v, int8_t, float) const {
    if (sum) sum[i] = v;
  }
};
// x + residual, the residual replaced by what this quantization loses (error feedback).
struct FeedbackSource {
  const float* x;
  float* residual;
  CZ_QHD float value(int64_t i) const { return x[i] + residual[i]; }
  CZ_QHD void finish(int64_t i, float v, int8_t q, float scale) const {
    residual[i] = residual_value(v, q, scale);
  }
};

// The sources of block k (values [first, first + len)), built the same way by the kernels and the emulation.
template <class T, class Cvt>
struct InputBlocks {
  const T* x;
  CZ_QHD InputSource<T, Cvt> operator()(int64_t, int64_t first) const { return {x + first}; }
};
struct AddBlocks {
  const int8_t* aq;
  const float* a_scales;
  const float* b;
  float* sum;  // may be null
  CZ_QHD AddSource operator()(int64_t k, int64_t first) const {
    return {aq + first, a_scales[k], b + first, sum ? sum + first : nullptr};
  }
};
struct AddQuantizedBlocks {
  const int8_t* aq;
  const float* a_scales;
  const int8_t* bq;
  const float* b_scales;
  float* sum;  // may be null
  CZ_QHD AddQuantizedSource operator()(int64_t k, int64_t first) const {
    return {aq + first, a_scales[k], bq + first, b_scales[k], sum ? sum + first : nullptr};
  }
};
struct FeedbackBlocks {
  const float* x;
  float* residual;
  CZ_QHD FeedbackSource operator()(int64_t, int64_t first) const { return {x + first, residual + first}; }
};

// Dequantization on the GPU is one thread per element: element i's f32 value.
CZ_QHD float dequantize_element(const int8_t* q, const float* scales, int64_t block, int64_t i) {
  return dequantize_value(q[i], scales[i / block]);
}

// INT4 dequantization, one thread per element: element i of the packed codes.
CZ_QHD float dequantize_element4(const uint8_t* packed, const float* scales, int64_t block, int64_t i) {
  const uint8_t b = packed[i / 2];
  return dequantize_value(i % 2 ? high4(b) : low4(b), scales[i / block]);
}

// Phase 1 for thread `tid` of `threads`: the largest |value| bits over elements tid, tid + threads, ... <
// len.
template <class Source>
CZ_QHD uint32_t thread_amax(const Source& src, int64_t len, int tid, int threads) {
  uint32_t m = 0;
  for (int64_t i = tid; i < len; i += threads) m = max_bits(m, abs_bits(src.value(i)));
  return m;
}

// Phase 2: the same elements quantized into q with the block's scale, then the source's extra outputs.
template <class Source>
CZ_QHD void thread_quantize(const Source& src, int64_t len, float scale, int8_t* q, int tid, int threads) {
  const float inv = inverse_scale(scale);
  for (int64_t i = tid; i < len; i += threads) {
    const float v = src.value(i);
    const int8_t qi = inv > 0.f ? quantize_value(v, inv) : int8_t(0);
    q[i] = qi;
    src.finish(i, v, qi, scale);
  }
}

// INT4 phase 2: thread tid's pairs (tid, tid + threads, ... < ceil(len / 2)) quantized with the block's
// scale and packed; a block of odd length (only the last one) leaves its last high nibble 0. B is even, so
// block k's codes start at byte k B / 2.
template <class Source>
CZ_QHD void thread_quantize4(const Source& src, int64_t len, float scale, uint8_t* packed, int tid,
                             int threads) {
  const float inv = inverse_scale(scale);
  for (int64_t p = tid; 2 * p < len; p += threads) {
    const float v0 = src.value(2 * p), v1 = 2 * p + 1 < len ? src.value(2 * p + 1) : 0.f;
    packed[p] = inv > 0.f ? pack4(quantize_value(v0, inv), quantize_value(v1, inv)) : uint8_t(0);
  }
}

}  // namespace cz::dist::quant
