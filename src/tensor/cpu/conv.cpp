// Convolutions on NHWC data, forward and backward: depthwise k x k (direct, vectorized over channels) and the
// patchify convolution (kernel = stride, a GEMM over non-overlapping patches).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/cpu/simd.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

using simd::Elem;
using simd::for_blocks;
using simd::kLanes;
using simd::kMaxLanes;
using simd::load;
using simd::store;

// This thread's share [r0, r1) of `rows`, inside an omp parallel region.
void thread_rows(int64_t rows, int64_t& r0, int64_t& r1) {
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  r0 = rows * t / nt;
  r1 = rows * (t + 1) / nt;
}

// Note [Depthwise row ring]: the depthwise kernels walk a thread's output rows in order, keeping the input
// rows they need in a ring: input row `hin` of the current image sits in slot hin % k, zero-padded by p
// columns on each side, and stored per channel block (one vector of V lanes per pixel), so that one block's
// taps are contiguous vectors. Every output row then runs the same unconditional loop over kernel taps (the
// zero columns are the padding); consecutive output rows share k - 1 ring rows, so each input row is copied
// once, reading memory sequentially (a whole NHWC row at a time), and the ring (k (W + 2p) C values) stays
// in L1/L2.
template <class T>
class RowRing {
 public:
  RowRing(T* buf, int k, int64_t W, int64_t C)
      : buf_(buf), k_(k), p_(k / 2), W_(W), Wp_(W + 2 * (k / 2)), C_(C) {
    for_blocks<T>(0, C, [&](auto v, int64_t c) {
      constexpr int kL = kLanes<decltype(v)>;
      for (int s = 0; s < k; ++s) {
        T* slot = buf_ + c * k_ * Wp_ + s * Wp_ * kL;
        std::fill_n(slot, p_ * kL, T(0));
        std::fill_n(slot + (p_ + W_) * kL, p_ * kL, T(0));
      }
    });
  }
  // Makes input rows [lo, hi) of image `n` present; `img` points at the image.
  void advance(const T* img, int64_t n, int64_t lo, int64_t hi) {
    if (n != n_) {
      n_ = n;
      hi_ = lo;
    }
    for (int64_t hin = std::max(hi_, lo); hin < hi; ++hin) {
      const T* src = img + hin * W_ * C_;
      const int64_t slot = (hin % k_) * Wp_;
      for (int64_t u = 0; u < W_; ++u)
        for_blocks<T>(0, C_, [&](auto v, int64_t c) {
          using V = decltype(v);
          constexpr int kL = kLanes<V>;
          store(buf_ + c * k_ * Wp_ + (slot + p_ + u) * kL, load<V>(src + u * C_ + c));
        });
    }
    hi_ = std::max(hi_, hi);
  }
  // The ring slot of input row hin.
  int slot(int64_t hin) const { return int(hin % k_); }
  // Slot `s` of the block starting at channel c (kL lanes), from padded column 0 (input column -p).
  template <int kL>
  const T* row(int64_t c, int s) const {
    return buf_ + c * k_ * Wp_ + s * Wp_ * kL;
  }

 private:
  T* buf_;
  int k_, p_;
  int64_t W_, Wp_, C_;
  int64_t n_ = -1, hi_ = 0;
};

