// Device code of the block-quantized INT8 kernels: one CUDA block per quantized block, two phases around the
// block's maximum (Note [Quantization kernels on the GPU] in quant_block.h), and a grid-stride
// dequantization. The per-thread work is quant_block.h's, which tests/dist/comm/test_quant.cpp runs on the
// CPU for every thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "dist/comm/cuda/quant_kernels.h"
#include "dist/comm/quant_block.h"

namespace cz::dist::cuda {
namespace {

namespace q8 = cz::dist::quant;

struct DeviceCvt {
  static __device__ __forceinline__ float in(float v) { return v; }
  static __device__ __forceinline__ float in(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ float in(__half v) { return __half2float(v); }
};
__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* p, float v) {
  *p = __float2half_rn(v);
}

constexpr int kMaxWarps = 4;  // q8::quant_threads is at most 128

// The CUDA block's maximum of its threads' m (every thread gets it). The __syncthreads also orders every
// thread's read of the source's scales before thread 0 writes scales[k] (in-place per-hop steps).
__device__ __forceinline__ uint32_t block_max(uint32_t m) {
  for (int offset = 16; offset > 0; offset >>= 1)
    m = q8::max_bits(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __shared__ uint32_t warp_max[kMaxWarps];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) m = q8::max_bits(m, warp_max[w]);
  return m;
}

// Block k of the launch quantizes quantized block k (blockDim.x == q8::quant_threads(block)).
template <class Blocks>
__global__ void quantize_kernel(Blocks blocks, int64_t n, int64_t block, int8_t* q, float* scales) {
  const int64_t k = blockIdx.x;
  const int64_t first = k * block;
  const int64_t len = n - first < block ? n - first : block;
  const auto src = blocks(k, first);
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const float scale = q8::block_scale(block_max(q8::thread_amax(src, len, tid, threads)));
  q8::thread_quantize(src, len, scale, q + first, tid, threads);
  if (tid == 0) scales[k] = scale;
}

// INT4 (Note [INT4 blocks]): the same, packing two codes per byte.
template <class Blocks>
__global__ void quantize4_kernel(Blocks blocks, int64_t n, int64_t block, uint8_t* packed, float* scales) {
  const int64_t k = blockIdx.x;
  const int64_t first = k * block;
  const int64_t len = n - first < block ? n - first : block;
  const auto src = blocks(k, first);
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const float scale = q8::block_scale4(block_max(q8::thread_amax(src, len, tid, threads)));
  q8::thread_quantize4(src, len, scale, packed + first / 2, tid, threads);
  if (tid == 0) scales[k] = scale;
}

template <class T>
__global__ void dequantize4_kernel(const uint8_t* packed, const float* scales, int64_t n, int64_t block,
                                   T* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, q8::dequantize_element4(packed, scales, block, i));
}

template <class T>
cudaError_t launch_quantize4(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                             cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t grid = q8::block_count(n, block);
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  quantize4_kernel<<<unsigned(grid), unsigned(q8::quant_threads(block)), 0, s>>>(
      q8::InputBlocks<T, DeviceCvt>{static_cast<const T*>(x)}, n, block, packed, scales);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_dequantize4(const uint8_t* packed, const float* scales, int64_t n, int64_t block,
                               void* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  dequantize4_kernel<T><<<unsigned(std::min<int64_t>((n + 255) / 256, 8192)), 256, 0, s>>>(
      packed, scales, n, block, static_cast<T*>(out));
  return cudaGetLastError();
}
template <class T>
__global__ void dequantize_kernel(const int8_t* q, const float* scales, int64_t n, int64_t block, T* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, q8::dequantize_element(q, scales, block, i));
}

template <class Blocks>
cudaError_t launch_quantize(Blocks blocks, int64_t n, int64_t block, int8_t* q, float* scales,
                            cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t grid = q8::block_count(n, block);
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  quantize_kernel<<<unsigned(grid), unsigned(q8::quant_threads(block)), 0, s>>>(blocks, n, block, q, scales);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_dequantize(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                              cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t grid = std::min<int64_t>((n + kThreads - 1) / kThreads, 8192);
  dequantize_kernel<T><<<unsigned(grid), kThreads, 0, s>>>(q, scales, n, block, static_cast<T*>(out));
  return cudaGetLastError();
}

// The sum-only form (q null): dequantize-add as a quantization whose codes go nowhere would still need a q
// buffer, so it runs as its own elementwise pass.
__global__ void dequantize_add_kernel(const int8_t* aq, const float* a_scales, const float* b, int64_t n,
                                      int64_t block, float* sum) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    sum[i] = q8::AddSource{aq, a_scales[i / block], b, nullptr}.value(i);
}
__global__ void dequantize_add_q_kernel(const int8_t* aq, const float* a_scales, const int8_t* bq,
                                        const float* b_scales, int64_t n, int64_t block, float* sum) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    sum[i] = q8::AddQuantizedSource{aq, a_scales[i / block], bq, b_scales[i / block], nullptr}.value(i);
}

