// How a CPU kernel cuts the rows of a batch (Note [Cutting the rows]): tiles for the GEMMs whose rows are the
// batch's, blocks for the sums over rows, added pairwise; cut by the thread count (fast, the default), by the
// shape alone (the same bits at any thread count) or into pieces of N rows (N ranks equal one rank).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cpu/blas.h"
#include "tensor/parallel.h"

// Note [Cutting the rows]
// Every CPU kernel whose work is a batch's rows cuts them in two ways: tiles, each one GEMM call of a library
// (forward passes, input gradients; the fused MLP's epilogue runs on the tile while it is in cache), and
// blocks, each summed in row order by one thread, for the sums over rows (weight, bias, gamma, LayerNorm and
// depthwise filter gradients); the blocks' partial sums are added pairwise, halving the sequence of blocks
// (pairwise_sum). What a row and a sum come to depends on the cut alone: a library's result for a row
// follows the shape of the call it is in (oneDNN 2.6 picks its kernels, its copy-based or no-copy path and
// its K split by M, N, K and the threads), and a sum follows its blocks. Three cuts (RowSplit,
// --cpu-row-split):
//  - fast (the default): by the thread count, as fast as the libraries allow: a GEMM whose rows fit one call
//    is one call the library threads itself, the fused MLP takes tiles of a cache budget, a few per thread,
//    and a sum has one block per thread. A run repeats bit for bit at the same thread count and batch.
//  - fixed: by the shape alone (row_tile, sum_block_rows, weight_grad_group, kVectorSumRows): every call runs
//    on one thread and every sum has the same blocks, so a run gives the same bits at any thread count
//    (a run resumed on a machine with another core count continues bit for bit). N ranks match one rank to
//    rounding: a rank's share of a late stage can be smaller than a tile or a block, and then its rows go
//    through calls of another shape.
//  - rows:N: tiles and blocks of N rows. Where N divides every rank's share of every layer (the rows of a
//    micro-batch at the last stage: micro-batch x pixels per image there), 2 ranks compute what one rank
//    computes bit for bit: each rank's rows go through the very calls and blocks they go through in the
//    one-rank run, and the ranks' sum is the root of the one-rank run's pairwise tree (4 ranks: MPI adds
//    their four sums in its own order). Small N is slow: it is for checking and for runs that must not depend
//    on the world size.
// Measured (docs/training.md "The same answer at every thread count and world size"): the cuts' step times,
// and what separates runs under each.
namespace cz::cpu {

enum class RowSplitMode { fast, fixed, rows };
struct RowSplit {
  RowSplitMode mode = RowSplitMode::fast;
  int64_t rows = 0;  // rows: the tile and block size
};
// Process-wide, set before kernels run. Until set, CZ_CPU_ROW_SPLIT (fast, fixed or rows:N) decides: the
// tensor library's own tests use it.
void set_row_split(RowSplit s);
RowSplit row_split();
// "fast", "fixed", "rows:N" and back; nullopt if malformed.
std::string format_row_split(const RowSplit& s);
std::optional<RowSplit> parse_row_split(const std::string& text);

// Fixed-cut sizes, functions of the shape alone.
// Rows per tile of a row GEMM C (m x n) = A (m x k) op(B) on values of `value_bytes`.
int64_t row_tile(int64_t n, int64_t k, int64_t value_bytes);
// Rows per block of a sum over rows whose partial has `partial_values` values, at least `min_rows`.
int64_t sum_block_rows(int64_t partial_values, int64_t min_rows);
// Rows of dw (out x in) per call of weight_grad.
int64_t weight_grad_group(int64_t out);
// Rows per block of the sums of vectors over rows (bias, gamma and LayerNorm gradients).
inline constexpr int64_t kVectorSumRows = 8;

// The cut a kernel uses under the process's RowSplit, for `m` rows.
struct Cut {
  int64_t tile = 1;              // rows per tile; tiles run on one thread each
  int64_t block = 1;             // rows per block of the sums; a multiple of `tile` or a divisor of it
  bool library_threads = false;  // a single tile may be one call the library threads itself (fast)
  int64_t unit() const { return std::max(tile, block); }  // rows one thread takes at a time
  int64_t blocks(int64_t m) const { return std::max<int64_t>(1, (m + block - 1) / block); }
};
// A row GEMM's (gemm_rows): fast is one call.
Cut gemm_rows_cut(int64_t m, int64_t n, int64_t k, int64_t value_bytes);
// The fused MLP's: tiles for GEMMs of n x k (row_bytes: what a tile's row touches, weight_bytes: its
// weights), blocks for its column sums; `tile` > 0 forces the tile (tests, the tile sweep).
Cut fused_cut(int64_t m, int64_t n, int64_t k, int64_t row_bytes, int64_t weight_bytes, int64_t value_bytes,
              int64_t tile = 0);
// A sum of vectors over m rows (column sums, LayerNorm, gamma): blocks only.
Cut vector_sum_cut(int64_t m, int64_t cols);
// A weight gradient over m rows (weight_grad): blocks of rows and groups of the weight's rows.
struct GradCut {
  int64_t block = 1, group = 1;
  bool library_threads = false;
};
GradCut weight_grad_cut(int64_t m, int64_t out, int64_t in);

// Rows per block of a weight gradient accumulated tile by tile (the fused MLP's, partials of
// `partial_values`): whole tiles of `cut`, a multiple of its blocks. fast: a thread's run (cut.unit()).
int64_t grad_block_of_tiles(const Cut& cut, int64_t partial_values);

// Per-thread scratch (grows, never shrinks), slot `slot`.
template <class T>
T* tile_scratch(int slot, size_t n) {
  thread_local std::vector<T> buffers[4];
  std::vector<T>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// f(i) for i in [0, count) across cpu_threads() threads, any thread taking any index, every GEMM inside on
// its calling thread: with more than one thread the loop is always a parallel region (one index too). Where
// `library_threads` and count is 1, f(0) runs outside any region, so that a library may thread its call.
template <class F>
void for_each_item(int64_t count, F&& f, bool library_threads = false) {
  const int nt = cpu_threads();
  if (nt <= 1 || omp_in_parallel() || (library_threads && count == 1)) {
    for (int64_t i = 0; i < count; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t i = 0; i < count; ++i) f(i);
}

// f(r0, r1) for every tile of `cut` over [0, m): a thread takes a unit of rows (cut.unit()) and runs its
// tiles in order.
template <class F>
void for_tiles(int64_t m, const Cut& cut, F&& f) {
  const int64_t unit = cut.unit();
  for_each_item((m + unit - 1) / unit,
                [&](int64_t u) {
                  for (int64_t r0 = u * unit; r0 < std::min(m, (u + 1) * unit); r0 += cut.tile)
                    f(r0, std::min(m, r0 + cut.tile));
                },
                cut.library_threads);
}

// g(b0, b1) for the rows [r0, r1) cut at the multiples of `block`, in order.
template <class G>
void for_blocks_in(int64_t r0, int64_t r1, int64_t block, G&& g) {
  for (int64_t b0 = r0; b0 < r1;) {
    const int64_t b1 = std::min(r1, (b0 / block + 1) * block);
    g(b0, b1);
    b0 = b1;
  }
}

// C (m x n) = alpha A op(B) + beta C, A (m x k) not transposed (its rows are the batch's): tiles of
// gemm_rows_cut's rows, each one library call.
template <class T>
void gemm_rows(bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const Cut cut = gemm_rows_cut(m, n, k, int64_t(sizeof(T)));
  for_each_item((m + cut.tile - 1) / cut.tile,
                [&](int64_t i) {
                  const int64_t r0 = i * cut.tile;
                  gemm<T>(false, tb, std::min(cut.tile, m - r0), n, k, alpha, a + r0 * lda, lda, b, ldb, beta,
                          c + r0 * ldc, ldc);
                },
                cut.library_threads);
}

// The pairwise sum of `count` partials of `n` values, partial p at parts + p * stride: the sequence is
// halved (the first half floor(count / 2) long), each half summed so, and the halves added. The partials
// are overwritten; the sum lands in out (which may be parts itself). Elements are split across the threads,
// each running the whole tree on its own, so the order of the additions does not follow the thread count.
template <class T>
void pairwise_sum(T* parts, int64_t count, int64_t stride, int64_t n, T* out) {
  if (count <= 0) {
    std::fill_n(out, n, T(0));
    return;
  }
  // The tree's additions in post-order: slot a += slot mid for each split [a, b) at mid.
  std::vector<std::pair<int64_t, int64_t>> adds;
  struct Walk {
    std::vector<std::pair<int64_t, int64_t>>& adds;
    void operator()(int64_t a, int64_t b) {
      if (b - a < 2) return;
      const int64_t mid = a + (b - a) / 2;
      (*this)(a, mid);
      (*this)(mid, b);
      adds.push_back({a, mid});
    }
  };
  Walk{adds}(0, count);
  const int nt = n * count >= kParallelGrain ? cpu_threads() : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int t = omp_get_thread_num(), all = omp_get_num_threads();
    const int64_t e0 = n * t / all, e1 = n * (t + 1) / all;
    for (const auto& [dst, src] : adds) {
      T* d = parts + dst * stride;
      const T* s = parts + src * stride;
#pragma omp simd
      for (int64_t e = e0; e < e1; ++e) d[e] += s[e];
    }
    if (out != parts) std::copy(parts + e0, parts + e1, out + e0);
  }
}

// Partial sums of `width` values per block of a cut's rows (zeroed), added pairwise by finish().
template <class T>
struct BlockSums {
  int64_t block, width;
  std::vector<T> parts;
  BlockSums(const Cut& cut, int64_t rows, int64_t width)
      : block(cut.block), width(width), parts(size_t(cut.blocks(rows) * width), T(0)) {}
  // The partial of the block that holds row r.
  T* at(int64_t r) { return parts.data() + r / block * width; }
  // Adds the blocks pairwise; values [offset[i], offset[i] + count[i]) of the sum land in dst[i] (if not
  // null).
  void finish(T* const* dst, const int64_t* offset, const int64_t* count, int n) {
    const int64_t blocks = int64_t(parts.size()) / width;
    pairwise_sum(parts.data(), blocks, width, width, parts.data());
    for (int i = 0; i < n; ++i)
      if (dst[i]) std::copy_n(parts.data() + offset[i], count[i], dst[i]);
  }
};

// f(r0, r1, acc) for the rows [0, m) a block at a time, acc the block's `width` partial sums (BlockSums),
// every block's rows in order on one thread; the sums are added pairwise into out[0, width).
template <class T, class F>
void block_sums(int64_t m, int64_t width, const Cut& cut, T* out, F&& f) {
  BlockSums<T> sums(cut, m, width);
  const int64_t blocks = cut.blocks(m);
  // Threads take runs of blocks where the blocks are small.
  const int64_t per = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, cut.block * width));
  const auto run = [&](int64_t i) {
    for (int64_t b = i * per; b < std::min(blocks, (i + 1) * per); ++b)
      f(b * cut.block, std::min(m, (b + 1) * cut.block), sums.parts.data() + b * width);
  };
  const int64_t runs = (blocks + per - 1) / per;
  if (runs == 1 || m * width < kParallelGrain)
    for (int64_t i = 0; i < runs; ++i) run(i);
  else
    for_each_item(runs, run);
  const int64_t offset = 0;
  T* dst[1] = {out};
  sums.finish(dst, &offset, &width, 1);
}