// One output row of channels [c, c + lanes): out = bias + depthwise conv with taps wt (k, k, C), over the
// valid kernel rows [i0, i1), kernel row i0 reading ring slot slot0. K: compile-time k (0: runtime); R:
// outputs along W per register block (R <= W). With K known the loads of a ring row are shared across taps (R
// + K - 1 loads feed R * K FMAs).
template <int K, int R, class V>
void dw_forward_row(const RowRing<Elem<V>>& ring, int slot0, int i0, int i1, const Elem<V>* wt,
                    const Elem<V>* bias, Elem<V>* orow, int64_t W, int64_t C, int k_runtime, int64_t c) {
  using T = Elem<V>;
  constexpr int kL = kLanes<V>;
  const int k = K ? K : k_runtime;
  const V b0 = bias ? load<V>(bias + c) : V{};
  for (int64_t w0 = 0; w0 < W; w0 += R) {
    const int64_t ws = std::min(w0, W - R);  // the last block may overlap the previous one
    V acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = b0;
    for (int i = i0, s = slot0; i < i1; ++i, s = s + 1 == k ? 0 : s + 1) {
      const T* src = ring.template row<kL>(c, s) + ws * kL;
      const T* wr = wt + int64_t(i) * k * C + c;
#pragma GCC unroll 8
      for (int j = 0; j < k; ++j) {
        const V wv = load<V>(wr + j * C);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r] += load<V>(src + (r + j) * kL) * wv;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store(orow + (ws + r) * C + c, acc[r]);
  }
}

// One row's contribution to the partial weight and bias gradients of channels [c, c + lanes):
//   dw[i][j] += sum_w gy[row][w] * x[row + i - p][w + j - p],  db += sum_w gy[row][w].
template <int K, int R, class V>
void dw_weight_row(const RowRing<Elem<V>>& ring, int slot0, int i0, int i1, const Elem<V>* grow, Elem<V>* dw,
                   Elem<V>* db, int64_t W, int64_t C, int k_runtime, int64_t c) {
  using T = Elem<V>;
  constexpr int kL = kLanes<V>;
  const int k = K ? K : k_runtime;
  grow += c;
  if (db) {
    V s{};
    for (int64_t w = 0; w < W; ++w) s += load<V>(grow + w * C);
    store(db + c, load<V>(db + c) + s);
  }
  for (int i = i0, s = slot0; i < i1; ++i, s = s + 1 == k ? 0 : s + 1) {
    const T* src = ring.template row<kL>(c, s);
    T* dwr = dw + int64_t(i) * k * C + c;
    if constexpr (K == 0) {
      for (int j = 0; j < k; ++j) {
        V acc{};
        for (int64_t w = 0; w < W; ++w) acc += load<V>(grow + w * C) * load<V>(src + (w + j) * kL);
        store(dwr + j * C, load<V>(dwr + j * C) + acc);
      }
    } else {
      V acc[K];
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) acc[j] = V{};
      int64_t w = 0;
      for (; w + R <= W; w += R) {
        V g[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) g[r] = load<V>(grow + (w + r) * C);
#pragma GCC unroll 8
        for (int j = 0; j < K; ++j)
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[j] += g[r] * load<V>(src + (w + r + j) * kL);
      }
      for (; w < W; ++w) {
        const V g = load<V>(grow + w * C);
#pragma GCC unroll 8
        for (int j = 0; j < K; ++j) acc[j] += g * load<V>(src + (w + j) * kL);
      }
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) store(dwr + j * C, load<V>(dwr + j * C) + acc[j]);
    }
  }
}

template <int N>
using IntC = std::integral_constant<int, N>;

// f(IntC<K>) for the kernel sizes with unrolled code paths, f(IntC<0>) for the others.
template <class F>
void dispatch_k(int k, F&& f) {
  switch (k) {
    case 3:
      return f(IntC<3>{});
    case 5:
      return f(IntC<5>{});
    case 7:
      return f(IntC<7>{});
    default:
      return f(IntC<0>{});
  }
}

// f(IntC<R>) with the widest register block R <= W.
template <class F>
void dispatch_r(int64_t W, F&& f) {
  if (W >= 8) return f(IntC<8>{});
  if (W >= 4) return f(IntC<4>{});
  if (W >= 2) return f(IntC<2>{});
  return f(IntC<1>{});
}

// Valid kernel rows [i0, i1) and input rows [lo, hi) for output row h.
struct RowWindow {
  int64_t lo, hi;
  int i0, i1;
  RowWindow(int64_t h, int64_t H, int p)
      : lo(std::max<int64_t>(0, h - p)),
        hi(std::min<int64_t>(H, h + p + 1)),
        i0(int(lo - (h - p))),
        i1(int(hi - (h - p))) {}
};

// A thread's RowRing with the buffer it fills (k rows of W + 2 * (k / 2) padded columns of C channels).
template <class T>
struct ThreadRowRing {
  std::vector<T> buf;
  RowRing<T> ring;
  ThreadRowRing(int k, int64_t W, int64_t C)
      : buf(size_t(k) * size_t(W + 2 * (k / 2)) * size_t(C)), ring(buf.data(), k, W, C) {}

