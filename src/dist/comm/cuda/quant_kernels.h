// Block-quantized INT8 kernels on a CUDA stream (Note [Quantized blocks] in quant.h; the arithmetic is
// quant_block.h's, so the bits equal the host kernels'): raw launchers over device pointers returning the
// launch status. Same contracts, nulls and aliasing as the host functions of quant.h; `block` must already be
// checked (check_quant_block). x, out: f32, bf16 or f16 as the name says. The .cu side includes no project
// header but quant_block.h (nvcc compiles it as C++17, and fmt does not compile under nvcc). Written and
// compiled without a GPU, never run (docs/cuda.md, "The block-quantized INT8 kernels (issue 22)").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cz::dist::cuda {

cudaError_t quantize_f32(const void* x, int64_t n, int64_t block, int8_t* q, float* scales, cudaStream_t s);
cudaError_t quantize_bf16(const void* x, int64_t n, int64_t block, int8_t* q, float* scales, cudaStream_t s);
cudaError_t quantize_f16(const void* x, int64_t n, int64_t block, int8_t* q, float* scales, cudaStream_t s);

cudaError_t dequantize_f32(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                           cudaStream_t s);
cudaError_t dequantize_bf16(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                            cudaStream_t s);
cudaError_t dequantize_f16(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                           cudaStream_t s);

// Q(deq(a) + b); sum may be null; q and scales may be null together (then only the sum is written).
cudaError_t dequantize_add_quantize(const int8_t* aq, const float* a_scales, const float* b, int64_t n,
                                    int64_t block, int8_t* q, float* scales, float* sum, cudaStream_t s);
// Q(deq(a) + deq(b)).
cudaError_t dequantize_add_quantize_q(const int8_t* aq, const float* a_scales, const int8_t* bq,
                                      const float* b_scales, int64_t n, int64_t block, int8_t* q,
                                      float* scales, float* sum, cudaStream_t s);
// Error feedback: Q(x + residual), residual = x + residual - deq.
cudaError_t quantize_with_feedback(const float* x, float* residual, int64_t n, int64_t block, int8_t* q,
                                   float* scales, cudaStream_t s);

// INT4 (Note [INT4 blocks] in quant.h): packed holds quant4_code_bytes(n) bytes.
cudaError_t quantize4_f32(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                          cudaStream_t s);
cudaError_t quantize4_bf16(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                           cudaStream_t s);
cudaError_t quantize4_f16(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                          cudaStream_t s);
cudaError_t dequantize4_f32(const uint8_t* packed, const float* scales, int64_t n, int64_t block, void* out,
                            cudaStream_t s);
cudaError_t dequantize4_bf16(const uint8_t* packed, const float* scales, int64_t n, int64_t block, void* out,
                             cudaStream_t s);
cudaError_t dequantize4_f16(const uint8_t* packed, const float* scales, int64_t n, int64_t block, void* out,
                            cudaStream_t s);

}  // namespace cz::dist::cuda
