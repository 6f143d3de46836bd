// Reductions: full sums (warp shuffles, then one block over the per-block partials), column sums (per-channel
// gradients: dgamma, dbias), and the scalar broadcast of their backward. Deterministic: fixed partitions and
// summation orders, no atomics, so a run repeats bit for bit.
#include "tensor/cuda/device_utils.cuh"

namespace cz::cuda::launch {
namespace {
using namespace detail;

// Sum over the block, valid in thread 0. blockDim.x must be a multiple of 32, at most 1024.
template <class A>
__device__ A block_sum(A v) {
  __shared__ A warp_sums[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int nwarps = int(blockDim.x) >> 5;
  v = int(threadIdx.x) < nwarps ? warp_sums[threadIdx.x] : A(0);
  if (warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;
}

template <int kVec, class T>
__global__ void sum_partial_kernel(const T* __restrict__ x, int64_t n, acc_t<T>* __restrict__ partial) {
  using V = Vec<T, kVec>;
  acc_t<T> s = 0;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) {
    const V v = reinterpret_cast<const V*>(x)[i];
#pragma unroll
    for (int j = 0; j < kVec; ++j) s += to_acc(v.v[j]);
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) s += to_acc(x[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <class T>
__global__ void sum_finish_kernel(const acc_t<T>* __restrict__ partial, int nparts, double factor,
                                  T* __restrict__ out) {
  acc_t<T> s = 0;
  for (int i = int(threadIdx.x); i < nparts; i += int(blockDim.x)) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = cvt<T>(double(s) * factor);
}

int sum_blocks(int64_t n, int sm_count) {
  const int64_t per_block = int64_t(kThreads) * 8;  // at least a few elements per thread before reducing
  return int(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, int64_t(std::max(sm_count, 1)) * 8));
}

// Column sums over a ColumnPlan (device_utils.cuh).
template <class T>
__global__ void column_partial_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t rows,
                                      int64_t cols, int64_t rows_per_chunk, acc_t<T>* __restrict__ partial) {
  __shared__ acc_t<T> sh[kRowLanes][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  acc_t<T> s = 0;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const int64_t i = r * cols + col;
      s += b ? to_acc(a[i]) * to_acc(b[i]) : to_acc(a[i]);
    }
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    acc_t<T> t = 0;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) t += sh[k][threadIdx.x];
    partial[int64_t(blockIdx.y) * cols + col] = t;
  }
}

template <class T>
__global__ void column_finish_kernel(const acc_t<T>* __restrict__ partial, int64_t chunks, int64_t cols,
                                     T* __restrict__ out) {
  for (int64_t c = global_thread(); c < cols; c += grid_threads()) {
    acc_t<T> s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] = cvt<T>(s);
  }
}

template <int kVec, class T>
__global__ void broadcast_kernel(const T* __restrict__ scalar, double factor, T* __restrict__ out,
                                 int64_t n) {
  using V = Vec<T, kVec>;
  const T v = cvt<T>(cvt<double>(scalar[0]) * factor);
  V pack;
#pragma unroll
  for (int j = 0; j < kVec; ++j) pack.v[j] = v;
  const int64_t nvec = n / kVec;
  for (int64_t i = global_thread(); i < nvec; i += grid_threads()) reinterpret_cast<V*>(out)[i] = pack;
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) out[i] = v;
}

size_t acc_size(DType t) {
  return t == DType::f64 ? sizeof(double) : sizeof(float);
}

}  // namespace

size_t sum_workspace(DType t, int64_t n, int sm_count) {
  return size_t(sum_blocks(n, sm_count)) * acc_size(t);
}

cudaError_t sum(const Config& cfg, DType t, const void* x, int64_t n, double factor, void* out,
                void* workspace) {
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const int blocks = sum_blocks(n, cfg.sm_count);
    const T* px = static_cast<const T*>(x);
    A* partial = static_cast<A*>(workspace);
    if (aligned16(x))
      sum_partial_kernel<kVec16<T>, T><<<blocks, kThreads, 0, cfg.stream>>>(px, n, partial);
    else
      sum_partial_kernel<1, T><<<blocks, kThreads, 0, cfg.stream>>>(px, n, partial);
    cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    sum_finish_kernel<T><<<1, kThreads, 0, cfg.stream>>>(partial, blocks, factor, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

size_t column_sums_workspace(DType t, int64_t rows, int64_t cols, int sm_count) {
  const ColumnPlan p = column_plan(rows, cols, sm_count);
  return size_t(p.chunks * cols) * acc_size(t);
}

cudaError_t column_sums(const Config& cfg, DType t, const void* a, const void* b, int64_t rows, int64_t cols,
                        void* out, void* workspace) {
  if (cols == 0) return cudaSuccess;
  const ColumnPlan p = column_plan(rows, cols, cfg.sm_count);
  if (p.col_tiles > 0x7fffffff) return cudaErrorInvalidValue;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    A* partial = static_cast<A*>(workspace);
    const dim3 grid(unsigned(p.col_tiles), unsigned(p.chunks));
    const dim3 block(kColTile, kRowLanes);
    column_partial_kernel<T><<<grid, block, 0, cfg.stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), rows, cols, p.rows_per_chunk, partial);
    cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    column_finish_kernel<T><<<grid_for(cols, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        partial, p.chunks, cols, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t broadcast_scalar(const Config& cfg, DType t, const void* scalar, double factor, void* out,
                             int64_t n) {
  if (n == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = static_cast<const T*>(scalar);
    T* po = static_cast<T*>(out);
    if (aligned16(out))
      broadcast_kernel<kVec16<T>, T>
          <<<grid_for(n / kVec16<T> + 1, cfg.sm_count), kThreads, 0, cfg.stream>>>(ps, factor, po, n);
    else
      broadcast_kernel<1, T><<<grid_for(n, cfg.sm_count), kThreads, 0, cfg.stream>>>(ps, factor, po, n);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
