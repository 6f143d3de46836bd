// Depthwise k x k convolution on NHWC data with the (k, k, C) weight, stride 1, padding k/2.
// - The tiled 7x7 kernels (Note [Tiled depthwise kernels] in depthwise_tiles.h): forward, backward-data, and
//   one backward pass giving dx, dw and db, then a pass adding the per-tile weight-gradient partials in a
//   fixed order. ConvNeXt's path by default.
// - The direct kernels, any k: one thread per output element along C, so a warp reads 32 consecutive
//   channels of a pixel; the filter gradient summed in fixed chunks (lanes in lane order within a chunk),
//   then in chunk order. The path for other kernel sizes where cuDNN has no algorithm, and the simple
//   reference the tests compare the others with (DepthwiseAlgo::direct).
// Both are deterministic: no floating-point atomics, every sum in an order fixed by the problem's sizes.
#include "tensor/cuda/depthwise_tiles.h"
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

// y[n, h, w, c] = bias[c] + sum_{i, j} x[n, h + i - p, w + j - p, c] wt[i, j, c].
template <class T>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                               T* __restrict__ y, int64_t n, int64_t hh, int64_t ww, int64_t c, int k) {
  using A = acc_t<T>;
  const int p = k / 2;
  const int64_t total = n * hh * ww * c;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t ch = idx % c, pix = idx / c, w = pix % ww, h = (pix / ww) % hh, img = pix / (ww * hh);
    A acc = bias ? to_acc(bias[ch]) : A(0);
    for (int i = 0; i < k; ++i) {
      const int64_t hin = h + i - p;
      if (hin < 0 || hin >= hh) continue;
      const T* xr = x + ((img * hh + hin) * ww) * c + ch;
      for (int j = 0; j < k; ++j) {
        const int64_t win = w + j - p;
        if (win >= 0 && win < ww) acc += to_acc(xr[win * c]) * to_acc(wt[(i * k + j) * c + ch]);
      }
    }
    y[idx] = cvt<T>(acc);
  }
}

// dx[n, h, w, c] = sum_{i, j} gy[n, h - i + p, w - j + p, c] wt[i, j, c].
template <class T>
__global__ void backward_data_kernel(const T* __restrict__ gy, const T* __restrict__ wt, T* __restrict__ dx,
                                     int64_t n, int64_t hh, int64_t ww, int64_t c, int k) {
  using A = acc_t<T>;
  const int p = k / 2;
  const int64_t total = n * hh * ww * c;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t ch = idx % c, pix = idx / c, w = pix % ww, h = (pix / ww) % hh, img = pix / (ww * hh);
    A acc = 0;
    for (int i = 0; i < k; ++i) {
      const int64_t ho = h - i + p;
      if (ho < 0 || ho >= hh) continue;
      const T* gr = gy + ((img * hh + ho) * ww) * c + ch;
      for (int j = 0; j < k; ++j) {
        const int64_t wo = w - j + p;
        if (wo >= 0 && wo < ww) acc += to_acc(gr[wo * c]) * to_acc(wt[(i * k + j) * c + ch]);
      }
    }
    dx[idx] = cvt<T>(acc);
  }
}

// Filter gradient: blocks of 32 channels x 8 lanes; lane `ly` of chunk `b` sums the output rows (n, h) of its
// chunk with stride 8 into K*K accumulators, the block then adds its 8 lanes in lane order (through shared
// memory, 8 taps at a time) and writes partial[b][tap][c]: one partial per chunk, not per lane, so the
// finishing pass reads 8x less.
constexpr int kColTile = 32, kLanes = 8;
constexpr size_t kFilterWorkspaceCap = size_t(32) << 20;

struct FilterPlan {
  int64_t col_tiles, chunks, rows_per_chunk;
};

FilterPlan filter_plan(int64_t rows, int64_t c, int k, size_t acc_bytes, int sm_count) {
  FilterPlan f;
  f.col_tiles = (c + kColTile - 1) / kColTile;
  const size_t per_chunk = size_t(k * k) * size_t(c) * acc_bytes;
  const int64_t cap = std::max<int64_t>(int64_t(kFilterWorkspaceCap / std::max<size_t>(per_chunk, 1)), 1);
  const int64_t want = (int64_t(std::max(sm_count, 1)) * 4 + f.col_tiles - 1) / f.col_tiles;
  // gridDim.y holds the chunks: at most 65535.
  f.chunks = std::clamp<int64_t>(want, 1, std::min<int64_t>({cap, std::max<int64_t>(rows, 1), 65535}));
  f.rows_per_chunk = std::max<int64_t>((rows + f.chunks - 1) / f.chunks, 1);
  f.chunks = std::max<int64_t>((rows + f.rows_per_chunk - 1) / f.rows_per_chunk, 1);
  return f;
}

