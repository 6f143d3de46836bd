// Fill, strided copy with dtype conversion, axpy and scale: kernels and their raw launchers.
#include <cstring>

#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

// Fill works on raw bit patterns of the element's size: the host converted the value exactly as the CPU does.
template <int kVec, class U>
__global__ void fill_flat_kernel(U* __restrict__ dst, U v, int64_t n) {
  using V = Vec<U, kVec>;
  V pack;
#pragma unroll
  for (int j = 0; j < kVec; ++j) pack.v[j] = v;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) reinterpret_cast<V*>(dst)[i] = pack;
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) dst[i] = v;
}

template <class U>
__global__ void fill_strided_kernel(U* __restrict__ dst, U v, Geometry<1> g, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[1];
    offsets_of(g, i, off);
    dst[off[0]] = v;
  }
}

template <class U>
cudaError_t fill_as(const Config& cfg, void* dst, uint64_t bits, const Geometry<1>& g, int64_t n) {
  U v;
  std::memcpy(&v, &bits, sizeof(U));  // the low bytes on a little-endian host
  U* p = static_cast<U*>(dst);
  if (g.flat() && aligned16(dst)) {
    fill_flat_kernel<kVec16<U>, U>
        <<<grid_for(n / kVec16<U> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(p, v, n);
  } else if (g.flat()) {
    fill_flat_kernel<1, U><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(p, v, n);
  } else {
    fill_strided_kernel<U><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(p, v, g, n);
  }
  return cudaGetLastError();
}

template <class S, class D>
__global__ void copy_kernel(const S* __restrict__ src, D* __restrict__ dst, Geometry<2> g, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[2];
    offsets_of(g, i, off);
    dst[off[0]] = cvt<D>(src[off[1]]);
  }
}

template <class U>
cudaError_t copy_same(const Config& cfg, const void* src, void* dst, const Geometry<2>& g, int64_t n) {
  if (g.flat()) return cudaMemcpyAsync(dst, src, size_t(n) * sizeof(U), cudaMemcpyDeviceToDevice, cfg.stream);
  copy_kernel<U, U><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(static_cast<const U*>(src),
                                                                            static_cast<U*>(dst), g, n);
  return cudaGetLastError();
}

// No __restrict__: x may be y itself (`t.add_(t)`).
template <int kVec, class T>
__global__ void axpy_flat_kernel(const T* x, acc_t<T> a, T* y, int64_t n) {
  using V = Vec<T, kVec>;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const V xv = reinterpret_cast<const V*>(x)[i];
    V yv = reinterpret_cast<V*>(y)[i];
#pragma unroll
    for (int j = 0; j < kVec; ++j) yv.v[j] = cvt<T>(to_acc(yv.v[j]) + a * to_acc(xv.v[j]));
    reinterpret_cast<V*>(y)[i] = yv;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads())
    y[i] = cvt<T>(to_acc(y[i]) + a * to_acc(x[i]));
}

template <class T>
__global__ void axpy_strided_kernel(const T* x, acc_t<T> a, T* y, Geometry<2> g, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[2];
    offsets_of(g, i, off);
    y[off[0]] = cvt<T>(to_acc(y[off[0]]) + a * to_acc(x[off[1]]));
  }
}

template <int kVec, class T>
__global__ void scale_flat_kernel(T* __restrict__ x, acc_t<T> f, int64_t n) {
  using V = Vec<T, kVec>;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    V v = reinterpret_cast<V*>(x)[i];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v.v[j] = cvt<T>(to_acc(v.v[j]) * f);
    reinterpret_cast<V*>(x)[i] = v;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) x[i] = cvt<T>(to_acc(x[i]) * f);
}

template <class T>
__global__ void scale_strided_kernel(T* x, acc_t<T> f, Geometry<1> g, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[1];
    offsets_of(g, i, off);
    x[off[0]] = cvt<T>(to_acc(x[off[0]]) * f);
  }
}

__global__ void busy_wait_kernel(int64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (int64_t(now - start) < ns);
}

}  // namespace

cudaError_t busy_wait(const Config& cfg, int64_t nanoseconds) {
  busy_wait_kernel<<<1, 1, 0, cfg.stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t fill(const Config& cfg, DType t, void* dst, uint64_t value_bits, const Geometry<1>& g,
                 int64_t n) {
  if (n == 0) return cudaSuccess;
  switch (dtype_size(t)) {
    case 1:
      return fill_as<uint8_t>(cfg, dst, value_bits, g, n);
    case 2:
      return fill_as<uint16_t>(cfg, dst, value_bits, g, n);
    case 4:
      return fill_as<uint32_t>(cfg, dst, value_bits, g, n);
    case 8:
      return fill_as<uint64_t>(cfg, dst, value_bits, g, n);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t copy(const Config& cfg, DType src_t, const void* src, DType dst_t, void* dst,
                 const Geometry<2>& g, int64_t n) {
  if (n == 0) return cudaSuccess;
  if (src_t == dst_t) {
    switch (dtype_size(src_t)) {
      case 1:
        return copy_same<uint8_t>(cfg, src, dst, g, n);
      case 2:
        return copy_same<uint16_t>(cfg, src, dst, g, n);
      case 4:
        return copy_same<uint32_t>(cfg, src, dst, g, n);
      case 8:
        return copy_same<uint64_t>(cfg, src, dst, g, n);
      default:
        return cudaErrorInvalidValue;
    }
  }
  return visit_any(src_t, [&](auto stag) {
    return visit_any(dst_t, [&](auto dtag) {
      using S = typename decltype(stag)::type;
      using D = typename decltype(dtag)::type;
      if constexpr (std::is_same_v<S, D>) {
        return cudaErrorInvalidValue;  // handled above
      } else {
        copy_kernel<S, D><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(static_cast<const S*>(src),
                                                                                  static_cast<D*>(dst), g, n);
        return cudaGetLastError();
      }
    });
  });
}

cudaError_t axpy(const Config& cfg, DType t, const void* x, double alpha, void* y, const Geometry<2>& g,
                 int64_t n) {
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto a = acc_t<T>(alpha);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    if (g.flat() && aligned16(x) && aligned16(y))
      axpy_flat_kernel<kVec16<T>, T>
          <<<grid_for(n / kVec16<T> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(xp, a, yp, n);
    else if (g.flat())
      axpy_flat_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(xp, a, yp, n);
    else
      axpy_strided_kernel<T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(xp, a, yp, g, n);
    return cudaGetLastError();
  });
}

cudaError_t scale(const Config& cfg, DType t, void* x, double factor, const Geometry<1>& g, int64_t n) {
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto f = acc_t<T>(factor);
    T* p = static_cast<T*>(x);
    if (g.flat() && aligned16(x))
      scale_flat_kernel<kVec16<T>, T>
          <<<grid_for(n / kVec16<T> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(p, f, n);
    else if (g.flat())
      scale_flat_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(p, f, n);
    else
      scale_strided_kernel<T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(p, f, g, n);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
