// CUDA kernels of the optimizer layer: AdamW and SGD over the pieces of a shard, the f64 sum of squares
// behind global-norm clipping, loss unscaling with the non-finite check, and the weight EMA; and the variants
// that read the step's scalars from device memory (Note [The optimizer's device scalars]). The update
// formulas use the CPU kernels' fma placement and IEEE division/sqrt, so an f32 step gives the CPU's bits.
#include "optim/cuda_launch.h"
#include "optim/device_scalars.h"
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

// The piece holding element i (pieces are sorted and disjoint; i lies in one of them).
__device__ __forceinline__ int piece_of(const OptimPieces& ps, int64_t i) {
  int lo = 0, hi = ps.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (ps.begin[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The element loops of the updates, over per-piece constants a[k], b[k] (from the kernel arguments, or made
// on the device from the device scalars): one body for both, so both give the same bits.
template <class T>
__device__ __forceinline__ void adamw_elements(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                                               T* __restrict__ v, const OptimPieces& ps, const double* a,
                                               const double* b, const AdamWConstants& c,
                                               double inv_sqrt_bc2) {
  const int64_t lo = ps.begin[0], hi = ps.end[ps.count - 1];
  const optim_scalars::AdamWElementConstants<T> ec{T(c.one_minus_beta1), T(c.beta2), T(c.one_minus_beta2),
                                                   T(inv_sqrt_bc2), T(c.eps)};
  for (int64_t i = lo + global_thread(); i < hi; i += grid_threads()) {
    const int k = piece_of(ps, i);
    if (i >= ps.end[k]) continue;  // a gap between pieces
    T pi = p[i], mi = m[i], vi = v[i];
    optim_scalars::adamw_element(pi, g[i], mi, vi, T(a[k]), T(b[k]), ec);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

template <class T>
__device__ __forceinline__ void sgd_elements(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                                             const OptimPieces& ps, const double* a, const double* b,
                                             const SgdConstants& c, bool first_step) {
  const int64_t lo = ps.begin[0], hi = ps.end[ps.count - 1];
  const T mom = T(c.momentum), omd = T(c.one_minus_dampening);
  for (int64_t i = lo + global_thread(); i < hi; i += grid_threads()) {
    const int k = piece_of(ps, i);
    if (i >= ps.end[k]) continue;
    T pi = p[i], bi = c.use_momentum ? buf[i] : T(0);
    optim_scalars::sgd_element(pi, g[i], bi, T(a[k]), T(b[k]), mom, omd, c.use_momentum, c.nesterov,
                               first_step);
    if (c.use_momentum) buf[i] = bi;
    p[i] = pi;
  }
}

template <class T>
__global__ void adamw_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                             const OptimPieces ps, const AdamWConstants c) {
  adamw_elements(p, g, m, v, ps, ps.a, ps.b, c, c.inv_sqrt_bc2);
}

template <class T>
__global__ void sgd_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                           const OptimPieces ps, const SgdConstants c) {
  sgd_elements(p, g, buf, ps, ps.a, ps.b, c, c.first_step);
}

// Device-scalar variants (Note [The optimizer's device scalars]): ps.a / ps.b hold lr_scale / weight_decay.
template <class T>
__global__ void adamw_dev_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                                 T* __restrict__ v, const OptimPieces ps, const AdamWConstants c,
                                 const double* __restrict__ scalars, const float* __restrict__ found) {
  namespace os = optim_scalars;
  if (!os::take_step(*found)) return;
  __shared__ double a[kMaxOptimPieces], b[kMaxOptimPieces];
  for (int k = int(threadIdx.x); k < ps.count; k += int(blockDim.x)) {
    const os::PieceConstants pc = os::adamw_piece(scalars[os::kLr], ps.a[k], ps.b[k], scalars[os::kBc1]);
    a[k] = pc.a;
    b[k] = pc.b;
  }
  __syncthreads();
  adamw_elements(p, g, m, v, ps, a, b, c, scalars[os::kInvSqrtBc2]);
}

template <class T>
__global__ void sgd_dev_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                               const OptimPieces ps, const SgdConstants c, const double* __restrict__ scalars,
                               const float* __restrict__ found) {
  namespace os = optim_scalars;
  if (!os::take_step(*found)) return;
  __shared__ double a[kMaxOptimPieces], b[kMaxOptimPieces];
  for (int k = int(threadIdx.x); k < ps.count; k += int(blockDim.x)) {
    const os::PieceConstants pc = os::sgd_piece(scalars[os::kLr], ps.a[k], ps.b[k]);
    a[k] = pc.a;
    b[k] = pc.b;
  }
  __syncthreads();
  sgd_elements(p, g, buf, ps, a, b, c, scalars[os::kFirstStep] != 0.0);
}

__global__ void clip_scalars_kernel(const double* __restrict__ sq, const float* __restrict__ found,
                                    double max_norm, double* __restrict__ scalars) {
  namespace os = optim_scalars;
  const bool overflow = !os::take_step(*found);
  const os::ClipResult r = os::clip_of(*sq, overflow, max_norm);
  scalars[os::kNorm] = r.norm;
  scalars[os::kFound] = overflow ? 1.0 : 0.0;
  scalars[os::kClipCoef] = r.coef;
}

template <class T>
__global__ void scale_dev_kernel(T* __restrict__ x, int64_t n, const double* __restrict__ scalars,
                                 const float* __restrict__ found) {
  const double coef = scalars[optim_scalars::kClipCoef];
  if (!optim_scalars::take_step(*found) || coef == 1.0) return;
  const T f = T(coef);  // as Tensor::mul_(coef): the factor in T, then x * f
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] = x[i] * f;
}

__device__ double block_sum(double s) {
  __shared__ double warp_sums[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();
  s = int(threadIdx.x) < int(blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  }
  return s;
}

template <class T>
__global__ void sq_norm_partial_kernel(const T* __restrict__ x, int64_t n, double* __restrict__ partial) {
  double s = 0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double v = double(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sq_norm_finish_kernel(const double* __restrict__ partial, int parts,
                                      double* __restrict__ out) {
  double s = 0;
  for (int i = int(threadIdx.x); i < parts; i += int(blockDim.x)) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

// Non-finite: the exponent field all ones.
__device__ __forceinline__ bool bad(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool bad(double v) {
  return (static_cast<unsigned long long>(__double_as_longlong(v)) & 0x7ff0000000000000ull) ==
         0x7ff0000000000000ull;
}

template <class T>
__global__ void unscale_kernel(T* __restrict__ x, int64_t n, T factor, float* __restrict__ found,
                               const double* __restrict__ device_factor) {
  if (device_factor) factor = T(*device_factor);
  bool any = false;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    T v = x[i];
    if (factor != T(1)) {
      v *= factor;
      x[i] = v;
    }
    any |= bad(v);
  }
  // Every writer stores the same 1: no atomics needed, and found is never reset here.
  if (__any_sync(0xffffffffu, any) && (threadIdx.x & 31) == 0) *found = 1.0f;
}

template <class T>
__global__ void ema_kernel(T* __restrict__ e, const T* __restrict__ p, int64_t n, T d, T one_minus_d,
                           const float* __restrict__ skip) {
  if (skip && *skip != 0.0f) return;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) e[i] = fma(d, e[i], one_minus_d * p[i]);
}

template <class F>
cudaError_t visit_f32_f64(DType t, F&& f) {
  if (t == DType::f32) return f(Tag<float>{});
  if (t == DType::f64) return f(Tag<double>{});
  return cudaErrorInvalidValue;
}

int sq_norm_blocks(int64_t n) {
  return int(std::clamp<int64_t>((n + 8191) / 8192, 1, 1024));
}

}  // namespace

cudaError_t adamw_step(const Config& cfg, DType t, void* p, const void* g, void* m, void* v,
                       const OptimPieces& pieces, const AdamWConstants& c) {
  if (pieces.count == 0) return cudaSuccess;
  const int64_t items = pieces.end[pieces.count - 1] - pieces.begin[0];
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    adamw_kernel<T><<<grid_for(items, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(m), static_cast<T*>(v), pieces, c);
    return cudaGetLastError();
  });
}

cudaError_t sgd_step(const Config& cfg, DType t, void* p, const void* g, void* buf, const OptimPieces& pieces,
                     const SgdConstants& c) {
  if (pieces.count == 0) return cudaSuccess;
  const int64_t items = pieces.end[pieces.count - 1] - pieces.begin[0];
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sgd_kernel<T><<<grid_for(items, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(buf), pieces, c);
    return cudaGetLastError();
  });
}

