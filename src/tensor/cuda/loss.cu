// Softmax cross-entropy with label smoothing and against soft targets (forward and backward), and argmax. The
// losses are means over rows: per-row terms go to a workspace and one block adds them in a fixed order, so
// they repeat bit for bit. The soft-target kernels' per-thread work is soft_target_rows.h's (Note
// [Soft-target cross-entropy kernels]).
#include "tensor/cuda/device_utils.cuh"
#include "tensor/cuda/soft_target_rows.h"

namespace cz::cuda::launch {
namespace {
using namespace detail;

constexpr int kRowThreads = 256;

struct Max {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a > b ? a : b;
  }
};
struct Add {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};

// Reduction over the block, returned to every thread. blockDim.x: a multiple of 32, at most 1024.
template <class A, class Op>
__device__ A block_reduce(A v, Op op) {
  __shared__ A warp_vals[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, nwarps = int(blockDim.x) >> 5;
  __syncthreads();  // warp_vals may still be read by a previous call
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  v = warp_vals[0];
  for (int w = 1; w < nwarps; ++w) v = op(v, warp_vals[w]);
  return v;
}

// Per row, with lse = log sum_k exp(z_k) taken from the row maximum:
//   loss_n = lse - (1 - s) z_y - (s / K) sum_k z_k.
template <class T, class L>
__global__ void forward_rows_kernel(const T* __restrict__ logits, const L* __restrict__ labels,
                                    double smoothing, acc_t<T>* __restrict__ lse,
                                    acc_t<T>* __restrict__ row_loss, int64_t k) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x;
  const T* z = logits + row * k;
  A m = -INFINITY;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = Max{}(m, to_acc(z[i]));
  m = block_reduce(m, Max{});
  A se = 0, sz = 0;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const A v = to_acc(z[i]);
    se += exp(v - m);
    sz += v;
  }
  se = block_reduce(se, Add{});
  sz = block_reduce(sz, Add{});
  if (threadIdx.x == 0) {
    const int64_t y = int64_t(labels[row]);
    const A l = m + log(se);
    const bool ok = y >= 0 && y < k;
    lse[row] = ok ? l : A(NAN);
    row_loss[row] = ok ? l - A(1 - smoothing) * to_acc(z[y]) - A(smoothing / double(k)) * sz : A(NAN);
  }
}

template <class T>
__global__ void forward_mean_kernel(const acc_t<T>* __restrict__ row_loss, int64_t n, T* __restrict__ loss) {
  using A = acc_t<T>;
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += row_loss[i];
  s = block_reduce(s, Add{});
  if (threadIdx.x == 0) loss[0] = cvt<T>(s / A(n));
}

// dloss/dz_k = g / N * (softmax_k - t_k), t = (1 - s) onehot(y) + s / K.
template <class T, class L>
__global__ void backward_kernel(const T* __restrict__ gloss, const T* __restrict__ logits,
                                const L* __restrict__ labels, const acc_t<T>* __restrict__ lse,
                                double smoothing, T* __restrict__ dlogits, int64_t n, int64_t k) {
  using A = acc_t<T>;
  const A scale = to_acc(gloss[0]) / A(n);
  const A off = A(smoothing / double(k)), hit = A(1 - smoothing);
  for (int64_t i = global_thread(); i < n * k; i += grid_threads()) {
    const int64_t row = i / k, col = i - row * k;
    const int64_t y = int64_t(labels[row]);
    A d = scale * (exp(to_acc(logits[i]) - lse[row]) - off);
    if (col == y) d -= scale * hit;
    dlogits[i] = cvt<T>(d);
  }
}

struct DeviceCvt {
  template <class A, class S>
  __device__ __forceinline__ static A to(S s) {
    return cvt<A>(s);
  }
};

// One block of stce::kRowThreads per row: lse, the targets' sum and the row's loss.
template <class T>
__global__ void soft_rows_kernel(const T* __restrict__ logits, const T* __restrict__ targets,
                                 acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ tsum,
                                 acc_t<T>* __restrict__ row_loss, int64_t k) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x;
  const T* z = logits + row * k;
  const T* t = targets + row * k;
  const int tid = int(threadIdx.x);
  const A m = block_reduce(stce::thread_max<A, T, DeviceCvt>(z, k, tid), Max{});
  A se, stz, st;
  stce::thread_sums<A, T, DeviceCvt>(z, t, k, tid, m, se, stz, st);
  se = block_reduce(se, Add{});
  stz = block_reduce(stz, Add{});
  st = block_reduce(st, Add{});
  if (tid == 0) {
    const stce::Row<A> r = stce::row_of(m, se, stz, st);
    lse[row] = r.lse;
    tsum[row] = r.st;
    row_loss[row] = r.loss;
  }
}

// Either gradient may be null.
template <class T>
__global__ void soft_backward_kernel(const T* __restrict__ gloss, const T* __restrict__ logits,
                                     const T* __restrict__ targets, const acc_t<T>* __restrict__ lse,
                                     const acc_t<T>* __restrict__ tsum, T* __restrict__ dlogits,
                                     T* __restrict__ dtargets, int64_t n, int64_t k) {
  using A = acc_t<T>;
  const A scale = to_acc(gloss[0]) / A(n);
  for (int64_t i = global_thread(); i < n * k; i += grid_threads()) {
    const int64_t row = i / k;
    const A z = to_acc(logits[i]);
    if (dlogits) dlogits[i] = cvt<T>(stce::grad_logit(z, to_acc(targets[i]), lse[row], tsum[row], scale));
    if (dtargets) dtargets[i] = cvt<T>(stce::grad_target(z, lse[row], scale));
  }
}