template <int K, class T>
__global__ void filter_partial_kernel(const T* __restrict__ gy, const T* __restrict__ x, int64_t n,
                                      int64_t hh, int64_t ww, int64_t c, int64_t rows_per_chunk,
                                      acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  constexpr int p = K / 2;
  const int64_t ch = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t rows = n * hh;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A acc[K * K];
#pragma unroll
  for (int t = 0; t < K * K; ++t) acc[t] = 0;
  if (ch < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kLanes) {
      const int64_t img = r / hh, h = r - img * hh;
      for (int64_t w = 0; w < ww; ++w) {
        const A g = to_acc(gy[(r * ww + w) * c + ch]);
#pragma unroll
        for (int i = 0; i < K; ++i) {
          const int64_t hin = h + i - p;
          if (hin < 0 || hin >= hh) continue;
          const T* xr = x + ((img * hh + hin) * ww) * c + ch;
#pragma unroll
          for (int j = 0; j < K; ++j) {
            const int64_t win = w + j - p;
            if (win >= 0 && win < ww) acc[i * K + j] += g * to_acc(xr[win * c]);
          }
        }
      }
    }
  }
  // Every thread reaches the barriers (no early exit above); lane ly of each batch sums tap t0 + ly over the
  // 8 lanes in order 0..7, so the result does not depend on scheduling.
  static_assert(kLanes * kColTile * kLanes * sizeof(double) <= 16384, "shared staging too large");
  __shared__ A stage[kLanes][kLanes][kColTile];  // [tap in batch][lane][channel]
  A* out = partial + int64_t(blockIdx.y) * K * K * c + ch;
#pragma unroll
  for (int t0 = 0; t0 < K * K; t0 += kLanes) {
#pragma unroll
    for (int b = 0; b < kLanes; ++b)
      if (t0 + b < K * K) stage[b][threadIdx.y][threadIdx.x] = acc[t0 + b];
    __syncthreads();
    const int t = t0 + int(threadIdx.y);
    if (t < K * K && ch < c) {
      A s = stage[threadIdx.y][0][threadIdx.x];
#pragma unroll
      for (int l = 1; l < kLanes; ++l) s += stage[threadIdx.y][l][threadIdx.x];
      out[int64_t(t) * c] = s;
    }
    __syncthreads();
  }
}

template <class T>
__global__ void filter_finish_kernel(const acc_t<T>* __restrict__ partial, int64_t parts, int64_t taps_c,
                                     T* __restrict__ dw) {
  for (int64_t i = global_thread(); i < taps_c; i += grid_threads()) {
    acc_t<T> s = 0;
    for (int64_t q = 0; q < parts; ++q) s += partial[q * taps_c + i];
    dw[i] = cvt<T>(s);
  }
}

size_t acc_size(DType t) {
  return t == DType::f64 ? sizeof(double) : sizeof(float);
}

template <class F>
cudaError_t dispatch_k(int k, F&& f) {
  switch (k) {
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    case 9:
      return f(std::integral_constant<int, 9>{});
    default:
      return cudaErrorNotSupported;
  }
}

// ---- the tiled 7x7 kernels: thin wrappers around the phases of depthwise_tiles.h ----

struct DeviceCvt {
  template <class T>
  __device__ __forceinline__ static float in(T v) {
    return cvt<float>(v);
  }
  template <class T>
  __device__ __forceinline__ static T out(float v) {
    return cvt<T>(v);
  }
};

// 49 weights and 49 accumulators per thread: at most 128 registers, two 8-warp blocks per SM.
// 49 weights and 28 accumulators per thread: at most 128 registers, two 8-warp blocks per SM.
template <class T, bool kFlip>
__global__ void __launch_bounds__(dw7::kForwardWarps* dw7::kLanes, 2)
    tiled_forward_kernel(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                         T* __restrict__ y, dw7::Geometry g, bool vec) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* wsm = reinterpret_cast<float*>(smem);
  T* buf = reinterpret_cast<T*>(smem + dw7::kWeightBytes);
  const int tid = int(threadIdx.x);
  const dw7::Block b = dw7::forward_block(g, blockIdx.x, blockIdx.y);
  dw7::stage_weights<T, DeviceCvt, kFlip>(wt, g, b, wsm, tid);
  dw7::stage<T, DeviceCvt>(x, g, b, vec, buf, tid);
  __syncthreads();
  dw7::forward_strip<T, DeviceCvt>(g, b, buf, wsm, bias, y, tid);
}

