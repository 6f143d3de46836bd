// Block-quantized INT8 buffers for communication: host kernels that quantize f32/bf16/f16 values
// into int8 with one f32 scale per block, dequantize them, and the per-hop step of a quantized reduction.
// The CUDA kernels with the same contracts are in cuda/quant_kernels.h; the arithmetic of both is
// quant_block.h.
#pragma once

#include <cstdint>

#include "dist/comm/quant_block.h"
#include "tensor/dtype.h"

namespace cz::dist {

// Note [Quantized blocks]: n values are cut into blocks of B consecutive values (the last one may be
// shorter); block k holds the values [k B, min(n, (k + 1) B)). A block travels as its values' int8 codes q (n
// bytes in all) and one f32 scale s (block_count(n, B) scales in all):
//   s = max|x| / 127 over the block (0 when max|x| < 127 FLT_MIN: the block is sent as zeros),
//   q = round_to_nearest_even(x * (1 / s)), an integer in [-127, 127] (symmetric: -128 is never used),
//   deq(q) = q * s.
// Round trip: |x - deq(q)| <= s (1/2 + 2^-15) for every element (1/2 from the rounding; the rest from
// rounding 1/s, x * (1/s) and q * s in f32), i.e. at most 1/254 of the block's largest magnitude: the error
// of a value is relative to its block's peak, not to itself, so a block mixing large and small values (a
// LayerNorm weight beside conv weights in a flat buffer) loses the small ones' relative precision. Smaller B
// follows the data more closely and costs more scale bytes: 4/B per value on top of the 1-byte code (B =
// 256: 1.6%).
//
// Scales are f32, not f16: gradients' block peaks span far more than f16's range (below 6e-5 a f16 scale is
// subnormal and loses bits, below 6e-8 it is zero; above 65504 x 127 it is Inf), and a scale rounded to fewer
// bits would no longer map the peak to exactly 127, breaking the bound above. At the B chosen the four
// bytes are 1.6% of the traffic.
//
// Non-finite input: a block holding a NaN or an Inf gets scale NaN or Inf and all-zero codes, so every
// value of that block dequantizes to NaN (0 x Inf = NaN): the receiver cannot mistake it for a finite number,
// and the step's overflow check (the loss scaler's non-finite test) trips on every rank that receives it.
// Only that block is lost; the others quantize as usual.
//
// Every function is deterministic and independent of the thread count (blocks are independent; the block
// maximum is taken on the bits of |x|, which is exact in any order), and gives the same bits as the CUDA
// kernels and the scalar definitions in tests/dist/comm/test_quant.cpp.

// Block sizes: multiples of 32 in [32, 4096]. Throws ValueError naming the size otherwise.
void check_quant_block(int64_t block);
inline int64_t quant_scale_count(int64_t n, int64_t block) {
  return quant::block_count(n, block);
}
// Bytes of n values packed as one record: the codes, padding to 4 bytes, the scales.
int64_t quant_packed_bytes(int64_t n, int64_t block);
// Where the scales of a packed record of n values start.
int64_t quant_scales_offset(int64_t n);

// x: n values of dtype f32, bf16 or f16 (host memory). q: n codes; scales: quant_scale_count(n, block) f32.
void quantize(DType dtype, const void* x, int64_t n, int64_t block, int8_t* q, float* scales);
// out: n values of dtype f32, bf16 or f16 (rounded to nearest even from the f32 q * s).
void dequantize(const int8_t* q, const float* scales, int64_t n, int64_t block, DType dtype, void* out);

// The per-hop step of a quantized reduction (Note [Quantized reduction] in docs/zero.md): v = deq(a) + b in
// f32 (one rounding: fma), then (q, scales) = Q(v). sum (may be null) receives v, for the hop that keeps the
// fp32 result; q and scales may be null when only the sum is wanted. In place is allowed: q == aq, scales ==
// a_scales, sum == b.
void dequantize_add_quantize(const int8_t* aq, const float* a_scales, const float* b, int64_t n,
                             int64_t block, int8_t* q, float* scales, float* sum = nullptr);
// v = deq(a) + deq(b) (b's product rounded, then one fma), then Q(v); the same nulls and aliasing (q may be
// aq or bq, scales a_scales or b_scales).
void dequantize_add_quantize(const int8_t* aq, const float* a_scales, const int8_t* bq, const float* b_scales,
                             int64_t n, int64_t block, int8_t* q, float* scales, float* sum = nullptr);

// Error feedback: v = x + residual; (q, scales) = Q(v); residual = v - deq(q) (0 in a non-finite block).
// Adding the residual into the next step's input makes what was sent over all steps add up to what should
// have been, minus the last residual (at most half a scale per value).
void quantize_with_feedback(const float* x, float* residual, int64_t n, int64_t block, int8_t* q,
                            float* scales);

// Note [INT4 blocks]: the same format with 4-bit codes, for the parameter all-gathers (no per-hop step, no
// error feedback: gradients lose too much at 4 bits): q in [-7, 7], s = max|x| / 7 (0 below 7 FLT_MIN), two
// codes per byte, element 2k in the low nibble of byte k and element 2k + 1 in the high one (B is even, so a
// block's codes start on a byte; an odd n leaves the last high nibble 0). Round trip:
// |x - deq(q)| <= s (1/2 + 2^-15), i.e. 1/14 of the block's peak; non-finite blocks as for INT8.
inline int64_t quant4_code_bytes(int64_t n) {
  return (n + 1) / 2;
}
// Bytes of n values packed as one INT4 record: the codes, padding to 4 bytes, the scales.
int64_t quant4_packed_bytes(int64_t n, int64_t block);
// packed: quant4_code_bytes(n) bytes; scales: quant_scale_count(n, block) f32.
void quantize_int4(DType dtype, const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales);
void dequantize_int4(const uint8_t* packed, const float* scales, int64_t n, int64_t block, DType dtype,
                     void* out);

}  // namespace cz::dist
