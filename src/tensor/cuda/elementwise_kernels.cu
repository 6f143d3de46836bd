// Elementwise kernels on contiguous buffers: binary ops, per-channel scale (+ residual), and the bias add of
// the unfused GEMM and convolution paths. 16-byte vector loads where alignment allows.
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

template <int kVec, class T>
__global__ void binary_kernel(BinaryOp op, const T* __restrict__ a, const T* __restrict__ b, acc_t<T> alpha,
                              T* __restrict__ out, int64_t n) {
  using V = Vec<T, kVec>;
  const bool add = op == BinaryOp::add;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const V av = reinterpret_cast<const V*>(a)[i];
    const V bv = reinterpret_cast<const V*>(b)[i];
    V ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const auto x = to_acc(av.v[j]), y = to_acc(bv.v[j]);
      ov.v[j] = cvt<T>(add ? x + alpha * y : x * y);
    }
    reinterpret_cast<V*>(out)[i] = ov;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    const auto x = to_acc(a[i]), y = to_acc(b[i]);
    out[i] = cvt<T>(add ? x + alpha * y : x * y);
  }
}

// kVec > 1 only when c % kVec == 0, so one vector never straddles two rows and its gamma slice is contiguous
// and aligned.
template <int kVec, class T>
__global__ void residual_scale_add_kernel(const T* __restrict__ residual, const T* __restrict__ x,
                                          const T* __restrict__ gamma, T* __restrict__ out, int64_t n,
                                          int64_t c) {
  using V = Vec<T, kVec>;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const int64_t c0 = (i * kVec) % c;
    const V xv = reinterpret_cast<const V*>(x)[i];
    const V gv = *reinterpret_cast<const V*>(gamma + c0);
    V rv;
    if (residual) rv = reinterpret_cast<const V*>(residual)[i];
    V ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const auto v = to_acc(xv.v[j]) * to_acc(gv.v[j]);
      ov.v[j] = cvt<T>(residual ? to_acc(rv.v[j]) + v : v);
    }
    reinterpret_cast<V*>(out)[i] = ov;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    const auto v = to_acc(x[i]) * to_acc(gamma[i % c]);
    out[i] = cvt<T>(residual ? to_acc(residual[i]) + v : v);
  }
}

template <class T>
__global__ void add_bias_kernel(T* y, const T* __restrict__ bias, int64_t n, int64_t cols) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    y[i] = cvt<T>(to_acc(y[i]) + to_acc(bias[i % cols]));
}

}  // namespace

cudaError_t binary(const Config& cfg, DType t, BinaryOp op, const void* a, const void* b, double alpha,
                   void* out, int64_t n) {
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    const auto al = acc_t<T>(alpha);
    if (aligned16(a) && aligned16(b) && aligned16(out))
      binary_kernel<kVec16<T>, T>
          <<<grid_for(n / kVec16<T> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(op, pa, pb, al, po, n);
    else
      binary_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(op, pa, pb, al, po, n);
    return cudaGetLastError();
  });
}

cudaError_t residual_scale_add(const Config& cfg, DType t, const void* residual, const void* x,
                               const void* gamma, void* out, int64_t n, int64_t c) {
  if (n == 0) return cudaSuccess;
  if (c <= 0) return cudaErrorInvalidValue;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pr = static_cast<const T*>(residual);
    const T* px = static_cast<const T*>(x);
    const T* pg = static_cast<const T*>(gamma);
    T* po = static_cast<T*>(out);
    constexpr int kV = kVec16<T>;
    const bool vec = c % kV == 0 && (!residual || aligned16(residual)) && aligned16(x) && aligned16(gamma) &&
                     aligned16(out);
    if (vec)
      residual_scale_add_kernel<kV, T>
          <<<grid_for(n / kV + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(pr, px, pg, po, n, c);
    else
      residual_scale_add_kernel<1, T>
          <<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(pr, px, pg, po, n, c);
    return cudaGetLastError();
  });
}

cudaError_t add_bias(const Config& cfg, DType t, void* y, const void* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_bias_kernel<T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), n, cols);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
