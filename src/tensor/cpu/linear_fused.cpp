// ConvNeXt's MLP with its epilogues fused (Note [Fused epilogues on the CPU]): fc1 + bias + GELU, fc2 + bias
// + layer scale + residual, and their backward passes with the bias (and gamma) gradients taken in the same
// pass over the rows.
#include <algorithm>
#include <vector>

#include "tensor/cpu/gelu.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/cpu/simd.h"

// Note [Fused epilogues on the CPU]
// Unfused, a ConvNeXt block's MLP makes the activations cross memory once per pass: fc1 fills its output with
// the bias, then the GEMM adds into it; GELU reads it and writes its own output; fc2 does the same bias fill;
// residual_scale_add reads fc2's output and the residual and writes the block's output. Backward mirrors it
// (channel_scale_backward, fc2's GEMMs and column sums, gelu_backward, fc1's). At atto's first stage a
// (8192 x 160) f32 activation is 5 MiB, more than a core's L2: each pass streams it from L3 or memory.
// Here the rows are split into tiles (the cut of Note [Cutting the rows]), spread over the OpenMP threads;
// each thread runs cz::cpu::gemm on its tile (from inside the parallel region the library runs it on the
// calling thread) and applies the epilogue right away, while the tile's output is still in its core's cache:
// the bias and GELU (forward fc1), the bias, gamma and residual (forward fc2); in backward the elementwise
// part (GELU's derivative, or gamma) with the bias and gamma gradients' column sums (by the cut's blocks,
// added pairwise), then the input gradient's GEMM on the same tile; the weight gradient is one weight_grad
// over the tiled pass's output. What is saved for backward is what the unfused ops saved (fc1's input and
// pre-activation, fc2's input and output before gamma), so the memory plan is unchanged, and on CUDA the same
// ops compose the existing kernels. Tile size: bench_kernels' block_mlp/fused_tileN sweep (one thread, on a
// loaded 2-core Xeon with 2 MiB of L2 per core) was fastest at 256-1024 rows at ConvNeXt-T's first stage and
// atto's (32 rows: +20%); the fast cut's tiles fill 1 MiB, at least 128 rows, and where the weight exceeds it
// (ConvNeXt-T's last stages: 2.3 and 9 MiB; 37-row tiles made the forward 50% slower, each tile packing the
// weight again) each thread takes one tile of its share. What fusing saves, measured the same way (block_mlp
// fused vs unfused, forward + backward): 8% and 5% at ConvNeXt-T's first two stages, nothing at its last two,
// and atto's stages were 0-4% slower: their activations (at most 5 MiB) stay in this machine's large L3, and
// most of GELU's pass is its arithmetic, which fusing does not remove (docs/performance.md).
namespace cz::cpu {
namespace {

using simd::for_blocks;
using simd::load;
using simd::store;

// The cut (Note [Cutting the rows]) of m rows for GEMMs of n x k whose tiles touch `row_bytes` per row;
// `tile` > 0 forces the tile (tests, the tile sweep).
template <class T>
Cut mlp_cut(int64_t m, int64_t n, int64_t k, int64_t row_bytes, int64_t tile) {
  const int64_t sz = int64_t(sizeof(T));
  return fused_cut(m, n, k, row_bytes * sz, n * k * sz, sz, tile);
}

// Backward common to both ops. `epi(r0, r1, acc)` writes the GEMMs' left operand G (m x out) for rows
// [r0, r1) (within one block of the cut) and adds those rows' column sums into acc[0..extra*out); then dx's
// rows (G W) are computed on the tile. Column sums land in sums (extra rows of out); the weight gradient is
// G^T x over all rows (weight_grad).
template <class T, class Epi>
void tiled_backward(int64_t m, int64_t in, int64_t out, const T* x, const T* w, const T* g_op, T* dx, T* dw,
                    int extra, T* const* sums, int64_t tile, Epi&& epi) {
  const Cut cut = mlp_cut<T>(m, in, out, in + out, tile);
  BlockSums<T> acc(cut, m, extra * out);
  for_tiles(m, cut, [&](int64_t r0, int64_t r1) {
    for_blocks_in(r0, r1, cut.block, [&](int64_t b0, int64_t b1) { epi(b0, b1, acc.at(b0)); });
    if (dx)
      gemm<T>(false, false, r1 - r0, in, out, T(1), g_op + r0 * out, out, w, in, T(0), dx + r0 * in, in);
  });
  int64_t offset[2], count[2];
  for (int e = 0; e < extra; ++e) offset[e] = e * out, count[e] = out;
  acc.finish(sums, offset, count, extra);
  if (dw) weight_grad<T>(g_op, x, m, in, out, dw);
}

// The forward epilogues, on `n` rows of a tile (rows of `cols`, dense). fc1's: h gets the bias added and
// y = gelu(h). fc2's: y gets the bias added, out = residual + gamma * y.
template <class T>
void bias_gelu_rows(T* h, T* y, int64_t n, int64_t cols, const T* bias) {
  for (int64_t r = 0; r < n; ++r) {
    T* hr = h + r * cols;
    T* yr = y + r * cols;
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t j = 0; j < cols; ++j) {
        const T v = hr[j] + (bias ? bias[j] : T(0));
        hr[j] = v;
        yr[j] = gelu_math::gelu(v);
      }
    } else {
      for_blocks<T>(0, cols, [&](auto vt, int64_t j) {
        using V = decltype(vt);
        V v = load<V>(hr + j);
        if (bias) v = v + load<V>(bias + j);
        store(hr + j, v);
        store(yr + j, gelu_math::gelu(v));
      });
    }
  }
}