unsigned elementwise_grid(int64_t n) {
  return unsigned(std::min<int64_t>((n + 255) / 256, 8192));
}

}  // namespace

cudaError_t quantize_f32(const void* x, int64_t n, int64_t block, int8_t* q, float* scales, cudaStream_t s) {
  return launch_quantize(q8::InputBlocks<float, DeviceCvt>{static_cast<const float*>(x)}, n, block, q, scales,
                         s);
}
cudaError_t quantize_bf16(const void* x, int64_t n, int64_t block, int8_t* q, float* scales, cudaStream_t s) {
  return launch_quantize(q8::InputBlocks<__nv_bfloat16, DeviceCvt>{static_cast<const __nv_bfloat16*>(x)}, n,
                         block, q, scales, s);
}
cudaError_t quantize_f16(const void* x, int64_t n, int64_t block, int8_t* q, float* scales, cudaStream_t s) {
  return launch_quantize(q8::InputBlocks<__half, DeviceCvt>{static_cast<const __half*>(x)}, n, block, q,
                         scales, s);
}

cudaError_t dequantize_f32(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                           cudaStream_t s) {
  return launch_dequantize<float>(q, scales, n, block, out, s);
}
cudaError_t dequantize_bf16(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                            cudaStream_t s) {
  return launch_dequantize<__nv_bfloat16>(q, scales, n, block, out, s);
}
cudaError_t dequantize_f16(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out,
                           cudaStream_t s) {
  return launch_dequantize<__half>(q, scales, n, block, out, s);
}

cudaError_t dequantize_add_quantize(const int8_t* aq, const float* a_scales, const float* b, int64_t n,
                                    int64_t block, int8_t* q, float* scales, float* sum, cudaStream_t s) {
  if (q) return launch_quantize(q8::AddBlocks{aq, a_scales, b, sum}, n, block, q, scales, s);
  if (n <= 0 || !sum) return cudaSuccess;
  dequantize_add_kernel<<<elementwise_grid(n), 256, 0, s>>>(aq, a_scales, b, n, block, sum);
  return cudaGetLastError();
}
cudaError_t dequantize_add_quantize_q(const int8_t* aq, const float* a_scales, const int8_t* bq,
                                      const float* b_scales, int64_t n, int64_t block, int8_t* q,
                                      float* scales, float* sum, cudaStream_t s) {
  if (q)
    return launch_quantize(q8::AddQuantizedBlocks{aq, a_scales, bq, b_scales, sum}, n, block, q, scales, s);
  if (n <= 0 || !sum) return cudaSuccess;
  dequantize_add_q_kernel<<<elementwise_grid(n), 256, 0, s>>>(aq, a_scales, bq, b_scales, n, block, sum);
  return cudaGetLastError();
}
cudaError_t quantize_with_feedback(const float* x, float* residual, int64_t n, int64_t block, int8_t* q,
                                   float* scales, cudaStream_t s) {
  return launch_quantize(q8::FeedbackBlocks{x, residual}, n, block, q, scales, s);
}

cudaError_t quantize4_f32(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                          cudaStream_t s) {
  return launch_quantize4<float>(x, n, block, packed, scales, s);
}
cudaError_t quantize4_bf16(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                           cudaStream_t s) {
  return launch_quantize4<__nv_bfloat16>(x, n, block, packed, scales, s);
}
cudaError_t quantize4_f16(const void* x, int64_t n, int64_t block, uint8_t* packed, float* scales,
                          cudaStream_t s) {
  return launch_quantize4<__half>(x, n, block, packed, scales, s);
}
cudaError_t dequantize4_f32(const uint8_t* packed, const float* scales, int64_t n, int64_t block, void* out,
                            cudaStream_t s) {
  return launch_dequantize4<float>(packed, scales, n, block, out, s);
}
cudaError_t dequantize4_bf16(const uint8_t* packed, const float* scales, int64_t n, int64_t block, void* out,
                             cudaStream_t s) {
  return launch_dequantize4<__nv_bfloat16>(packed, scales, n, block, out, s);
}
cudaError_t dequantize4_f16(const uint8_t* packed, const float* scales, int64_t n, int64_t block, void* out,
                            cudaStream_t s) {
  return launch_dequantize4<__half>(packed, scales, n, block, out, s);
}

}  // namespace cz::dist::cuda
