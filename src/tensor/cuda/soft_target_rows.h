// Per-thread arithmetic of the soft-target cross-entropy kernels (loss.cu) as host/device templates: the
// kernels call them with CUDA's types, and tests/tensor/test_soft_target_emulation.cpp runs the same code on
// the CPU thread by thread, with the kernels' block size and reduction order, so the kernels' logic is
// checked without a GPU. Plain C++ apart from CZ_HD: no CUDA header is needed to include it.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/cuda/host_device.h"

namespace cz::cuda::stce {

// Note [Soft-target cross-entropy kernels]: forward runs one block of kRowThreads threads per row. Thread
// `tid` reads columns tid, tid + kRowThreads, ... of its row twice: first for its largest logit, reduced over
// the block to the row maximum m, then for three sums with m known, each reduced over the block the same way:
//   se = sum_k exp(z_k - m),  stz = sum_k t_k (z_k - m),  st = sum_k t_k.
// A block reduction adds within each warp by butterfly (lane l takes lane l ^ 16, ^ 8, ... ^ 1), then warp
// 0's value, warp 1's, ... in order (loss.cu's block_reduce). Thread 0 writes lse = m + log se and st (saved
// for backward) and the row's loss st log se - stz to a workspace, and one block of kRowThreads adds the
// rows' losses, thread `tid` taking rows tid, tid + kRowThreads, ..., reduced the same way, and divides by N.
// Every order is fixed by N and K: the loss repeats bit for bit. Backward is elementwise (a grid-stride
// loop):
//   dz_k = g / N (exp(z_k - lse) st - t_k),  dt_k = g / N (lse - z_k).
inline constexpr int kRowThreads = 256;

template <class A>
CZ_HD A exp_of(A v) {
#if defined(__CUDA_ARCH__)
  return exp(v);
#else
  return std::exp(v);
#endif
}
template <class A>
CZ_HD A log_of(A v) {
#if defined(__CUDA_ARCH__)
  return log(v);
#else
  return std::log(v);
#endif
}

// Thread tid's largest logit of the row (-inf for a thread past the row's end). Cvt::template to<A>(x) reads
// an element of the data's dtype as A.
template <class A, class T, class Cvt>
CZ_HD A thread_max(const T* z, int64_t k, int tid) {
  A m = -A(INFINITY);
  for (int64_t i = tid; i < k; i += kRowThreads) {
    const A v = Cvt::template to<A>(z[i]);
    m = v > m ? v : m;
  }
  return m;
}

// Thread tid's partial sums se, stz, st of the row, given the row maximum m.
template <class A, class T, class Cvt>
CZ_HD void thread_sums(const T* z, const T* t, int64_t k, int tid, A m, A& se, A& stz, A& st) {
  se = stz = st = A(0);
  for (int64_t i = tid; i < k; i += kRowThreads) {
    const A v = Cvt::template to<A>(z[i]) - m, w = Cvt::template to<A>(t[i]);
    se += exp_of(v);
    stz += w * v;
    st += w;
  }
}

// The row's results from its block-reduced sums.
template <class A>
struct Row {
  A lse, st, loss;
};
template <class A>
CZ_HD Row<A> row_of(A m, A se, A stz, A st) {
  const A log_se = log_of(se);
  return {m + log_se, st, st * log_se - stz};
}

// Thread tid's partial sum of the rows' losses for the mean.
template <class A>
CZ_HD A thread_rows_sum(const A* row_loss, int64_t n, int tid) {
  A s = A(0);
  for (int64_t i = tid; i < n; i += kRowThreads) s += row_loss[i];
  return s;
}

// One element of each gradient; scale = g / N.
template <class A>
CZ_HD A grad_logit(A z, A t, A lse, A st, A scale) {
  return scale * (exp_of(z - lse) * st - t);
}
template <class A>
CZ_HD A grad_target(A z, A lse, A scale) {
  return scale * (lse - z);
}

}  // namespace cz::cuda::stce