// out[j] = the sum over rows of g[r][j], by vector_sum_cut's blocks added pairwise.
template <class T>
void column_sums(const T* g, int64_t rows, int64_t cols, T* out) {
  block_sums<T>(rows, cols, vector_sum_cut(rows, cols), out,
                [&](int64_t r0, int64_t r1, T* acc) { add_column_sums(g + r0 * cols, r1 - r0, cols, acc); });
}

// dw (out x in) = G^T X over the m rows of g (m x out) and x (m x in): weight_grad_cut's blocks of rows (each
// block's rows in one call per group of dw's rows) added pairwise.
template <class T>
void weight_grad(const T* g, const T* x, int64_t m, int64_t in, int64_t out, T* dw) {
  const int64_t wsize = out * in;
  const GradCut cut = weight_grad_cut(m, out, in);
  const int64_t blocks = std::max<int64_t>(1, (m + cut.block - 1) / cut.block);
  const int64_t groups = (out + cut.group - 1) / cut.group;
  std::vector<T> parts(blocks > 1 ? size_t(blocks * wsize) : 0);
  T* base = blocks > 1 ? parts.data() : dw;
  for_each_item(
      blocks * groups,
      [&](int64_t item) {
        const int64_t i = item / groups, o0 = item % groups * cut.group;
        const int64_t r0 = i * cut.block, rows = std::min(m, r0 + cut.block) - r0;
        const int64_t os = std::min(cut.group, out - o0);
        T* part = base + i * wsize + o0 * in;
        if (rows <= 0)
          std::fill_n(part, os * in, T(0));
        else
          gemm<T>(true, false, os, in, rows, T(1), g + r0 * out + o0, out, x + r0 * in, in, T(0), part, in);
      },
      cut.library_threads);
  if (blocks > 1) pairwise_sum(parts.data(), blocks, wsize, wsize, dw);
}

// The library calls gemm_rows (!s.ta) or weight_grad (s.ta: m = the weight's rows, n = its columns, k = the
// batch's rows) makes for the f32 GEMM `s` under the process's cut: what --cpu-gemm auto chooses for.
std::vector<GemmShape> gemm_calls_as_run(const GemmShape& s);

// dw = G^T X and db = G's column sums (weight_grad, column_sums); either may be null.
template <class T>
void weight_and_bias_grad(const T* g, const T* x, int64_t m, int64_t in, int64_t out, T* dw, T* db) {
  if (dw) weight_grad<T>(g, x, m, in, out, dw);
  if (db) column_sums<T>(g, m, out, db);
}

}  // namespace cz::cpu
