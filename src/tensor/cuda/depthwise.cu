// Direct depthwise k x k convolution on NHWC data with the (k, k, C) weight, forward, backward-data and
// backward-filter: the fallback for problems cuDNN has no algorithm for (and a reference for its results,
// under set_depthwise_direct). One thread per output element along C, so a warp reads 32 consecutive
// channels of a pixel; the filter gradient is summed in fixed chunks (lanes in lane order within a chunk),
// then in chunk order: deterministic.
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

}  // namespace cz::cuda::launch
