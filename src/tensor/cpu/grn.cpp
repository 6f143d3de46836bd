// Global Response Normalization of NHWC images, forward and backward. The sums over an image's pixels and
// the parameter gradients' sums over the batch's rows go by blocks added pairwise (Note [Cutting the rows]);
// the factors per (image, channel) are computed once, and the elementwise passes read them.
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

// out[n * width + j] = the sum over image n's rows (N images of HW rows) of f's values: an image's rows cut
// by vector_sum_cut(HW, width), each block summed in row order by one thread, the blocks added pairwise. An
// image's sum follows its own rows and the cut alone, however the batch is split or threaded. f(n, r0, r1,
// acc) adds image n's rows [r0, r1) into acc (width values, zeroed).
template <class T, class F>
void image_sums(int64_t N, int64_t HW, int64_t width, T* out, F&& f) {
  const Cut cut = vector_sum_cut(HW, width);
  const int64_t blocks = cut.blocks(HW), items = blocks * N;
  // Block-major (block b of every image, then block b + 1), so one pairwise_sum adds every image's blocks.
  std::vector<T> parts(size_t(items * width), T(0));
  const int64_t per = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, cut.block * width));
  const auto run = [&](int64_t i) {
    for (int64_t item = i * per; item < std::min(items, (i + 1) * per); ++item) {
      const int64_t b = item / N, n = item % N;
      f(n, b * cut.block, std::min(HW, (b + 1) * cut.block), parts.data() + item * width);
    }
  };
  const int64_t runs = (items + per - 1) / per;
  if (runs == 1 || N * HW * width < kParallelGrain)
    for (int64_t i = 0; i < runs; ++i) run(i);
  else
    for_each_item(runs, run);
  pairwise_sum(parts.data(), blocks, N * width, N * width, out);
}

// The sum of v[0, n) in full-width lanes, then the tail.
template <class T>
T sum_of(const T* v, int64_t n) {
  Vec<T> acc{};
  T tail = 0;
  for_blocks<T>(0, n, [&](auto w, int64_t c) {
    using V = decltype(w);
    if constexpr (kLanes<V> == kMaxLanes<T>)
      acc += load<V>(v + c);
    else
      tail += hsum(load<V>(v + c));
  });
  return hsum(acc) + tail;
}

// nx[n, c] = gx[n, c] / d[n].
template <class T>
std::vector<T> normalized(const T* gx, const T* d, int64_t N, int64_t C) {
  std::vector<T> nx(size_t(N * C));
  for (int64_t i = 0; i < N * C; ++i) nx[size_t(i)] = gx[i] / d[i / C];
  return nx;
}

template <class T>
void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& gx,
             Tensor& d) {
  const int64_t N = x.size(0), HW = x.size(1) * x.size(2), C = x.size(3);
  const T* px = x.data<T>();
  const T* pgam = gamma.data<T>();
  const T* pbet = beta.data<T>();
  T* py = y.data<T>();
  T* pgx = gx.data<T>();
  T* pd = d.data<T>();
  image_sums<T>(N, HW, C, pgx, [&](int64_t n, int64_t r0, int64_t r1, T* acc) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = px + (n * HW + r) * C;
      for_blocks<T>(0, C, [&](auto v, int64_t c) {
        using V = decltype(v);
        const V xv = load<V>(xr + c);
        store(acc + c, load<V>(acc + c) + xv * xv);
      });
    }
  });
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* g = pgx + n * C;
    for (int64_t c = 0; c < C; ++c) g[c] = std::sqrt(g[c]);
    pd[n] = sum_of(g, C) / T(C) + T(eps);
  }
  const std::vector<T> nx = normalized(pgx, pd, N, C);
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelGrain)
  for (int64_t r = 0; r < N * HW; ++r) {
    const T* xr = px + r * C;
    const T* nr = nx.data() + r / HW * C;
    T* yr = py + r * C;
    for_blocks<T>(0, C, [&](auto v, int64_t c) {
      using V = decltype(v);
      const V xv = load<V>(xr + c);
      store(yr + c, xv + (load<V>(pbet + c) + load<V>(pgam + c) * (xv * load<V>(nr + c))));
    });
  }
}

