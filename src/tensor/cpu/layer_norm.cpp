// LayerNorm over the channel dimension, forward and backward. One thread per block of rows; a row (C values)
// stays in L1 across the passes over it, so each row is read from memory once per direction.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/cpu/simd.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

using simd::for_blocks;
using simd::hsum;
using simd::kLanes;
using simd::kMaxLanes;
using simd::load;
using simd::store;
using simd::Vec;

// Sums of d and d^2 over a row, d = x - shift. With the shift a value from the row, the one-pass variance
// E[d^2] - E[d]^2 does not cancel catastrophically (its error grows with ((mean - shift) / std)^2, not with
// (mean / std)^2), and one pass with two independent sums beats two dependent passes on short rows.
template <class T>
void shifted_sums(const T* x, int64_t C, T shift, T& s1, T& s2) {
  using V = Vec<T>;
  constexpr int kL = kMaxLanes<T>;
  V a0{}, a1{}, b0{}, b1{};
  int64_t c = 0;
  for (; c + 2 * kL <= C; c += 2 * kL) {
    const V d0 = load<V>(x + c) - shift, d1 = load<V>(x + c + kL) - shift;
    a0 += d0;
    b0 += d0 * d0;
    a1 += d1;
    b1 += d1 * d1;
  }
  T t1 = 0, t2 = 0;
  for_blocks<T>(c, C, [&](auto v, int64_t cc) {
    using W = decltype(v);
    const W d = load<W>(x + cc) - shift;
    if constexpr (kLanes<W> == kL) {
      a0 += d;
      b0 += d * d;
    } else {
      t1 += hsum(d);
      t2 += hsum(d * d);
    }
  });
  s1 = hsum(a0 + a1) + t1;
  s2 = hsum(b0 + b1) + t2;
}

template <class T>
void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y, Tensor& mean,
             Tensor& rstd) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  const T* px = x.data<T>();
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;
  T* py = y.data<T>();
  T* pm = mean.data<T>();
  T* pr = rstd.data<T>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * C;
    T* yr = py + r * C;
    T s1, s2;
    shifted_sums(xr, C, xr[0], s1, s2);
    const T m1 = s1 / T(C), mu = xr[0] + m1;
    const T var = std::max(T(0), s2 / T(C) - m1 * m1);
    const T rs = T(1) / std::sqrt(var + T(eps));
    pm[r] = mu;
    pr[r] = rs;
    for_blocks<T>(0, C, [&](auto v, int64_t c) {
      using V = decltype(v);
      const V xh = (load<V>(xr + c) - mu) * rs;
      if (pw && pb)
        store(yr + c, xh * load<V>(pw + c) + load<V>(pb + c));
      else if (pw)
        store(yr + c, xh * load<V>(pw + c));
      else if (pb)
        store(yr + c, xh + load<V>(pb + c));
      else
        store(yr + c, xh);
    });
  }
}

// With g the output gradient, xh the normalized input and gw = g * weight:
//   dx = rstd * (gw - mean(gw) - xh * mean(gw * xh)),  dweight = sum_rows g * xh,  dbias = sum_rows g.
template <class T>
void backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
              Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  const T* px = x.data<T>();
  const T* pg = gy.data<T>();
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;
  const T* pm = mean.data<T>();
  const T* pr = rstd.data<T>();
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  const bool want_dw = dweight.defined(), want_db = dbias.defined();
  // The parameter gradients by the cut's blocks of rows, added pairwise (Note [Cutting the rows]): dweight in
  // [0, C), dbias in [C, 2C).
  std::vector<T> sums(size_t(2 * C));
  block_sums<T>(rows, 2 * C, vector_sum_cut(rows, C), sums.data(), [&](int64_t r0, int64_t r1, T* acc) {
    T* acc_w = want_dw ? acc : nullptr;
    T* acc_b = want_db ? acc + C : nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = px + r * C;
      const T* gr = pg + r * C;
      const T mu = pm[r], rs = pr[r];
      Vec<T> v1{}, v2{};  // sum(gw), sum(gw * xh): full-width blocks, then the tail
      T s1 = 0, s2 = 0;
      for_blocks<T>(0, C, [&](auto v, int64_t c) {
        using V = decltype(v);
        const V xh = (load<V>(xr + c) - mu) * rs;
        const V g = load<V>(gr + c);
        const V gw = pw ? g * load<V>(pw + c) : g;
        if constexpr (kLanes<V> == kMaxLanes<T>) {
          v1 += gw;
          v2 += gw * xh;
        } else {
          s1 += hsum(gw);
          s2 += hsum(gw * xh);
        }
        if (acc_w) store(acc_w + c, load<V>(acc_w + c) + g * xh);
        if (acc_b) store(acc_b + c, load<V>(acc_b + c) + g);
      });
      s1 += hsum(v1);
      s2 += hsum(v2);
      if (!pdx) continue;
      T* dr = pdx + r * C;
      const T a = rs * s1 / T(C), b = rs * s2 / T(C);
      for_blocks<T>(0, C, [&](auto v, int64_t c) {
        using V = decltype(v);
        const V xh = (load<V>(xr + c) - mu) * rs;
        const V g = load<V>(gr + c);
        const V gw = pw ? g * load<V>(pw + c) : g;
        store(dr + c, rs * gw - a - xh * b);
      });
    }
  });
  if (want_dw) std::copy_n(sums.data(), C, dweight.data<T>());
  if (want_db) std::copy_n(sums.data() + C, C, dbias.data<T>());
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  visit_float(x.dtype(), [&](auto tag) { forward<decltype(tag)>(x, weight, bias, eps, y, mean, rstd); });
}

void layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  visit_float(x.dtype(),
              [&](auto tag) { backward<decltype(tag)>(gy, x, weight, mean, rstd, dx, dweight, dbias); });
}

}  // namespace cz::cpu