// (value, index) a beats b: NaN beats numbers, larger beats smaller, and ties go to the smaller index.
template <class A>
__device__ __forceinline__ bool beats(A av, int64_t ai, A bv, int64_t bi) {
  const bool an = av != av, bn = bv != bv;
  if (an || bn) return an && (!bn || ai < bi);
  return av > bv || (av == bv && ai < bi);
}

// One warp per row.
template <class T>
__global__ void argmax_kernel(const T* __restrict__ x, int64_t* __restrict__ out, int64_t rows, int64_t k) {
  using A = acc_t<T>;
  const int lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* z = x + row * k;
  A bv = 0;
  int64_t bi = -1;
  for (int64_t i = lane; i < k; i += 32) {
    const A v = to_acc(z[i]);
    if (bi < 0 || beats(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && (bi < 0 || beats(ov, oi, bv, bi))) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) out[row] = bi;
}

template <class F>
cudaError_t visit_label(DType t, F&& f) {
  if (t == DType::i32) return f(Tag<int32_t>{});
  if (t == DType::i64) return f(Tag<int64_t>{});
  return cudaErrorInvalidValue;
}

}  // namespace

size_t cross_entropy_workspace(DType t, int64_t n) {
  return size_t(n) * (t == DType::f64 ? sizeof(double) : sizeof(float));
}

cudaError_t cross_entropy_forward(const Config& cfg, DType t, DType label_t, const void* logits,
                                  const void* labels, double smoothing, void* loss, void* lse, int64_t n,
                                  int64_t k, void* workspace) {
  if (n == 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    return visit_label(label_t, [&](auto ltag) {
      using L = typename decltype(ltag)::type;
      A* row_loss = static_cast<A*>(workspace);
      forward_rows_kernel<T, L><<<unsigned(n), kRowThreads, 0, cfg.stream>>>(
          static_cast<const T*>(logits), static_cast<const L*>(labels), smoothing, static_cast<A*>(lse),
          row_loss, k);
      const cudaError_t st = cudaGetLastError();
      if (st != cudaSuccess) return st;
      forward_mean_kernel<T><<<1, kRowThreads, 0, cfg.stream>>>(row_loss, n, static_cast<T*>(loss));
      return cudaGetLastError();
    });
  });
}

cudaError_t cross_entropy_backward(const Config& cfg, DType t, DType label_t, const void* gloss,
                                   const void* logits, const void* labels, const void* lse, double smoothing,
                                   void* dlogits, int64_t n, int64_t k) {
  if (n * k == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    return visit_label(label_t, [&](auto ltag) {
      using L = typename decltype(ltag)::type;
      backward_kernel<T, L><<<grid_for(n * k, cfg.sm_count), kThreads, 0, cfg.stream>>>(
          static_cast<const T*>(gloss), static_cast<const T*>(logits), static_cast<const L*>(labels),
          static_cast<const A*>(lse), smoothing, static_cast<T*>(dlogits), n, k);
      return cudaGetLastError();
    });
  });
}

cudaError_t soft_target_cross_entropy_forward(const Config& cfg, DType t, const void* logits,
                                              const void* targets, void* loss, void* lse, void* tsum,
                                              int64_t n, int64_t k, void* workspace) {
  if (n == 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    A* row_loss = static_cast<A*>(workspace);
    soft_rows_kernel<T><<<unsigned(n), stce::kRowThreads, 0, cfg.stream>>>(
        static_cast<const T*>(logits), static_cast<const T*>(targets), static_cast<A*>(lse),
        static_cast<A*>(tsum), row_loss, k);
    const cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return st;
    forward_mean_kernel<T><<<1, stce::kRowThreads, 0, cfg.stream>>>(row_loss, n, static_cast<T*>(loss));
    return cudaGetLastError();
  });
}

cudaError_t soft_target_cross_entropy_backward(const Config& cfg, DType t, const void* gloss,
                                               const void* logits, const void* targets, const void* lse,
                                               const void* tsum, void* dlogits, void* dtargets, int64_t n,
                                               int64_t k) {
  if (n * k == 0 || (!dlogits && !dtargets)) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    soft_backward_kernel<T><<<grid_for(n * k, cfg.sm_count), kThreads, 0, cfg.stream>>>(
        static_cast<const T*>(gloss), static_cast<const T*>(logits), static_cast<const T*>(targets),
        static_cast<const A*>(lse), static_cast<const A*>(tsum), static_cast<T*>(dlogits),
        static_cast<T*>(dtargets), n, k);
    return cudaGetLastError();
  });
}

cudaError_t argmax(const Config& cfg, DType t, const void* x, int64_t* out, int64_t rows, int64_t k) {
  if (rows == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWarps = kThreads / 32;
    const int64_t blocks = (rows + kWarps - 1) / kWarps;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;  // gridDim.x
    argmax_kernel<T><<<unsigned(blocks), kThreads, 0, cfg.stream>>>(static_cast<const T*>(x), out, rows, k);
    return cudaGetLastError();
  });
}

}  // namespace cz::cuda::launch
