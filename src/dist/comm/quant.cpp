// Host kernels of the block-quantized INT8 format (Note [Quantized blocks]): OpenMP over blocks, and per
// block short loops the compiler vectorizes (checked with -fopt-info-vec: the maximum, the code and the
// dequantize loops use 64-byte vectors with AVX-512); 16-bit values are widened and narrowed by
// tensor/cpu/simd.h. Every value goes through the functions of quant_block.h, so the bits equal the CUDA
// kernels' and the scalar definitions'.
#include "dist/comm/quant.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "tensor/check.h"
#include "tensor/cpu/simd.h"
#include "tensor/parallel.h"

// GCC 12 reports a Scratch block read back over the length just written to it as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace cz::dist {
namespace {

using quant::abs_bits;
using quant::max_bits;

// The largest |v| (as bits) of v[0, len).
uint32_t amax_bits(const float* v, int64_t len) {
  uint32_t m = 0;
  for (int64_t i = 0; i < len; ++i) m = max_bits(m, abs_bits(v[i]));
  return m;
}

// Quantizes v[0, len) into q; returns the block's scale.
float quantize_block(const float* v, int64_t len, int8_t* q) {
  const float scale = quant::block_scale(amax_bits(v, len));
  const float inv = quant::inverse_scale(scale);
  if (inv > 0.f) {
    for (int64_t i = 0; i < len; ++i) q[i] = quant::quantize_value(v[i], inv);
  } else {
    std::memset(q, 0, size_t(len));
  }
  return scale;
}

// INT4: quantizes v[0, len) into (len + 1) / 2 packed bytes; returns the block's scale.
float quantize_block4(const float* v, int64_t len, uint8_t* packed) {
  const float scale = quant::block_scale4(amax_bits(v, len));
  const float inv = quant::inverse_scale(scale);
  if (!(inv > 0.f)) {
    std::memset(packed, 0, size_t(quant4_code_bytes(len)));
    return scale;
  }
  const int64_t pairs = len / 2;
  for (int64_t p = 0; p < pairs; ++p)
    packed[p] = quant::pack4(quant::quantize_value(v[2 * p], inv), quant::quantize_value(v[2 * p + 1], inv));
  if (len % 2) packed[pairs] = quant::pack4(quant::quantize_value(v[len - 1], inv), 0);
  return scale;
}

using cpu::simd::narrow_16bit;
using cpu::simd::widen_16bit;

bool is_quant_input(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// Runs f(k, first, len) for every block k: OpenMP over blocks when there is enough work.
template <class F>
void for_blocks(int64_t n, int64_t block, F&& f) {
  const int64_t blocks = quant::block_count(n, block);
#pragma omp parallel for schedule(static) if (n >= kParallelGrain && blocks > 1)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t first = k * block;
    f(k, first, std::min(block, n - first));
  }
}

// A block's values, f32, on the stack (B <= 4096: 16 KiB).
struct alignas(64) Scratch {
  float v[quant::kMaxBlock];
};

void check_args(const char* what, int64_t n, int64_t block) {
  CZ_CHECK(n >= 0, "{}: n must be >= 0, got {}", what, n);
  check_quant_block(block);
}

// The dequantize_add_quantize()s: block k's sums source_of(k, first).value(i), kept in `sum` when given, and
// quantized into q and scales when given.
template <class SourceOf>
void add_blocks(int64_t n, int64_t block, int8_t* q, float* scales, float* sum, SourceOf&& source_of) {
  check_args("dequantize_add_quantize", n, block);
  CZ_CHECK((q == nullptr) == (scales == nullptr),
           "dequantize_add_quantize: q and scales are both given or both null");
  for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
    Scratch s;
    float* v = sum ? sum + first : s.v;
    const auto src = source_of(k, first);
    for (int64_t i = 0; i < len; ++i) v[i] = src.value(i);
    if (q) scales[k] = quantize_block(v, len, q + first);
  });
}

}  // namespace

void check_quant_block(int64_t block) {
  CZ_CHECK(block >= quant::kMinBlock && block <= quant::kMaxBlock && block % 32 == 0,
           "quantized blocks: the block size must be a multiple of 32 in [{}, {}], got {}", quant::kMinBlock,
           quant::kMaxBlock, block);
}

int64_t quant_scales_offset(int64_t n) {
  return (n + 3) / 4 * 4;
}
int64_t quant_packed_bytes(int64_t n, int64_t block) {
  return quant_scales_offset(n) + 4 * quant_scale_count(n, block);
}

