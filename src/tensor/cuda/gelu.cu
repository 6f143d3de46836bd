// Exact (erf) GELU, forward and backward: the ConvNeXt MLP activation (the tanh form of the cuBLASLt
// epilogues lives in elementwise_kernels.cu). One pass over memory, 16-byte vectors where alignment allows.
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

// gelu(v) = v Phi(v), Phi(v) = (1 + erf(v / sqrt 2)) / 2; gelu'(v) = Phi(v) + v phi(v).
template <class A>
__device__ __forceinline__ A gelu_erf(A v) {
  return A(0.5) * v * (A(1) + erf(v * A(0.7071067811865476)));
}
template <class A>
__device__ __forceinline__ A gelu_erf_grad(A v) {
  const A cdf = A(0.5) * (A(1) + erf(v * A(0.7071067811865476)));
  return cdf + v * A(0.3989422804014327) * exp(A(-0.5) * v * v);
}

template <int kVec, class T>
__global__ void forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using V = Vec<T, kVec>;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const V xv = reinterpret_cast<const V*>(x)[i];
    V yv;
#pragma unroll
    for (int j = 0; j < kVec; ++j) yv.v[j] = cvt<T>(gelu_erf(to_acc(xv.v[j])));
    reinterpret_cast<V*>(y)[i] = yv;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads())
    y[i] = cvt<T>(gelu_erf(to_acc(x[i])));
}

template <int kVec, class T>
__global__ void backward_kernel(const T* __restrict__ gy, const T* __restrict__ x, T* __restrict__ dx,
                                int64_t n) {
  using V = Vec<T, kVec>;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const V xv = reinterpret_cast<const V*>(x)[i];
    const V gv = reinterpret_cast<const V*>(gy)[i];
    V dv;
#pragma unroll
    for (int j = 0; j < kVec; ++j) dv.v[j] = cvt<T>(to_acc(gv.v[j]) * gelu_erf_grad(to_acc(xv.v[j])));
    reinterpret_cast<V*>(dx)[i] = dv;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads())
    dx[i] = cvt<T>(to_acc(gy[i]) * gelu_erf_grad(to_acc(x[i])));
}

}  // namespace

cudaError_t gelu_erf_forward(const Config& cfg, DType t, const void* x, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (aligned16(x) && aligned16(y))
      forward_kernel<kVec16<T>, T>
          <<<grid_for(n / kVec16<T> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(px, py, n);
    else
      forward_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(px, py, n);
    return cudaGetLastError();
  });
}

cudaError_t gelu_erf_backward(const Config& cfg, DType t, const void* gy, const void* x, void* dx,
                              int64_t n) {
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = static_cast<const T*>(gy);
    const T* px = static_cast<const T*>(x);
    T* pd = static_cast<T*>(dx);
    if (aligned16(gy) && aligned16(x) && aligned16(dx))
      backward_kernel<kVec16<T>, T>
          <<<grid_for(n / kVec16<T> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(pg, px, pd, n);
    else
      backward_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(pg, px, pd, n);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