template <class T>
void bias_scale_residual_rows(T* y, const T* residual, T* out, int64_t n, int64_t cols, const T* bias,
                              const T* gamma) {
  for (int64_t r = 0; r < n; ++r) {
    T* yr = y + r * cols;
    const T* rr = residual + r * cols;
    T* orow = out + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      const T v = yr[j] + (bias ? bias[j] : T(0));
      yr[j] = v;
      orow[j] = rr[j] + v * gamma[j];
    }
  }
}

// One row of a layer-scaled branch's gradient: o = g * gamma, with the bias's and gamma's gradient sums
// db += o and dgamma += g * y (y: the branch's output before gamma).
template <class T>
void scaled_grad_row(const T* g, const T* y, const T* gamma, T* o, T* db, T* dgamma, int64_t c) {
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const T v = g[j] * gamma[j];
    o[j] = v;
    db[j] += v;
    dgamma[j] += g[j] * y[j];
  }
}

// GELU's output (into y) and derivative (into d) at n rows of h, again.
template <class T>
void gelu_and_grad_rows(const T* h, T* y, T* d, int64_t n, int64_t cols) {
  for (int64_t r = 0; r < n; ++r) {
    const T* hr = h + r * cols;
    T* yr = y + r * cols;
    T* dr = d + r * cols;
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t j = 0; j < cols; ++j) gelu_math::gelu_and_grad(hr[j], yr[j], dr[j]);
    } else {
      for_blocks<T>(0, cols, [&](auto vt, int64_t j) {
        using V = decltype(vt);
        V yv, dv;
        gelu_math::gelu_and_grad(load<V>(hr + j), yv, dv);
        store(yr + j, yv);
        store(dr + j, dv);
      });
    }
  }
}

// x *= d elementwise over n rows of `cols`.
template <class T>
void multiply_rows(T* x, const T* d, int64_t n, int64_t cols) {
  for (int64_t r = 0; r < n; ++r) {
    T* o = x + r * cols;
    const T* dr = d + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) o[j] *= dr[j];
  }
}

}  // namespace