size_t sq_norm_workspace(int64_t n) {
  return size_t(sq_norm_blocks(n)) * sizeof(double);
}

cudaError_t sq_norm(const Config& cfg, DType t, const void* x, int64_t n, double* out, void* workspace) {
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int blocks = sq_norm_blocks(n);
    double* partial = static_cast<double*>(workspace);
    sq_norm_partial_kernel<T><<<blocks, kThreads, 0, cfg.stream>>>(static_cast<const T*>(x), n, partial);
    const cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    sq_norm_finish_kernel<<<1, kThreads, 0, cfg.stream>>>(partial, blocks, out);
    return cudaGetLastError();
  });
}

cudaError_t unscale_and_check(const Config& cfg, DType t, void* x, int64_t n, double factor, float* found,
                              const double* device_factor) {
  if (n == 0) return cudaSuccess;
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unscale_kernel<T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(x), n, T(factor), found, device_factor);
    return cudaGetLastError();
  });
}

cudaError_t ema_update(const Config& cfg, DType t, void* ema, const void* p, int64_t n, double decay,
                       const float* skip) {
  if (n == 0) return cudaSuccess;
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ema_kernel<T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(ema), static_cast<const T*>(p), n, T(decay), T(1.0 - decay), skip);
    return cudaGetLastError();
  });
}

cudaError_t adamw_step_dev(const Config& cfg, DType t, void* p, const void* g, void* m, void* v,
                           const OptimPieces& pieces, const AdamWConstants& c, const double* scalars,
                           const float* found) {
  if (pieces.count == 0) return cudaSuccess;
  const int64_t items = pieces.end[pieces.count - 1] - pieces.begin[0];
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    adamw_dev_kernel<T><<<grid_for(items, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(m), static_cast<T*>(v), pieces, c,
        scalars, found);
    return cudaGetLastError();
  });
}

cudaError_t sgd_step_dev(const Config& cfg, DType t, void* p, const void* g, void* buf,
                         const OptimPieces& pieces, const SgdConstants& c, const double* scalars,
                         const float* found) {
  if (pieces.count == 0) return cudaSuccess;
  const int64_t items = pieces.end[pieces.count - 1] - pieces.begin[0];
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sgd_dev_kernel<T><<<grid_for(items, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(buf), pieces, c, scalars, found);
    return cudaGetLastError();
  });
}

cudaError_t clip_scalars(const Config& cfg, const double* sq, const float* found, double max_norm,
                         double* scalars) {
  clip_scalars_kernel<<<1, 1, 0, cfg.stream>>>(sq, found, max_norm, scalars);
  return cudaGetLastError();
}

cudaError_t scale_dev(const Config& cfg, DType t, void* x, int64_t n, const double* scalars,
                      const float* found) {
  if (n == 0) return cudaSuccess;
  return visit_f32_f64(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_dev_kernel<T>
        <<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(static_cast<T*>(x), n, scalars, found);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
