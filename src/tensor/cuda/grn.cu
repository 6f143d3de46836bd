// Global Response Normalization of NHWC images, forward and backward (Note [GRN kernels] in grn_threads.h,
// whose per-thread functions these kernels call).
#include "tensor/cuda/device_utils.cuh"
#include "tensor/cuda/grn_threads.h"

namespace cz::cuda::launch {
namespace {
using namespace detail;
using grn::kCols;
using grn::kLanes;
using grn::kWarp;

constexpr int kImagesPerBlock = 4;  // warps per block in step 2, one image each

struct DeviceCvt {
  template <class A, class S>
  __device__ __forceinline__ static A to(S s) {
    return cvt<A>(s);
  }
};

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Step 1. Block (kCols, kLanes) per (image, channel tile). Forward (g null): out = gx. Backward: out = s,
// out_g = sg.
template <class T>
__global__ void image_sums_kernel(const T* __restrict__ x, const T* __restrict__ g, int64_t hw, int64_t c,
                                  int64_t col_tiles, acc_t<T>* __restrict__ out,
                                  acc_t<T>* __restrict__ out_g) {
  using A = acc_t<T>;
  __shared__ A ps[kLanes][kCols + 1], pg[kLanes][kCols + 1];
  const int64_t img = int64_t(blockIdx.x) / col_tiles;
  const int64_t col = (int64_t(blockIdx.x) - img * col_tiles) * kCols + threadIdx.x;
  A s = 0, sg = 0;
  if (col < c)
    grn::lane_sums<A, T, DeviceCvt>(x + img * hw * c, g ? g + img * hw * c : nullptr, hw, c, col,
                                    int(threadIdx.y), s, sg);
  ps[threadIdx.y][threadIdx.x] = s;
  pg[threadIdx.y][threadIdx.x] = sg;
  __syncthreads();
  if (threadIdx.y != 0 || col >= c) return;
  const A total = grn::add_lanes(&ps[0][threadIdx.x], kCols + 1);
  if (g) {
    out[img * c + col] = total;
    out_g[img * c + col] = grn::add_lanes(&pg[0][threadIdx.x], kCols + 1);
  } else {
    out[img * c + col] = grn::sqrt_of(total);
  }
}

// Step 2 of forward: d per image, one warp each.
template <class A>
__global__ void divisor_kernel(const A* __restrict__ gx, A eps, int64_t n, int64_t c, A* __restrict__ d) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t img = int64_t(blockIdx.x) * kImagesPerBlock + (threadIdx.x >> 5);
  if (img >= n) return;
  const A* g = gx + img * c;
  const A s = warp_sum(grn::lane_channel_sum<A>(c, lane, [&](int64_t i) { return g[i]; }));
  if (lane == 0) d[img] = grn::divisor_of(s, c, eps);
}

// Step 2 of backward: k per (image, channel), over s in place.
template <class T>
__global__ void factor_kernel(const T* __restrict__ gamma, const acc_t<T>* __restrict__ gx,
                              const acc_t<T>* __restrict__ d, int64_t n, int64_t c,
                              acc_t<T>* __restrict__ s) {
  using A = acc_t<T>;
  const int lane = int(threadIdx.x) & 31;
  const int64_t img = int64_t(blockIdx.x) * kImagesPerBlock + (threadIdx.x >> 5);
  if (img >= n) return;
  const A* g = gx + img * c;
  A* si = s + img * c;
  const A dn = d[img];
  const A m = warp_sum(grn::lane_channel_sum<A>(
                  c, lane, [&](int64_t i) { return to_acc(gamma[i]) * si[i] * grn::nx_of(g[i], dn); })) /
              A(c);
  for (int64_t i = lane; i < c; i += kWarp) si[i] = grn::k_of(to_acc(gamma[i]) * si[i], m, dn, g[i]);
}

// Step 3: the parameter gradients, one thread per channel.
template <class T>
__global__ void param_kernel(const acc_t<T>* __restrict__ gx, const acc_t<T>* __restrict__ d,
                             const acc_t<T>* __restrict__ s, const acc_t<T>* __restrict__ sg, int64_t n,
                             int64_t c, T* __restrict__ dgamma, T* __restrict__ dbeta) {
  using A = acc_t<T>;
  for (int64_t col = global_thread(); col < c; col += grid_threads()) {
    A tg = 0, tb = 0;
    for (int64_t img = 0; img < n; ++img) {
      tg += grn::nx_of(gx[img * c + col], d[img]) * s[img * c + col];
      tb += sg[img * c + col];
    }
    if (dgamma) dgamma[col] = cvt<T>(tg);
    if (dbeta) dbeta[col] = cvt<T>(tb);
  }
}

// Step 4. Forward (g null): y = out. Backward: dx = out, with k.
template <class T>
__global__ void elementwise_kernel(const T* __restrict__ x, const T* __restrict__ g,
                                   const T* __restrict__ gamma, const T* __restrict__ beta,
                                   const acc_t<T>* __restrict__ gx, const acc_t<T>* __restrict__ d,
                                   const acc_t<T>* __restrict__ k, int64_t hw, int64_t c, int64_t total,
                                   T* __restrict__ out) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t img = i / (hw * c), ch = i % c, nc = img * c + ch;
    const A xv = to_acc(x[i]), gam = to_acc(gamma[ch]), nx = grn::nx_of(gx[nc], d[img]);
    out[i] =
        cvt<T>(g ? grn::dx_of(to_acc(g[i]), xv, gam, nx, k[nc]) : grn::out_of(xv, gam, to_acc(beta[ch]), nx));
  }
}