// Per image of the block's batches: gy staged, dx (kDx) and the strip's gy into registers; x staged, the
// weight- and bias-gradient sums. Every thread reaches every barrier (the phases return early, never the
// kernel).
template <class T, bool kDx>
__global__ void __launch_bounds__(dw7::kBackwardWarps* dw7::kLanes, 4)
    tiled_backward_kernel(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ wt,
                          T* __restrict__ dx, float* __restrict__ partial, dw7::Geometry g, bool vec_gy,
                          bool vec_x) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* wsm = reinterpret_cast<float*>(smem);
  T* buf = reinterpret_cast<T*>(smem + dw7::kWeightBytes);
  float* sums = reinterpret_cast<float*>(smem + dw7::forward_smem(g, int(sizeof(T))));
  const int tid = int(threadIdx.x);
  const int64_t tile = dw7::backward_tile(g, blockIdx.x), z = dw7::backward_z(g, blockIdx.x);
  if constexpr (kDx)
    dw7::stage_weights<T, DeviceCvt, true>(wt, g, dw7::tile_block(g, 0, tile, blockIdx.y), wsm, tid);
  dw7::zero_sums(g, sums, tid);
  for (int64_t batch = z; batch < g.batches; batch += g.nz) {
    const dw7::Block b = dw7::tile_block(g, batch, tile, blockIdx.y);
    dw7::stage<T, DeviceCvt>(gy, g, b, vec_gy, buf, tid);
    __syncthreads();
    if constexpr (kDx) dw7::forward_strip<T, DeviceCvt>(g, b, buf, wsm, nullptr, dx, tid);
    dw7::GyStrip gs;
    dw7::load_gy<T, DeviceCvt>(g, b, buf, gs, tid);
    __syncthreads();
    dw7::stage<T, DeviceCvt>(x, g, b, vec_x, buf, tid);
    __syncthreads();
    dw7::accumulate_filter<T, DeviceCvt>(g, b, buf, gs, sums, tid);
    __syncthreads();
  }
  dw7::write_partial(g, dw7::tile_block(g, 0, tile, blockIdx.y), tile * g.nz + z, sums, partial, tid);
}

template <class T>
__global__ void tiled_finish_kernel(const float* __restrict__ partial, T* __restrict__ dw, T* __restrict__ db,
                                    dw7::Geometry g) {
  const int64_t items = int64_t(dw7::kSlots) * g.c;
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    dw7::finish_item<T, DeviceCvt>(g, partial, dw, db, i);
}

// The tiled kernels' dtypes: the floating ones but f64.
template <class T>
struct IsTiled : std::bool_constant<IsFloat<T>::value && !std::is_same_v<T, double>> {};

// Dynamic shared memory past the default 48 KiB must be asked for, per kernel.
template <class K>
cudaError_t allow_smem(K* kernel, int64_t bytes) {
  if (bytes <= (48 << 10)) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

template <class T, bool kFlip>
cudaError_t launch_tiled_forward(const Config& cfg, const T* x, const T* wt, const T* bias, T* y, int64_t n,
                                 int64_t h, int64_t w, int64_t c) {
  const dw7::Geometry g = dw7::plan(n, h, w, c, int(sizeof(T)), false, cfg.sm_count);
  if (!dw7::fits_grid(g, false)) return cudaErrorInvalidConfiguration;
  const int64_t smem = dw7::forward_smem(g, int(sizeof(T)));
  auto* kernel = tiled_forward_kernel<T, kFlip>;
  if (const cudaError_t st = allow_smem(kernel, smem); st != cudaSuccess) return st;
  kernel<<<dim3(unsigned(g.batches * g.tiles()), unsigned(g.cgroups)), unsigned(g.threads()), size_t(smem),
           cfg.stream>>>(x, wt, bias, y, g, dw7::vector_ok(x, c));
  return cudaGetLastError();
}

}  // namespace

cudaError_t depthwise_forward(const Config& cfg, DType t, const void* x, const void* w, const void* bias,
                              void* y, int64_t n, int64_t h, int64_t ww, int64_t c, int k) {
  const int64_t total = n * h * ww * c;
  if (total == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<grid_for(total, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y),
        n, h, ww, c, k);
    return cudaGetLastError();
  });
}

cudaError_t depthwise_backward_data(const Config& cfg, DType t, const void* gy, const void* w, void* dx,
                                    int64_t n, int64_t h, int64_t ww, int64_t c, int k) {
  const int64_t total = n * h * ww * c;
  if (total == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_data_kernel<T><<<grid_for(total, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<const T*>(gy), static_cast<const T*>(w), static_cast<T*>(dx), n, h, ww, c, k);
    return cudaGetLastError();
  });
}

size_t depthwise_backward_filter_workspace(DType t, int64_t n, int64_t h, int64_t c, int k, int sm_count) {
  const FilterPlan f = filter_plan(n * h, c, k, acc_size(t), sm_count);
  return size_t(f.chunks) * size_t(k * k) * size_t(c) * acc_size(t);
}

