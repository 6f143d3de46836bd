// LayerNorm over the channel dimension of NHWC rows, forward and backward. One warp per row (rows are short:
// 96..1536 channels in ConvNeXt, so a row stays in L1 across the passes); the parameter gradients are
// per-chunk column partials summed in chunk order by a second kernel: no atomics, results repeat bit for bit.
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Two passes for the statistics (mean, then the mean squared deviation): no cancellation whatever the
// row's offset, and the second pass reads L1.
template <class T>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                               const T* __restrict__ bias, acc_t<T> eps, T* __restrict__ y,
                               acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd, int64_t rows,
                               int c) {
  using A = acc_t<T>;
  const int lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * c;
  A s = 0;
  for (int i = lane; i < c; i += 32) s += to_acc(xr[i]);
  const A mu = warp_sum(s) / A(c);
  A q = 0;
  for (int i = lane; i < c; i += 32) {
    const A d = to_acc(xr[i]) - mu;
    q += d * d;
  }
  const A rs = A(1) / sqrt(warp_sum(q) / A(c) + eps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  T* yr = y + row * c;
  for (int i = lane; i < c; i += 32) {
    A v = (to_acc(xr[i]) - mu) * rs;
    if (weight) v *= to_acc(weight[i]);
    if (bias) v += to_acc(bias[i]);
    yr[i] = cvt<T>(v);
  }
}

// With xh the normalized input and gw = g * weight:
//   dx = rstd * gw - rstd * mean(gw) - xh * rstd * mean(gw * xh).
template <class T>
__global__ void backward_dx_kernel(const T* __restrict__ gy, const T* __restrict__ x,
                                   const T* __restrict__ weight, const acc_t<T>* __restrict__ mean,
                                   const acc_t<T>* __restrict__ rstd, T* __restrict__ dx, int64_t rows,
                                   int c) {
  using A = acc_t<T>;
  const int lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * c;
  const T* gr = gy + row * c;
  const A mu = mean[row], rs = rstd[row];
  A s1 = 0, s2 = 0;
  for (int i = lane; i < c; i += 32) {
    const A xh = (to_acc(xr[i]) - mu) * rs;
    const A gw = weight ? to_acc(gr[i]) * to_acc(weight[i]) : to_acc(gr[i]);
    s1 += gw;
    s2 += gw * xh;
  }
  const A a = rs * warp_sum(s1) / A(c), b = rs * warp_sum(s2) / A(c);
  T* dr = dx + row * c;
  for (int i = lane; i < c; i += 32) {
    const A xh = (to_acc(xr[i]) - mu) * rs;
    const A gw = weight ? to_acc(gr[i]) * to_acc(weight[i]) : to_acc(gr[i]);
    dr[i] = cvt<T>(rs * gw - a - xh * b);
  }
}

// Parameter gradients: blocks of 32 channels x 8 row lanes each sum a chunk of rows (dweight = sum g * xh,
// dbias = sum g); partial[chunk][c] for dweight, then the same for dbias at partial + chunks * c.
template <class T>
__global__ void param_partial_kernel(const T* __restrict__ gy, const T* __restrict__ x,
                                     const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                     int64_t rows, int64_t c, int64_t rows_per_chunk, int64_t chunks,
                                     acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ A sw[kRowLanes][kColTile + 1], sb[kRowLanes][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A w = 0, b = 0;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const A g = to_acc(gy[r * c + col]);
      w += g * ((to_acc(x[r * c + col]) - mean[r]) * rstd[r]);  // g * xh, xh rounded as in dx and the CPU
      b += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = w;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    A tw = 0, tb = 0;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    partial[int64_t(blockIdx.y) * c + col] = tw;
    partial[(chunks + int64_t(blockIdx.y)) * c + col] = tb;
  }
}

template <class T>
__global__ void param_finish_kernel(const acc_t<T>* __restrict__ partial, int64_t chunks, int64_t c,
                                    T* __restrict__ dweight, T* __restrict__ dbias) {
  using A = acc_t<T>;
  for (int64_t col = global_thread(); col < c; col += grid_threads()) {
    A w = 0, b = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      w += partial[k * c + col];
      b += partial[(chunks + k) * c + col];
    }
    if (dweight) dweight[col] = cvt<T>(w);
    if (dbias) dbias[col] = cvt<T>(b);
  }
}

size_t acc_size(DType t) {
  return t == DType::f64 ? sizeof(double) : sizeof(float);
}

}  // namespace

cudaError_t layer_norm_forward(const Config& cfg, DType t, const void* x, const void* weight,
                               const void* bias, double eps, void* y, void* mean, void* rstd, int64_t rows,
                               int64_t c) {
  if (rows == 0) return cudaSuccess;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (c > 0x7fffffff || blocks > 0x7fffffff) return cudaErrorInvalidValue;  // int row length, gridDim.x
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    forward_kernel<T><<<unsigned(blocks), 32 * kRowsPerBlock, 0, cfg.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), A(eps),
        static_cast<T*>(y), static_cast<A*>(mean), static_cast<A*>(rstd), rows, int(c));
    return cudaGetLastError();
  });
}

size_t layer_norm_backward_workspace(DType t, int64_t rows, int64_t c, int sm_count) {
  const ColumnPlan p = column_plan(rows, c, sm_count);
  return size_t(2 * p.chunks * c) * acc_size(t);
}

cudaError_t layer_norm_backward(const Config& cfg, DType t, const void* gy, const void* x, const void* weight,
                                const void* mean, const void* rstd, void* dx, void* dweight, void* dbias,
                                int64_t rows, int64_t c, void* workspace) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (c > 0x7fffffff || blocks > 0x7fffffff) return cudaErrorInvalidValue;  // int row length, gridDim.x
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(gy);
    const T* px = static_cast<const T*>(x);
    const A* pm = static_cast<const A*>(mean);
    const A* pr = static_cast<const A*>(rstd);
    if (dx && rows > 0) {
      backward_dx_kernel<T><<<unsigned(blocks), 32 * kRowsPerBlock, 0, cfg.stream>>>(
          pg, px, static_cast<const T*>(weight), pm, pr, static_cast<T*>(dx), rows, int(c));
      const cudaError_t st = cudaGetLastError();
      if (st != cudaSuccess) return st;
    }
    if ((!dweight && !dbias) || c == 0) return cudaSuccess;
    const ColumnPlan p = column_plan(rows, c, cfg.sm_count);
    A* partial = static_cast<A*>(workspace);
    const dim3 grid(unsigned(p.col_tiles), unsigned(p.chunks));
    param_partial_kernel<T><<<grid, dim3(kColTile, kRowLanes), 0, cfg.stream>>>(
        pg, px, pm, pr, rows, c, p.rows_per_chunk, p.chunks, partial);
    const cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    param_finish_kernel<T><<<grid_for(c, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        partial, p.chunks, c, static_cast<T*>(dweight), static_cast<T*>(dbias));
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