void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& h, Tensor& y,
                         int64_t tile) {
  visit_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    T* ph = h.data<T>();
    T* py = y.data<T>();
    for_tiles(m, mlp_cut<T>(m, out, in, in + 2 * out, tile), [&](int64_t r0, int64_t r1) {
      gemm<T>(false, true, r1 - r0, out, in, T(1), px + r0 * in, in, pw, in, T(0), ph + r0 * out, out);
      bias_gelu_rows(ph + r0 * out, py + r0 * out, r1 - r0, out, pb);
    });
  });
}

void linear_gelu_backward(const Tensor& gy, const Tensor& x, const Tensor& h, const Tensor& w, Tensor& gh,
                          Tensor& dx, Tensor& dw, Tensor& db, int64_t tile) {
  visit_float(gy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    const T* pg = gy.data<T>();
    const T* ph = h.data<T>();
    T* pgh = gh.data<T>();
    T* sums[1] = {db.defined() ? db.data<T>() : nullptr};
    tiled_backward<T>(m, in, out, x.data<T>(), w.data<T>(), pgh, dx.defined() ? dx.data<T>() : nullptr,
                      dw.defined() ? dw.data<T>() : nullptr, 1, sums, tile,
                      [&](int64_t r0, int64_t r1, T* acc) {
                        for (int64_t r = r0; r < r1; ++r) {
                          const T* gr = pg + r * out;
                          const T* hr = ph + r * out;
                          T* o = pgh + r * out;
                          if constexpr (std::is_same_v<T, double>) {
                            for (int64_t j = 0; j < out; ++j) {
                              o[j] = gr[j] * gelu_math::gelu_grad(hr[j]);
                              acc[j] += o[j];
                            }
                          } else {
                            for_blocks<T>(0, out, [&](auto vt, int64_t j) {
                              using V = decltype(vt);
                              const V v = load<V>(gr + j) * gelu_math::gelu_grad(load<V>(hr + j));
                              store(o + j, v);
                              store(acc + j, load<V>(acc + j) + v);
                            });
                          }
                        }
                      });
  });
}

void linear_scale_residual_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& gamma,
                                   const Tensor& residual, Tensor& y, Tensor& out, int64_t tile) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), nout = w.size(0);
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    const T* pgam = gamma.data<T>();
    const T* pr = residual.data<T>();
    T* py = y.data<T>();
    T* po = out.data<T>();
    for_tiles(m, mlp_cut<T>(m, nout, in, in + 3 * nout, tile), [&](int64_t r0, int64_t r1) {
      gemm<T>(false, true, r1 - r0, nout, in, T(1), px + r0 * in, in, pw, in, T(0), py + r0 * nout, nout);
      bias_scale_residual_rows(py + r0 * nout, pr + r0 * nout, po + r0 * nout, r1 - r0, nout, pb, pgam);
    });
  });
}

void linear_scale_residual_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& w,
                                    const Tensor& gamma, Tensor& gb, Tensor& dx, Tensor& dw, Tensor& db,
                                    Tensor& dgamma, int64_t tile) {
  visit_float(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    const T* pg = g.data<T>();
    const T* py = y.data<T>();
    const T* pgam = gamma.data<T>();
    T* pgb = gb.data<T>();
    T* sums[2] = {db.defined() ? db.data<T>() : nullptr, dgamma.defined() ? dgamma.data<T>() : nullptr};
    tiled_backward<T>(
        m, in, out, x.data<T>(), w.data<T>(), pgb, dx.defined() ? dx.data<T>() : nullptr,
        dw.defined() ? dw.data<T>() : nullptr, 2, sums, tile, [&](int64_t r0, int64_t r1, T* acc) {
          for (int64_t r = r0; r < r1; ++r)
            scaled_grad_row(pg + r * out, py + r * out, pgam, pgb + r * out, acc, acc + out, out);
        });
  });
}