// With g the output gradient, per image n and channel c (p its pixels, D = d[n], G = gx[n, c]):
//   a = gamma * sum_p g x,  dG = (a - mean_c(a * nx)) / D,  k = dG / G (0 where G = 0, as torch's norm),
//   dx = g (1 + gamma nx) + x k,  dgamma = sum_rows g (x nx),  dbeta = sum_rows g.
template <class T>
void backward(const Tensor& gy, const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d,
              Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t N = x.size(0), HW = x.size(1) * x.size(2), C = x.size(3), rows = N * HW;
  const T* px = x.data<T>();
  const T* pg = gy.data<T>();
  const T* pgam = gamma.data<T>();
  const T* pgx = gx.data<T>();
  const T* pd = d.data<T>();
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  const std::vector<T> nx = normalized(pgx, pd, N, C);
  std::vector<T> scale, k;  // dx = g * scale + x * k, per (image, channel)
  if (pdx) {
    k.resize(size_t(N * C));
    image_sums<T>(N, HW, C, k.data(), [&](int64_t n, int64_t r0, int64_t r1, T* acc) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + (n * HW + r) * C;
        const T* gr = pg + (n * HW + r) * C;
        for_blocks<T>(0, C, [&](auto v, int64_t c) {
          using V = decltype(v);
          store(acc + c, load<V>(acc + c) + load<V>(gr + c) * load<V>(xr + c));
        });
      }
    });
    scale.resize(size_t(N * C));
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      T* kr = k.data() + n * C;
      T* sr = scale.data() + n * C;
      const T* nr = nx.data() + n * C;
      const T* gr = pgx + n * C;
      for (int64_t c = 0; c < C; ++c) {
        kr[c] *= pgam[c];       // a
        sr[c] = kr[c] * nr[c];  // a * nx, for its mean
      }
      const T m = sum_of(sr, C) / T(C), dn = pd[n];
      for (int64_t c = 0; c < C; ++c) {
        kr[c] = gr[c] > T(0) ? (kr[c] - m) / (dn * gr[c]) : T(0);
        sr[c] = T(1) + pgam[c] * nr[c];
      }
    }
  }
  const bool want_dg = dgamma.defined(), want_db = dbeta.defined();
  // The parameter gradients by the cut's blocks of the batch's rows, added pairwise, as LayerNorm's: dgamma
  // in [0, C), dbeta in [C, 2C).
  std::vector<T> sums(size_t(2 * C));
  block_sums<T>(rows, 2 * C, vector_sum_cut(rows, C), sums.data(), [&](int64_t r0, int64_t r1, T* acc) {
    T* acc_g = want_dg ? acc : nullptr;
    T* acc_b = want_db ? acc + C : nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / HW;
      const T* xr = px + r * C;
      const T* gr = pg + r * C;
      const T* nr = nx.data() + n * C;
      const T* sr = pdx ? scale.data() + n * C : nullptr;
      const T* kr = pdx ? k.data() + n * C : nullptr;
      T* dr = pdx ? pdx + r * C : nullptr;
      for_blocks<T>(0, C, [&](auto v, int64_t c) {
        using V = decltype(v);
        const V g = load<V>(gr + c), xv = load<V>(xr + c);
        if (acc_g) store(acc_g + c, load<V>(acc_g + c) + g * (xv * load<V>(nr + c)));
        if (acc_b) store(acc_b + c, load<V>(acc_b + c) + g);
        if (dr) store(dr + c, g * load<V>(sr + c) + xv * load<V>(kr + c));
      });
    }
  });
  if (want_dg) std::copy_n(sums.data(), C, dgamma.data<T>());
  if (want_db) std::copy_n(sums.data() + C, C, dbeta.data<T>());
}

}  // namespace

void grn_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& gx,
                 Tensor& d) {
  visit_float(x.dtype(), [&](auto tag) { forward<decltype(tag)>(x, gamma, beta, eps, y, gx, d); });
}

void grn_backward(const Tensor& gy, const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d,
                  Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  visit_float(x.dtype(), [&](auto tag) { backward<decltype(tag)>(gy, x, gamma, gx, d, dx, dgamma, dbeta); });
}

}  // namespace cz::cpu
