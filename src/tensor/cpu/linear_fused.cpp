// ConvNeXt's MLP with its epilogues fused (Note [Fused epilogues on the CPU]): fc1 + bias + GELU, fc2 + bias
// + layer scale + residual, and their backward passes with the bias (and gamma) gradients taken in the same
// pass over the rows.
#include <algorithm>
#include <vector>

#include "tensor/cpu/blas.h"
#include "tensor/cpu/gelu.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"

// Note [Fused epilogues on the CPU]
// Unfused, a ConvNeXt block's MLP makes the activations cross memory once per pass: fc1 fills its output with
// the bias, then the GEMM adds into it; GELU reads it and writes its own output; fc2 does the same bias fill;
// residual_scale_add reads fc2's output and the residual and writes the block's output. Backward mirrors it
// (channel_scale_backward, fc2's GEMMs and column sums, gelu_backward, fc1's). At atto's first stage a
// (8192 x 160) f32 activation is 5 MiB, more than a core's L2: each pass streams it from L3 or memory.
// Here the rows are split into tiles, spread over the OpenMP threads; each thread runs cz::cpu::gemm on its
// tile (from inside the parallel region the library runs it on the calling thread) and applies the epilogue
// right away, while the tile's output is still in its core's cache: the bias and GELU (forward fc1), the
// bias, gamma and residual (forward fc2); in backward the elementwise part (GELU's derivative, or gamma) with
// the bias and gamma gradients' column sums, then the input gradient's GEMM on the same tile. The weight
// gradient sums over all rows: where the weight is small against the rows (split_rows_for_weight_grad) each
// thread accumulates its own partial over its tiles too, else one library GEMM over all rows follows the
// tiled pass. Partial sums are added in thread order: deterministic for a given thread count. What is saved
// for backward is what the unfused ops saved (fc1's input and pre-activation, fc2's input and output before
// gamma), so the memory plan is unchanged, and on CUDA the same ops compose the existing kernels.
// Tile size (fused_tile_rows): bench_kernels' block_mlp/fused_tileN sweep (one thread, on a loaded 2-core
// Xeon with 2 MiB of L2 per core) was fastest at 256-1024 rows at ConvNeXt-T's first stage and atto's
// (32 rows: +20%), so tiles fill 1 MiB, at least 128 rows. Each tile's GEMM packs the whole weight again, and
// at ConvNeXt-T's last stages (weights of 2.3 and 9 MiB) 37-row tiles made the forward 50% slower than
// unfused; where the weight exceeds the budget each thread takes one tile. What it saves, measured the same
// way (block_mlp fused vs unfused, forward + backward): 8% and 5% at ConvNeXt-T's first two stages, nothing
// at its last two, and atto's stages were 0-4% slower: their activations (at most 5 MiB) stay in this
// machine's large L3, and most of GELU's pass is its arithmetic, which fusing does not remove
// (docs/performance.md).
namespace cz::cpu {
namespace {

using simd::for_blocks;
using simd::load;
using simd::store;

int threads_for(int64_t m, int64_t cols) {
  return m * cols >= kParallelGrain ? cpu_threads() : 1;
}

// Tiles of `tile` rows over [0, m); each thread gets a contiguous run of tiles (schedule static) and calls
// f(thread, r0, r1) for each. Threads with no tile call nothing.
template <class F>
void for_tiles(int64_t m, int64_t tile, int nt, F&& f) {
  const int64_t tiles = (m + tile - 1) / tile;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t b = 0; b < tiles; ++b) f(t, b * tile, std::min(m, (b + 1) * tile));
  }
}

// dst[0, count) = the sum of each thread's partial at `offset` of its `stride` elements of acc, added in
// thread order (deterministic for a given thread count).
template <class T>
void sum_partials(const std::vector<T>& acc, int nt, int64_t stride, int64_t offset, int64_t count, T* dst) {
  std::copy_n(acc.data() + offset, count, dst);
  for (int t = 1; t < nt; ++t) {
    const T* part = acc.data() + size_t(t) * size_t(stride) + size_t(offset);
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) dst[i] += part[i];
  }
}