  // Output row `row` of the N*H rows of `images` (N, H, W, C): its kernel window, whose input rows this makes
  // present in the ring; slot0 is the ring slot of the window's first row.
  RowWindow enter_row(const T* images, int64_t row, int64_t H, int64_t W, int64_t C, int k, int& slot0) {
    const int64_t n = row / H, h = row % H;
    const RowWindow win(h, H, k / 2);
    ring.advance(images + n * H * W * C, n, win.lo, win.hi);
    slot0 = ring.slot(win.lo);
    return win;
  }
};

template <class T>
void dw_forward(const T* in, const T* wt, const T* bias, T* out, int64_t N, int64_t H, int64_t W, int64_t C,
                int k) {
  const int nt = N * H * W * C * k >= kParallelGrain ? cpu_threads() : 1;
#pragma omp parallel num_threads(nt)
  {
    int64_t r0, r1;
    thread_rows(N * H, r0, r1);
    ThreadRowRing<T> local(k, W, C);
    for (int64_t row = r0; row < r1; ++row) {
      int slot0 = 0;
      const RowWindow win = local.enter_row(in, row, H, W, C, k, slot0);
      for_blocks<T>(0, C, [&](auto v, int64_t c) {
        dispatch_k(k, [&](auto K) {
          dispatch_r(W, [&](auto R) {
            dw_forward_row<decltype(K)::value, decltype(R)::value, decltype(v)>(
                local.ring, slot0, win.i0, win.i1, wt, bias, out + row * W * C, W, C, k, c);
          });
        });
      });
    }
  }
}

template <class T>
void dw_weight_grad(const T* x, const T* gy, T* dw, T* db, int64_t N, int64_t H, int64_t W, int64_t C,
                    int k) {
  const int nt = N * H * W * C * k >= kParallelGrain ? cpu_threads() : 1;
  const int64_t per_block = int64_t(k) * k * C + C;  // dw, then db
  // The partial sums per block of the cut's image rows (Note [Cutting the rows]), added pairwise.
  const int64_t rows = N * H, block = vector_sum_cut(rows, W * C * k).block;
  const int64_t blocks = std::max<int64_t>(1, (rows + block - 1) / block);
  std::vector<T> partial(size_t(blocks * per_block), T(0));
#pragma omp parallel num_threads(nt)
  {
    ThreadRowRing<T> local(k, W, C);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      T* acc = partial.data() + blk * per_block;
      T* acc_db = db ? acc + per_block - C : nullptr;
      for (int64_t row = blk * block; row < std::min(rows, (blk + 1) * block); ++row) {
        int slot0 = 0;
        const RowWindow win = local.enter_row(x, row, H, W, C, k, slot0);
        for_blocks<T>(0, C, [&](auto v, int64_t c) {
          dispatch_k(k, [&](auto K) {
            constexpr int kR = 4;
            dw_weight_row<decltype(K)::value, kR, decltype(v)>(local.ring, slot0, win.i0, win.i1,
                                                               gy + row * W * C, acc, acc_db, W, C, k, c);
          });
        });
      }
    }
  }
  pairwise_sum(partial.data(), blocks, per_block, per_block, partial.data());
  if (dw) std::copy_n(partial.data(), per_block - C, dw);
  if (db) std::copy_n(partial.data() + per_block - C, C, db);
}

// Patches of x as rows of a matrix: P[(n, ho, wo)][(i, j, ci)] = x[n, ho k + i, wo k + j, ci]. For each
// (patch, i) that is one contiguous run of k * Cin values, since the patches do not overlap.
template <class T>
void im2col(const T* x, T* P, int64_t N, int64_t H, int64_t W, int64_t Cin, int64_t k) {
  const int64_t Ho = H / k, Wo = W / k, run = k * Cin;
#pragma omp parallel for schedule(static) if (N * Ho * Wo * k * run >= kParallelGrain)
  for (int64_t nh = 0; nh < N * Ho; ++nh) {
    const int64_t n = nh / Ho, ho = nh % Ho;
    for (int64_t wo = 0; wo < Wo; ++wo)
      for (int64_t i = 0; i < k; ++i)
        std::memcpy(P + ((nh * Wo + wo) * k + i) * run, x + ((n * H + ho * k + i) * W + wo * k) * Cin,
                    size_t(run) * sizeof(T));
  }
}

