// Global average pooling over H and W of NHWC data, forward and backward. Forward: one thread per (image,
// channel) walking the image's pixels, so a warp reads 32 consecutive channels of a pixel (coalesced) and
// each output is summed in pixel order, deterministically.
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

template <class T>
__global__ void forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t hw, int64_t c) {
  using A = acc_t<T>;
  const A inv = A(1) / A(hw);
  for (int64_t i = global_thread(); i < n * c; i += grid_threads()) {
    const int64_t img = i / c, ch = i - img * c;
    const T* p = x + img * hw * c + ch;
    A s = 0;
    for (int64_t q = 0; q < hw; ++q) s += to_acc(p[q * c]);
    y[i] = cvt<T>(s * inv);
  }
}

template <class T>
__global__ void backward_kernel(const T* __restrict__ gy, T* __restrict__ dx, int64_t n, int64_t hw,
                                int64_t c) {
  using A = acc_t<T>;
  const A inv = A(1) / A(hw);
  const int64_t total = n * hw * c;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t ch = i % c, img = i / (hw * c);
    dx[i] = cvt<T>(to_acc(gy[img * c + ch]) * inv);
  }
}

}  // namespace

cudaError_t global_avg_pool_forward(const Config& cfg, DType t, const void* x, void* y, int64_t n, int64_t hw,
                                    int64_t c) {
  if (n * c == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<grid_for(n * c, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, hw, c);
    return cudaGetLastError();
  });
}

cudaError_t global_avg_pool_backward(const Config& cfg, DType t, const void* gy, void* dx, int64_t n,
                                     int64_t hw, int64_t c) {
  if (n * hw * c == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<T><<<grid_for(n * hw * c, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<const T*>(gy), static_cast<T*>(dx), n, hw, c);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