// Backward common to both ops. `epi(r0, r1, acc)` writes the GEMM's left operand G (m x out) for rows
// [r0, r1) and adds those rows' column sums into the thread's accumulators acc[0..extra*out); then dx's rows
// (G W) and, when split, the thread's partial dW (G^T x) are computed on the same tile. Column sums land in
// sums (extra rows of out).
template <class T, class Epi>
void tiled_backward(int64_t m, int64_t in, int64_t out, const T* x, const T* w, const T* g_op, T* dx, T* dw,
                    int extra, T* const* sums, int64_t tile, Epi&& epi) {
  const int nt = threads_for(m, std::max(in, out));
  const bool split = dw && split_rows_for_weight_grad(m, in, out, nt);
  if (tile <= 0)
    tile = fused_tile_rows(m, (in + out) * int64_t(sizeof(T)), in * out * int64_t(sizeof(T)), nt);
  const int64_t stride = extra * out + (split ? out * in : 0);
  std::vector<T> acc(size_t(nt) * size_t(stride), T(0));
  for_tiles(m, tile, nt, [&](int t, int64_t r0, int64_t r1) {
    T* a = acc.data() + size_t(t) * size_t(stride);
    epi(r0, r1, a);
    const T* gt = g_op + r0 * out;
    if (dx) gemm<T>(false, false, r1 - r0, in, out, T(1), gt, out, w, in, T(0), dx + r0 * in, in);
    if (split)
      gemm<T>(true, false, out, in, r1 - r0, T(1), gt, out, x + r0 * in, in, T(1), a + extra * out, in);
  });
  for (int e = 0; e < extra; ++e)
    if (sums[e]) sum_partials(acc, nt, stride, e * out, out, sums[e]);
  if (!dw) return;
  if (split) {
    sum_partials(acc, nt, stride, extra * out, out * in, dw);
  } else {
    gemm<T>(true, false, out, in, m, T(1), g_op, out, x, in, T(0), dw, in);
  }
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

}  // namespace

