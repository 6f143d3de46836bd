// Elementwise dst = (a + b) * scale on the GPU: one grid-stride kernel, instantiated per dtype; 16-bit types
// go through f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "dist/comm/cuda/reduce_kernels.h"

namespace cz::dist::cuda {
namespace {

template <class T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

template <class T>
__global__ void add_kernel(T* dst, const T* a, const T* b, int64_t n, typename Acc<T>::type scale,
                           bool scaled) {
  using A = typename Acc<T>::type;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    A s = A(a[i]) + A(b[i]);
    if (scaled) s *= scale;
    dst[i] = T(s);
  }
}

template <class T>
cudaError_t launch(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  add_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                                           static_cast<const T*>(b), n,
                                                           typename Acc<T>::type(scale), scale != 1.0);
  return cudaGetLastError();
}

}  // namespace

cudaError_t reduce_add_f32(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s) {
  return launch<float>(dst, a, b, n, scale, s);
}
cudaError_t reduce_add_f64(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s) {
  return launch<double>(dst, a, b, n, scale, s);
}
cudaError_t reduce_add_f16(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s) {
  return launch<__half>(dst, a, b, n, scale, s);
}
cudaError_t reduce_add_bf16(void* dst, const void* a, const void* b, int64_t n, double scale,
                            cudaStream_t s) {
  return launch<__nv_bfloat16>(dst, a, b, n, scale, s);
}

}  // namespace cz::dist::cuda