cudaError_t depthwise_backward_filter(const Config& cfg, DType t, const void* gy, const void* x, void* dw,
                                      int64_t n, int64_t h, int64_t ww, int64_t c, int k, void* workspace) {
  if (c == 0) return cudaSuccess;
  const FilterPlan f = filter_plan(n * h, c, k, acc_size(t), cfg.sm_count);
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    return dispatch_k(k, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      A* partial = static_cast<A*>(workspace);
      const dim3 grid(unsigned(f.col_tiles), unsigned(f.chunks));
      filter_partial_kernel<K, T><<<grid, dim3(kColTile, kLanes), 0, cfg.stream>>>(
          static_cast<const T*>(gy), static_cast<const T*>(x), n, h, ww, c, f.rows_per_chunk, partial);
      const cudaError_t st = cudaGetLastError();
      if (st != cudaSuccess) return st;
      const int64_t taps_c = int64_t(K) * K * c;
      filter_finish_kernel<T><<<grid_for(taps_c, cfg.sm_count), kThreads, 0, cfg.stream>>>(
          partial, f.chunks, taps_c, static_cast<T*>(dw));
      return cudaGetLastError();
    });
  });
}

bool depthwise7_supported(DType t, int64_t n, int64_t h, int64_t w, int64_t c, int sm_count) {
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16) return false;
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return false;
  const int elem = int(dtype_size(t));
  return dw7::fits_grid(dw7::plan(n, h, w, c, elem, false, sm_count), false) &&
         dw7::fits_grid(dw7::plan(n, h, w, c, elem, true, sm_count), true);
}

cudaError_t depthwise7_forward(const Config& cfg, DType t, const void* x, const void* w, const void* bias,
                               void* y, int64_t n, int64_t h, int64_t ww, int64_t c) {
  if (n * h * ww * c == 0) return cudaSuccess;
  return visit_if<IsTiled>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_tiled_forward<T, false>(cfg, static_cast<const T*>(x), static_cast<const T*>(w),
                                          static_cast<const T*>(bias), static_cast<T*>(y), n, h, ww, c);
  });
}

cudaError_t depthwise7_backward_data(const Config& cfg, DType t, const void* gy, const void* w, void* dx,
                                     int64_t n, int64_t h, int64_t ww, int64_t c) {
  if (n * h * ww * c == 0) return cudaSuccess;
  return visit_if<IsTiled>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_tiled_forward<T, true>(cfg, static_cast<const T*>(gy), static_cast<const T*>(w), nullptr,
                                         static_cast<T*>(dx), n, h, ww, c);
  });
}

size_t depthwise7_backward_workspace(DType t, int64_t n, int64_t h, int64_t ww, int64_t c, int sm_count) {
  const dw7::Geometry g = dw7::plan(n, h, ww, c, int(dtype_size(t)), true, sm_count);
  return size_t(g.partials()) * dw7::kSlots * size_t(c) * sizeof(float);
}

cudaError_t depthwise7_backward(const Config& cfg, DType t, const void* gy, const void* x, const void* w,
                                void* dx, void* dw, void* db, int64_t n, int64_t h, int64_t ww, int64_t c,
                                void* workspace) {
  if (!dw && !db) return dx ? depthwise7_backward_data(cfg, t, gy, w, dx, n, h, ww, c) : cudaSuccess;
  if (c == 0) return cudaSuccess;
  return visit_if<IsTiled>(t, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const dw7::Geometry g = dw7::plan(n, h, ww, c, int(sizeof(T)), true, cfg.sm_count);
    const int64_t items = int64_t(dw7::kSlots) * c;
    dw7::Geometry finish = g;
    if (n * h * ww > 0) {
      if (!dw7::fits_grid(g, true)) return cudaErrorInvalidConfiguration;
      const int64_t smem = dw7::backward_smem(g, int(sizeof(T)));
      auto* kernel = dx ? tiled_backward_kernel<T, true> : tiled_backward_kernel<T, false>;
      if (const cudaError_t st = allow_smem(kernel, smem); st != cudaSuccess) return st;
      const T* pgy = static_cast<const T*>(gy);
      const T* px = static_cast<const T*>(x);
      kernel<<<dim3(unsigned(g.tiles() * g.nz), unsigned(g.cgroups)), unsigned(g.threads()), size_t(smem),
               cfg.stream>>>(pgy, px, static_cast<const T*>(w), static_cast<T*>(dx),
                             static_cast<float*>(workspace), g, dw7::vector_ok(pgy, c),
                             dw7::vector_ok(px, c));
      if (const cudaError_t st = cudaGetLastError(); st != cudaSuccess) return st;
    } else {
      finish.nz = 0;  // no pixels: no partials, and the gradients are empty sums
    }
    tiled_finish_kernel<T><<<grid_for(items, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<const float*>(workspace), static_cast<T*>(dw), static_cast<T*>(db), finish);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