// Note [The MLP on one tile]: linear_gelu and linear_scale_residual each keep their epilogue in cache, but
// the GELU output between them still crosses memory three times (written by fc1's pass, read by fc2's, read
// again by fc2's weight gradient), and backward reads the pre-activation and writes GELU's input gradient in
// a second full pass. Where the weights are small (mlp_as_one_op: both fit a thread's accumulators) the
// whole branch runs on one row tile instead: fc1, bias, GELU, fc2, bias, gamma and the residual in forward,
// with only the pre-activation h and fc2's output before gamma written out for backward; in backward, per
// tile, gamma's pass and its column sums, GELU's output and derivative recomputed from h, fc2's weight
// gradient and input gradient, GELU's input gradient with fc1's bias sums, and fc1's input and weight
// gradients. Weight gradients are partial sums over blocks of whole tiles (each block's tiles in order on one
// thread), bias and gamma gradients over the cut's blocks, both added pairwise (Note [Cutting the rows]). At
// atto's first stage (batch 32) a block's branch moves about 21 MB through memory, forward and
// backward, instead of 53, and keeps 4C + C values per row for backward instead of 4C + 4C + C. Measured
// (bench_train_step --profile, atto 64 px batch 32, 2 threads, a 2-core Xeon): the four blocks' MLP ops went
// from 20.4 to 18.3 ms a step (forward 7.7 -> 6.2, backward 12.7 -> 12.1: backward's GEMMs and its GELU
// recomputation are most of it), the step's peak from 0.14 to 0.12 GiB, ConvNeXt-T's (224 px, batch 16)
// from 2.10 to 1.88 GiB.
void mlp_scale_residual_forward(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                const Tensor& b2, const Tensor& gamma, const Tensor& residual, Tensor& h,
                                Tensor& y2, Tensor& out, int64_t tile) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), c = x.size(1), hid = w1.size(0);
    const T* px = x.data<T>();
    const T* pw1 = w1.data<T>();
    const T* pw2 = w2.data<T>();
    const T* pb1 = b1.defined() ? b1.data<T>() : nullptr;
    const T* pb2 = b2.defined() ? b2.data<T>() : nullptr;
    const T* pgam = gamma.data<T>();
    const T* pr = residual.data<T>();
    T* ph = h.defined() ? h.data<T>() : nullptr;
    T* py2 = y2.defined() ? y2.data<T>() : nullptr;
    T* po = out.data<T>();
    const Cut cut = mlp_cut<T>(m, hid, c, 4 * c + 2 * hid, tile);
    for_tiles(m, cut, [&](int64_t r0, int64_t r1) {
      const int64_t n = r1 - r0;
      T* ht = ph ? ph + r0 * hid : tile_scratch<T>(0, size_t(cut.tile * hid));
      T* yt = tile_scratch<T>(1, size_t(cut.tile * hid));
      T* zt = py2 ? py2 + r0 * c : tile_scratch<T>(2, size_t(cut.tile * c));
      gemm<T>(false, true, n, hid, c, T(1), px + r0 * c, c, pw1, c, T(0), ht, hid);
      bias_gelu_rows(ht, yt, n, hid, pb1);
      gemm<T>(false, true, n, c, hid, T(1), yt, hid, pw2, hid, T(0), zt, c);
      bias_scale_residual_rows(zt, pr + r0 * c, po + r0 * c, n, c, pb2, pgam);
    });
  });
}

