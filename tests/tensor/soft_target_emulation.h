// The soft-target cross-entropy kernels (loss.cu, Note [Soft-target cross-entropy kernels]) run on the CPU:
// every "thread" of a block through the same functions of soft_target_rows.h the kernels call, and the block
// reductions in the kernels' order (butterfly within each warp, then the warps in order). What differs from a
// GPU is only the math library's exp and log and the device compiler's multiply-add contraction, a few ulps
// (test_soft_target_emulation.cpp checks the emulation against the CPU backend; with a GPU,
// test_cuda_ops.cpp checks the kernels against the emulation).
#pragma once

#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cuda/soft_target_rows.h"
#include "tensor/half.h"

namespace cz::testing {

struct HostElemCvt {
  template <class A, class S>
  static A to(S v) {
    if constexpr (std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>)
      return A(float(v));
    else
      return A(v);
  }
};

// loss.cu's block_reduce over kRowThreads values, one per thread.
template <class A, class Op>
A emulate_block_reduce(std::vector<A> v, Op op) {
  constexpr int kWarp = 32;
  for (size_t w0 = 0; w0 < v.size(); w0 += kWarp)
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      std::array<A, kWarp> next;
      for (int l = 0; l < kWarp; ++l) next[size_t(l)] = op(v[w0 + size_t(l)], v[w0 + size_t(l ^ o)]);
      for (int l = 0; l < kWarp; ++l) v[w0 + size_t(l)] = next[size_t(l)];
    }
  A r = v[0];
  for (size_t w = kWarp; w < v.size(); w += kWarp) r = op(r, v[w]);
  return r;
}

template <class T>
struct SoftTargetEmulation {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  T loss{};
  std::vector<A> lse, tsum;
  std::vector<T> dlogits, dtargets;
};

// launch::soft_target_cross_entropy_forward, then backward with the loss gradient g. z, t: (n, k) row-major.
template <class T>
SoftTargetEmulation<T> emulate_soft_target_cross_entropy(const std::vector<T>& z, const std::vector<T>& t,
                                                         int64_t n, int64_t k, T g) {
  namespace stce = cuda::stce;
  using A = typename SoftTargetEmulation<T>::A;
  const auto max_op = [](A a, A b) { return a > b ? a : b; };
  const auto add_op = [](A a, A b) { return a + b; };
  SoftTargetEmulation<T> r;
  std::vector<A> row_loss(static_cast<size_t>(n));
  r.lse.resize(size_t(n));
  r.tsum.resize(size_t(n));
  std::vector<A> part(stce::kRowThreads), se(stce::kRowThreads), stz(stce::kRowThreads),
      st(stce::kRowThreads);
  for (int64_t row = 0; row < n; ++row) {
    const T* zr = z.data() + row * k;
    const T* tr = t.data() + row * k;
    for (int tid = 0; tid < stce::kRowThreads; ++tid)
      part[size_t(tid)] = stce::thread_max<A, T, HostElemCvt>(zr, k, tid);
    const A m = emulate_block_reduce(part, max_op);
    for (int tid = 0; tid < stce::kRowThreads; ++tid)
      stce::thread_sums<A, T, HostElemCvt>(zr, tr, k, tid, m, se[size_t(tid)], stz[size_t(tid)],
                                           st[size_t(tid)]);
    const stce::Row<A> rs = stce::row_of(m, emulate_block_reduce(se, add_op),
                                         emulate_block_reduce(stz, add_op), emulate_block_reduce(st, add_op));
    r.lse[size_t(row)] = rs.lse;
    r.tsum[size_t(row)] = rs.st;
    row_loss[size_t(row)] = rs.loss;
  }
  for (int tid = 0; tid < stce::kRowThreads; ++tid)
    part[size_t(tid)] = stce::thread_rows_sum(row_loss.data(), n, tid);
  r.loss = T(emulate_block_reduce(part, add_op) / A(n));
  const A scale = HostElemCvt::to<A>(g) / A(n);
  r.dlogits.resize(z.size());
  r.dtargets.resize(z.size());
  for (int64_t i = 0; i < n * k; ++i) {
    const int64_t row = i / k;
    const A zi = HostElemCvt::to<A>(z[size_t(i)]);
    r.dlogits[size_t(i)] = T(stce::grad_logit(zi, HostElemCvt::to<A>(t[size_t(i)]), r.lse[size_t(row)],
                                              r.tsum[size_t(row)], scale));
    r.dtargets[size_t(i)] = T(stce::grad_target(zi, r.lse[size_t(row)], scale));
  }
  return r;
}

}  // namespace cz::testing