void quantize(DType dtype, const void* x, int64_t n, int64_t block, int8_t* q, float* scales) {
  check_args("quantize", n, block);
  CZ_CHECK_DTYPE(is_quant_input(dtype), "quantize: takes f32, bf16 or f16 values, not {}", dtype_name(dtype));
  if (dtype == DType::f32) {
    const auto* xf = static_cast<const float*>(x);
    for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
      scales[k] = quantize_block(xf + first, len, q + first);
    });
    return;
  }
  const auto* xh = static_cast<const uint16_t*>(x);
  const bool bf16 = dtype == DType::bf16;
  for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
    Scratch s;
    widen_16bit(bf16, xh + first, len, s.v);
    scales[k] = quantize_block(s.v, len, q + first);
  });
}

int64_t quant4_packed_bytes(int64_t n, int64_t block) {
  return quant_scales_offset(quant4_code_bytes(n)) + 4 * quant_scale_count(n, block);
}

void quantize_int4(DType dtype, const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales) {
  check_args("quantize_int4", n, block);
  CZ_CHECK_DTYPE(is_quant_input(dtype), "quantize_int4: takes f32, bf16 or f16 values, not {}",
                 dtype_name(dtype));
  for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
    Scratch s;
    const float* v = s.v;
    if (dtype == DType::f32)
      v = static_cast<const float*>(x) + first;
    else
      widen_16bit(dtype == DType::bf16, static_cast<const uint16_t*>(x) + first, len, s.v);
    scales[k] = quantize_block4(v, len, packed + first / 2);
  });
}

void dequantize_int4(const uint8_t* packed, const float* scales, int64_t n, int64_t block, DType dtype,
                     void* out) {
  check_args("dequantize_int4", n, block);
  CZ_CHECK_DTYPE(is_quant_input(dtype), "dequantize_int4: writes f32, bf16 or f16 values, not {}",
                 dtype_name(dtype));
  for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
    const float scale = scales[k];
    const uint8_t* pb = packed + first / 2;
    Scratch s;
    float* v = dtype == DType::f32 ? static_cast<float*>(out) + first : s.v;
    const int64_t pairs = len / 2;
    for (int64_t p = 0; p < pairs; ++p) {
      v[2 * p] = quant::dequantize_value(quant::low4(pb[p]), scale);
      v[2 * p + 1] = quant::dequantize_value(quant::high4(pb[p]), scale);
    }
    if (len % 2) v[len - 1] = quant::dequantize_value(quant::low4(pb[pairs]), scale);
    if (dtype != DType::f32)
      narrow_16bit(dtype == DType::bf16, s.v, len, static_cast<uint16_t*>(out) + first);
  });
}

void dequantize(const int8_t* q, const float* scales, int64_t n, int64_t block, DType dtype, void* out) {
  check_args("dequantize", n, block);
  CZ_CHECK_DTYPE(is_quant_input(dtype), "dequantize: writes f32, bf16 or f16 values, not {}",
                 dtype_name(dtype));
  for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
    const float scale = scales[k];
    const int8_t* qb = q + first;
    if (dtype == DType::f32) {
      float* o = static_cast<float*>(out) + first;
      for (int64_t i = 0; i < len; ++i) o[i] = quant::dequantize_value(qb[i], scale);
      return;
    }
    Scratch s;
    for (int64_t i = 0; i < len; ++i) s.v[i] = quant::dequantize_value(qb[i], scale);
    narrow_16bit(dtype == DType::bf16, s.v, len, static_cast<uint16_t*>(out) + first);
  });
}

void dequantize_add_quantize(const int8_t* aq, const float* a_scales, const float* b, int64_t n,
                             int64_t block, int8_t* q, float* scales, float* sum) {
  add_blocks(n, block, q, scales, sum, [&](int64_t k, int64_t first) {
    return quant::AddSource{aq + first, a_scales[k], b + first, nullptr};
  });
}

void dequantize_add_quantize(const int8_t* aq, const float* a_scales, const int8_t* bq, const float* b_scales,
                             int64_t n, int64_t block, int8_t* q, float* scales, float* sum) {
  add_blocks(n, block, q, scales, sum, [&](int64_t k, int64_t first) {
    return quant::AddQuantizedSource{aq + first, a_scales[k], bq + first, b_scales[k], nullptr};
  });
}

void quantize_with_feedback(const float* x, float* residual, int64_t n, int64_t block, int8_t* q,
                            float* scales) {
  check_args("quantize_with_feedback", n, block);
  for_blocks(n, block, [&](int64_t k, int64_t first, int64_t len) {
    Scratch s;
    const float* xb = x + first;
    float* r = residual + first;
    for (int64_t i = 0; i < len; ++i) s.v[i] = xb[i] + r[i];
    int8_t* qb = q + first;
    const float scale = quantize_block(s.v, len, qb);
    scales[k] = scale;
    for (int64_t i = 0; i < len; ++i) r[i] = quant::residual_value(s.v[i], qb[i], scale);
  });
}

}  // namespace cz::dist