// The inverse scatter; the rows and columns the floor dropped get zero gradient.
template <class T>
void col2im(const T* P, T* x, int64_t N, int64_t H, int64_t W, int64_t Cin, int64_t k) {
  const int64_t Ho = H / k, Wo = W / k, run = k * Cin;
  if (Ho * k != H || Wo * k != W) std::fill_n(x, N * H * W * Cin, T(0));
#pragma omp parallel for schedule(static) if (N * Ho * Wo * k * run >= kParallelGrain)
  for (int64_t nh = 0; nh < N * Ho; ++nh) {
    const int64_t n = nh / Ho, ho = nh % Ho;
    for (int64_t wo = 0; wo < Wo; ++wo)
      for (int64_t i = 0; i < k; ++i)
        std::memcpy(x + ((n * H + ho * k + i) * W + wo * k) * Cin, P + ((nh * Wo + wo) * k + i) * run,
                    size_t(run) * sizeof(T));
  }
}

}  // namespace

void depthwise_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dw_forward<T>(x.data<T>(), w.data<T>(), bias.defined() ? bias.data<T>() : nullptr, y.data<T>(), x.size(0),
                  x.size(1), x.size(2), x.size(3), int(w.size(0)));
  });
}

void depthwise_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                               Tensor& dbias) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    const int k = int(w.size(0));
    if (dx.defined()) {
      // dx is the convolution of gy with the kernel flipped in both spatial directions.
      std::vector<T> flipped(size_t(k * k * C));
      const T* pw = w.data<T>();
      for (int i = 0; i < k; ++i)
        for (int j = 0; j < k; ++j)
          std::copy_n(pw + ((k - 1 - i) * k + (k - 1 - j)) * C, C, flipped.data() + (i * k + j) * C);
      dw_forward<T>(gy.data<T>(), flipped.data(), nullptr, dx.data<T>(), N, H, W, C, k);
    }
    if (dw.defined())
      dw_weight_grad<T>(x.data<T>(), gy.data<T>(), dw.data<T>(), dbias.defined() ? dbias.data<T>() : nullptr,
                        N, H, W, C, k);
    else if (dbias.defined())
      column_sums<T>(gy.data<T>(), N * H * W, C, dbias.data<T>());
  });
}

void patchify_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), Cin = x.size(3);
    const int64_t Cout = w.size(0), k = w.size(1), M = y.numel() / Cout, KK = k * k * Cin;
    Tensor patches = empty({M, KK}, x.dtype());
    T* P = patches.data<T>();
    im2col<T>(x.data<T>(), P, N, H, W, Cin, k);
    T* py = y.data<T>();
    T beta = T(0);
    if (bias.defined()) {
      const T* pb = bias.data<T>();
#pragma omp parallel for schedule(static) if (M * Cout >= kParallelGrain)
      for (int64_t r = 0; r < M; ++r) std::copy_n(pb, Cout, py + r * Cout);
      beta = T(1);
    }
    gemm_rows<T>(true, M, Cout, KK, T(1), P, KK, w.data<T>(), KK, beta, py, Cout);
  });
}

void patchify_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                              Tensor& dbias) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), Cin = x.size(3);
    const int64_t Cout = w.size(0), k = w.size(1), M = gy.numel() / Cout, KK = k * k * Cin;
    const T* pg = gy.data<T>();
    T* db = dbias.defined() ? dbias.data<T>() : nullptr;
    if (dx.defined() || dw.defined()) {
      Tensor patches = empty({M, KK}, x.dtype());
      T* P = patches.data<T>();
      if (dw.defined()) {
        im2col<T>(x.data<T>(), P, N, H, W, Cin, k);
        weight_and_bias_grad<T>(pg, P, M, KK, Cout, dw.data<T>(), db);
        db = nullptr;  // taken with the weight gradient
      }
      if (dx.defined()) {
        gemm_rows<T>(false, M, KK, Cout, T(1), pg, Cout, w.data<T>(), KK, T(0), P, KK);
        col2im<T>(P, dx.data<T>(), N, H, W, Cin, k);
      }
    }
    if (db) column_sums<T>(pg, M, Cout, db);
  });
}

}  // namespace cz::cpu