size_t acc_size(DType t) {
  return t == DType::f64 ? sizeof(double) : sizeof(float);
}

// Step 1's grid: one block per (image, channel tile); false past gridDim.x's limit.
bool sums_grid(int64_t n, int64_t c, int64_t& col_tiles, int64_t& blocks) {
  col_tiles = (c + kCols - 1) / kCols;
  blocks = n * col_tiles;
  return blocks <= 0x7fffffff;
}

}  // namespace

cudaError_t grn_forward(const Config& cfg, DType t, const void* x, const void* gamma, const void* beta,
                        double eps, void* y, void* gx, void* d, int64_t n, int64_t hw, int64_t c) {
  if (n * c == 0) return cudaSuccess;
  int64_t col_tiles, blocks;
  if (!sums_grid(n, c, col_tiles, blocks)) return cudaErrorInvalidValue;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x);
    A* pgx = static_cast<A*>(gx);
    A* pd = static_cast<A*>(d);
    image_sums_kernel<T><<<unsigned(blocks), dim3(kCols, kLanes), 0, cfg.stream>>>(px, nullptr, hw, c,
                                                                                   col_tiles, pgx, nullptr);
    cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    const int64_t warps_blocks = (n + kImagesPerBlock - 1) / kImagesPerBlock;
    divisor_kernel<A>
        <<<unsigned(warps_blocks), kWarp * kImagesPerBlock, 0, cfg.stream>>>(pgx, A(eps), n, c, pd);
    st = cudaGetLastError();
    if (st != cudaSuccess || hw == 0) return st;
    const int64_t total = n * hw * c;
    elementwise_kernel<T><<<grid_for(total, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        px, nullptr, static_cast<const T*>(gamma), static_cast<const T*>(beta), pgx, pd, nullptr, hw, c,
        total, static_cast<T*>(y));
    return cudaGetLastError();
  });
}

size_t grn_backward_workspace(DType t, int64_t n, int64_t c) {
  return size_t(2 * n * c) * acc_size(t);
}

cudaError_t grn_backward(const Config& cfg, DType t, const void* gy, const void* x, const void* gamma,
                         const void* gx, const void* d, void* dx, void* dgamma, void* dbeta, int64_t n,
                         int64_t hw, int64_t c, void* workspace) {
  // An empty batch still writes dgamma and dbeta (zeros).
  if (c == 0 || (!dx && !dgamma && !dbeta)) return cudaSuccess;
  int64_t col_tiles, blocks;
  if (!sums_grid(n, c, col_tiles, blocks)) return cudaErrorInvalidValue;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(gy);
    const T* px = static_cast<const T*>(x);
    const T* pgam = static_cast<const T*>(gamma);
    const A* pgx = static_cast<const A*>(gx);
    const A* pd = static_cast<const A*>(d);
    A* s = static_cast<A*>(workspace);
    A* sg = s + n * c;
    cudaError_t st = cudaSuccess;
    if (n > 0) {
      image_sums_kernel<T>
          <<<unsigned(blocks), dim3(kCols, kLanes), 0, cfg.stream>>>(px, pg, hw, c, col_tiles, s, sg);
      st = cudaGetLastError();
      if (st != cudaSuccess) return st;
    }
    if (dgamma || dbeta) {
      param_kernel<T><<<grid_for(c, cfg.sm_count), kThreads, 0, cfg.stream>>>(
          pgx, pd, s, sg, n, c, static_cast<T*>(dgamma), static_cast<T*>(dbeta));
      st = cudaGetLastError();
      if (st != cudaSuccess || !dx) return st;
    }
    if (n == 0) return st;
    const int64_t warps_blocks = (n + kImagesPerBlock - 1) / kImagesPerBlock;
    factor_kernel<T>
        <<<unsigned(warps_blocks), kWarp * kImagesPerBlock, 0, cfg.stream>>>(pgam, pgx, pd, n, c, s);
    st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    const int64_t total = n * hw * c;
    elementwise_kernel<T><<<grid_for(total, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        px, pg, pgam, nullptr, pgx, pd, s, hw, c, total, static_cast<T*>(dx));
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
