// Per-sample scaling: drop path's mask applied in forward and backward (the mask itself is drawn on the
// host, see ops/drop_path.cpp). 16-byte vectors when the sample size and pointers allow.
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

// kVec > 1 only when inner % kVec == 0, so a vector never straddles two samples.
template <int kVec, class T>
__global__ void sample_scale_kernel(const T* __restrict__ x, const T* __restrict__ scale, T* __restrict__ y,
                                    int64_t n, int64_t inner) {
  using V = Vec<T, kVec>;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const auto s = to_acc(scale[(i * kVec) / inner]);
    const V xv = reinterpret_cast<const V*>(x)[i];
    V yv;
#pragma unroll
    for (int j = 0; j < kVec; ++j) yv.v[j] = cvt<T>(to_acc(xv.v[j]) * s);
    reinterpret_cast<V*>(y)[i] = yv;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads())
    y[i] = cvt<T>(to_acc(x[i]) * to_acc(scale[i / inner]));
}

}  // namespace

cudaError_t sample_scale(const Config& cfg, DType t, const void* x, const void* scale, void* y, int64_t n,
                         int64_t inner) {
  if (n == 0 || inner == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = kVec16<T>;
    const T* px = static_cast<const T*>(x);
    const T* ps = static_cast<const T*>(scale);
    T* py = static_cast<T*>(y);
    if (inner % kV == 0 && aligned16(x) && aligned16(y))
      sample_scale_kernel<kV, T>
          <<<grid_for(n / kV + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(px, ps, py, n, inner);
    else
      sample_scale_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(px, ps, py, n, inner);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