int64_t fused_tile_rows(int64_t rows, int64_t row_bytes, int64_t weight_bytes, int threads,
                        int64_t budget_bytes) {
  // Each tile's GEMM packs the whole weight again. A weight larger than the budget (ConvNeXt-T's last two
  // stages: 2.3 and 9 MiB) comes from memory each time, so there every thread takes one tile of its share of
  // the rows: the GEMMs are as big as they can be, and the epilogue runs on rows the thread has just written.
  // Otherwise tiles fill the budget, at least kMinRows (the sweep's smaller tiles lost up to 20%).
  constexpr int64_t kMinRows = 128;
  const int64_t share = (rows + threads - 1) / std::max(1, threads);
  int64_t tile = share;
  if (weight_bytes <= budget_bytes)
    tile = std::min(share, std::max<int64_t>(kMinRows, budget_bytes / std::max<int64_t>(1, row_bytes)));
  tile = std::max<int64_t>(1, std::min(tile, rows));
  // Even out the tiles: as many as the budget asks, rounded up to a multiple of the threads, all of one size
  // (12 tiles of 728 rows with a short last one gave one of 2 threads 14% more rows than the other).
  const int64_t per = std::max<int64_t>(1, threads);
  const int64_t tiles = ((rows + tile - 1) / tile + per - 1) / per * per;
  return std::max<int64_t>(1, (rows + tiles - 1) / tiles);
}

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
    const int nt = threads_for(m, out);
    if (tile <= 0)
      tile = fused_tile_rows(m, (in + 2 * out) * int64_t(sizeof(T)), in * out * int64_t(sizeof(T)), nt);
    for_tiles(m, tile, nt, [&](int, int64_t r0, int64_t r1) {
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
    const int nt = threads_for(m, in);
    if (tile <= 0)
      tile = fused_tile_rows(m, (in + 3 * nout) * int64_t(sizeof(T)), in * nout * int64_t(sizeof(T)), nt);
    for_tiles(m, tile, nt, [&](int, int64_t r0, int64_t r1) {
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
    tiled_backward<T>(m, in, out, x.data<T>(), w.data<T>(), pgb, dx.defined() ? dx.data<T>() : nullptr,
                      dw.defined() ? dw.data<T>() : nullptr, 2, sums, tile,
                      [&](int64_t r0, int64_t r1, T* acc) {
                        T* adb = acc;
                        T* adg = acc + out;
                        for (int64_t r = r0; r < r1; ++r) {
                          const T* gr = pg + r * out;
                          const T* yr = py + r * out;
                          T* o = pgb + r * out;
#pragma omp simd
                          for (int64_t j = 0; j < out; ++j) {
                            const T v = gr[j] * pgam[j];
                            o[j] = v;
                            adb[j] += v;
                            adg[j] += gr[j] * yr[j];
                          }
                        }
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
// gradients. Weight and bias gradients are per-thread partial sums over the thread's tiles, added in thread
// order. At atto's first stage (batch 32) a block's branch moves about 21 MB through memory, forward and
// backward, instead of 53, and keeps 4C + C values per row for backward instead of 4C + 4C + C. Measured
// (bench_train_step --profile, atto 64 px batch 32, 2 threads, a 2-core Xeon): the four blocks' MLP ops went
// from 20.4 to 18.3 ms a step (forward 7.7 -> 6.2, backward 12.7 -> 12.1: backward's GEMMs and its GELU
// recomputation are most of it), the step's peak from 0.14 to 0.12 GiB, ConvNeXt-T's (224 px, batch 16)
// from 2.10 to 1.88 GiB.
namespace {

// Per-thread scratch of at least n elements in slot `slot`: a tile's intermediates, kept between calls.
template <class T>
T* tile_scratch(int slot, size_t n) {
  thread_local std::vector<T> buffers[4];
  std::vector<T>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace

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
    const int nt = threads_for(m, hid);
    if (tile <= 0)
      tile = fused_tile_rows(m, (4 * c + 2 * hid) * int64_t(sizeof(T)), 2 * c * hid * int64_t(sizeof(T)), nt);
    for_tiles(m, tile, nt, [&](int, int64_t r0, int64_t r1) {
      const int64_t n = r1 - r0;
      T* ht = ph ? ph + r0 * hid : tile_scratch<T>(0, size_t(tile * hid));
      T* yt = tile_scratch<T>(1, size_t(tile * hid));
      T* zt = py2 ? py2 + r0 * c : tile_scratch<T>(2, size_t(tile * c));
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
    const int nt = threads_for(m, hid);
    if (tile <= 0)
      tile = fused_tile_rows(m, (4 * c + 4 * hid) * int64_t(sizeof(T)), 2 * c * hid * int64_t(sizeof(T)), nt);
    // Each thread's partial sums: db2 and dgamma (c each), db1 (hid), dw2 (c x hid), dw1 (hid x c).
    const int64_t o_dg = c, o_db1 = 2 * c, o_dw2 = 2 * c + hid, o_dw1 = o_dw2 + c * hid;
    const int64_t stride = o_dw1 + hid * c;
    std::vector<T> acc(size_t(nt) * size_t(stride), T(0));
    for_tiles(m, tile, nt, [&](int t, int64_t r0, int64_t r1) {
      const int64_t n = r1 - r0;
      T* a = acc.data() + size_t(t) * size_t(stride);
      T* gb = tile_scratch<T>(0, size_t(tile * c));
      T* yt = tile_scratch<T>(1, size_t(tile * hid));
      T* dt = tile_scratch<T>(2, size_t(tile * hid));
      T* gh = tile_scratch<T>(3, size_t(tile * hid));
      // gamma: the branch's gradient g * gamma, with fc2's bias and gamma's column sums.
      for (int64_t r = 0; r < n; ++r) {
        const T* gr = pg + (r0 + r) * c;
        const T* zr = py2 + (r0 + r) * c;
        T* o = gb + r * c;
        T* adb2 = a;
        T* adg = a + o_dg;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
          const T v = gr[j] * pgam[j];
          o[j] = v;
          adb2[j] += v;
          adg[j] += gr[j] * zr[j];
        }
      }
      // GELU's output and derivative at h, again.
      for (int64_t r = 0; r < n; ++r) {
        const T* hr = ph + (r0 + r) * hid;
        T* yr = yt + r * hid;
        T* dr = dt + r * hid;
        if constexpr (std::is_same_v<T, double>) {
          for (int64_t j = 0; j < hid; ++j) gelu_math::gelu_and_grad(hr[j], yr[j], dr[j]);
        } else {
          for_blocks<T>(0, hid, [&](auto vt, int64_t j) {
            using V = decltype(vt);
            V yv, dv;
            gelu_math::gelu_and_grad(load<V>(hr + j), yv, dv);
            store(yr + j, yv);
            store(dr + j, dv);
          });
        }
      }
      if (dw2.defined()) gemm<T>(true, false, c, hid, n, T(1), gb, c, yt, hid, T(1), a + o_dw2, hid);
      if (!fc1) return;
      gemm<T>(false, false, n, hid, c, T(1), gb, c, pw2, hid, T(0), gh, hid);
      for (int64_t r = 0; r < n; ++r) {
        T* o = gh + r * hid;
        const T* dr = dt + r * hid;
#pragma omp simd
        for (int64_t j = 0; j < hid; ++j) o[j] *= dr[j];
      }
      add_column_sums(gh, n, hid, a + o_db1);
      if (pdx) gemm<T>(false, false, n, c, hid, T(1), gh, hid, pw1, c, T(0), pdx + r0 * c, c);
      if (dw1.defined()) gemm<T>(true, false, hid, c, n, T(1), gh, hid, px + r0 * c, c, T(1), a + o_dw1, c);
    });
    const auto total = [&](Tensor& dst, int64_t offset, int64_t count) {
      if (dst.defined()) sum_partials(acc, nt, stride, offset, count, dst.data<T>());
    };
    total(db2, 0, c);
    total(dgamma, o_dg, c);
    total(db1, o_db1, hid);
    total(dw2, o_dw2, c * hid);
    total(dw1, o_dw1, hid * c);
  });
}

}  // namespace cz::cpu