void mlp_scale_residual_backward(const Tensor& g, const Tensor& x, const Tensor& h, const Tensor& y2,
                                 const Tensor& w1, const Tensor& w2, const Tensor& gamma, Tensor& dx,
                                 Tensor& dw1, Tensor& db1, Tensor& dw2, Tensor& db2, Tensor& dgamma,
                                 int64_t tile) {
  visit_float(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), c = x.size(1), hid = w1.size(0);
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    const T* ph = h.data<T>();
    const T* py2 = y2.data<T>();
    const T* pw1 = w1.data<T>();
    const T* pw2 = w2.data<T>();
    const T* pgam = gamma.data<T>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    // fc1's gradients need GELU's input gradient; fc2's weight gradient the recomputed GELU output.
    const bool fc1 = pdx || dw1.defined() || db1.defined();
    const Cut cut = mlp_cut<T>(m, hid, c, 4 * c + 4 * hid, tile);
    // The weight gradients by blocks of whole tiles, each block's tiles in order on one thread, a block's
    // partial holding dw2 (c x hid), then dw1 (hid x c); the column sums by the cut's blocks: db2 and dgamma
    // (c each), then db1 (hid). Both added pairwise (Note [Cutting the rows]).
    const int64_t wvals = 2 * c * hid, o_dw1 = c * hid, o_dg = c, o_db1 = 2 * c;
    const int64_t block = grad_block_of_tiles(cut, wvals);
    const int64_t blocks = std::max<int64_t>(1, (m + block - 1) / block);
    std::vector<T> wparts(dw1.defined() || dw2.defined() ? size_t(blocks * wvals) : 0);
    BlockSums<T> sums(cut, m, 2 * c + hid);
    const int64_t t = cut.tile;
    for_each_item(
        blocks,
        [&](int64_t bi) {
          T* wp = wparts.empty() ? nullptr : wparts.data() + bi * wvals;
          for (int64_t r0 = bi * block; r0 < std::min(m, (bi + 1) * block); r0 += t) {
            const int64_t n = std::min(t, m - r0);
            const T beta = r0 == bi * block ? T(0) : T(1);  // the block's first tile starts its partial
            T* gb = tile_scratch<T>(0, size_t(t * c));
            T* yt = tile_scratch<T>(1, size_t(t * hid));
            T* dt = tile_scratch<T>(2, size_t(t * hid));
            T* gh = tile_scratch<T>(3, size_t(t * hid));
            // gamma: the branch's gradient g * gamma, with fc2's bias and gamma's column sums.
            for (int64_t r = 0; r < n; ++r) {
              T* adb2 = sums.at(r0 + r);
              scaled_grad_row(pg + (r0 + r) * c, py2 + (r0 + r) * c, pgam, gb + r * c, adb2, adb2 + o_dg, c);
            }
            gelu_and_grad_rows(ph + r0 * hid, yt, dt, n, hid);
            if (dw2.defined()) gemm<T>(true, false, c, hid, n, T(1), gb, c, yt, hid, beta, wp, hid);
            if (!fc1) continue;
            gemm<T>(false, false, n, hid, c, T(1), gb, c, pw2, hid, T(0), gh, hid);
            multiply_rows(gh, dt, n, hid);
            for_blocks_in(r0, r0 + n, cut.block, [&](int64_t b0, int64_t b1) {
              add_column_sums(gh + (b0 - r0) * hid, b1 - b0, hid, sums.at(b0) + o_db1);
            });
            if (pdx) gemm<T>(false, false, n, c, hid, T(1), gh, hid, pw1, c, T(0), pdx + r0 * c, c);
            if (dw1.defined())
              gemm<T>(true, false, hid, c, n, T(1), gh, hid, px + r0 * c, c, beta, wp + o_dw1, c);
          }
        },
        cut.library_threads);
    T* dst[3] = {db2.defined() ? db2.data<T>() : nullptr, dgamma.defined() ? dgamma.data<T>() : nullptr,
                 db1.defined() ? db1.data<T>() : nullptr};
    const int64_t offset[3] = {0, o_dg, o_db1}, count[3] = {c, c, hid};
    sums.finish(dst, offset, count, 3);
    if (wparts.empty()) return;
    pairwise_sum(wparts.data(), blocks, wvals, wvals, wparts.data());
    if (dw2.defined()) std::copy_n(wparts.data(), c * hid, dw2.data<T>());
    if (dw1.defined()) std::copy_n(wparts.data() + o_dw1, hid * c, dw1.data<T>());
  });
}

}  // namespace cz::cpu
