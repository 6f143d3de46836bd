// The cuts of Note [Cutting the rows] (row_tiles.h): the process's choice and the sizes each kernel takes.
#include "tensor/cpu/row_tiles.h"

#include <bit>
#include <cstdlib>

#include <fmt/format.h>

#include "tensor/check.h"

namespace cz::cpu {
namespace {

int64_t pow2_floor(int64_t v) {
  return v < 1 ? 1 : int64_t(std::bit_floor(uint64_t(v)));
}

int64_t pow2_ceil(int64_t v) {
  return v < 1 ? 1 : int64_t(std::bit_ceil(uint64_t(v)));
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / std::max<int64_t>(1, b);
}

RowSplit initial_split() {
  if (const char* env = std::getenv("CZ_CPU_ROW_SPLIT"); env && *env) {
    const auto s = parse_row_split(env);
    CZ_CHECK(s.has_value(), "CZ_CPU_ROW_SPLIT must be fast, fixed or rows:N (N >= 1), got '{}'", env);
    return *s;
  }
  return {};
}

RowSplit& split_storage() {
  static RowSplit s = initial_split();
  return s;
}

// fast: the threads a kernel of m rows of `cols` values uses (the grain keeps small ones on one thread).
int threads_for(int64_t m, int64_t cols) {
  return m * cols >= kParallelGrain ? cpu_threads() : 1;
}

// The fused MLP's tile on `threads` threads (fast): tiles fill `budget_bytes`, at least kMinRows, as many as
// a multiple of the threads, all of one size; a weight larger than the budget (ConvNeXt-T's last two stages:
// 2.3 and 9 MiB) comes from memory at each tile's packing, so there every thread takes one tile of its share.
int64_t fused_tile_rows(int64_t rows, int64_t row_bytes, int64_t weight_bytes, int threads) {
  constexpr int64_t kMinRows = 128, kBudget = int64_t(1) << 20;
  const int64_t share = ceil_div(rows, std::max(1, threads));
  int64_t tile = share;
  if (weight_bytes <= kBudget)
    tile = std::min(share, std::max<int64_t>(kMinRows, kBudget / std::max<int64_t>(1, row_bytes)));
  tile = std::max<int64_t>(1, std::min(tile, rows));
  // Even out the tiles (12 tiles of 728 rows with a short last one gave one of 2 threads 14% more rows).
  const int64_t per = std::max<int64_t>(1, threads);
  const int64_t tiles = ceil_div(ceil_div(rows, tile), per) * per;
  return std::max<int64_t>(1, ceil_div(rows, tiles));
}

}  // namespace

void set_row_split(RowSplit s) {
  CZ_CHECK(s.mode != RowSplitMode::rows || s.rows >= 1, "row split rows:N needs N >= 1, got {}", s.rows);
  split_storage() = s;
}

RowSplit row_split() {
  return split_storage();
}

std::string format_row_split(const RowSplit& s) {
  switch (s.mode) {
    case RowSplitMode::fast:
      return "fast";
    case RowSplitMode::fixed:
      return "fixed";
    case RowSplitMode::rows:
      return fmt::format("rows:{}", s.rows);
  }
  return "?";
}

std::optional<RowSplit> parse_row_split(const std::string& text) {
  if (text == "fast") return RowSplit{};
  if (text == "fixed") return RowSplit{RowSplitMode::fixed, 0};
  if (text.rfind("rows:", 0) == 0) {
    const std::string n = text.substr(5);
    if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    const int64_t v = std::stoll(n);
    if (v < 1) return std::nullopt;
    return RowSplit{RowSplitMode::rows, v};
  }
  return std::nullopt;
}

int64_t row_tile(int64_t n, int64_t k, int64_t value_bytes) {
  // Tiles of about 1 MiB of rows (the fused MLP's sweep: 256-1024 rows were fastest at ConvNeXt-T's first
  // stage and atto's), 32 to 512 rows; at least 128 where the weight exceeds 1 MiB, whose packing each tile
  // repeats.
  constexpr int64_t kTileBytes = int64_t(1) << 20, kMin = 32, kMax = 512, kMinLargeWeight = 128;
  const int64_t row_bytes = std::max<int64_t>(1, (n + k) * value_bytes);
  int64_t t = std::clamp(pow2_floor(kTileBytes / row_bytes), kMin, kMax);
  if (n * k * value_bytes > kTileBytes) t = std::max(t, kMinLargeWeight);
  return t;
}

int64_t sum_block_rows(int64_t partial_values, int64_t min_rows) {
  // The partials come to at most 64 values per row of the batch.
  return std::max(min_rows, pow2_ceil(partial_values / 64));
}

int64_t weight_grad_group(int64_t out) {
  // Groups of up to 256 of the weight's rows, a power of two of them, all of one size: each call packs the
  // block's X again, so fewer and larger groups pack less; several let a gradient of few blocks use the
  // threads.
  constexpr int64_t kRows = 256;
  const int64_t groups = pow2_ceil(ceil_div(out, kRows));
  return std::max<int64_t>(1, ceil_div(out, groups));
}

Cut gemm_rows_cut(int64_t m, int64_t n, int64_t k, int64_t value_bytes) {
  const RowSplit s = row_split();
  if (s.mode == RowSplitMode::fast) return {std::max<int64_t>(1, m), std::max<int64_t>(1, m), true};
  const int64_t t = s.mode == RowSplitMode::rows ? s.rows : row_tile(n, k, value_bytes);
  return {t, t, false};
}

Cut fused_cut(int64_t m, int64_t n, int64_t k, int64_t row_bytes, int64_t weight_bytes, int64_t value_bytes,
              int64_t tile) {
  const RowSplit s = row_split();
  if (s.mode == RowSplitMode::rows) return {s.rows, s.rows, false};
  if (s.mode == RowSplitMode::fixed) {
    if (tile <= 0) tile = row_tile(n, k, value_bytes);
    return {ceil_div(tile, kVectorSumRows) * kVectorSumRows, kVectorSumRows, false};
  }
  const int nt = threads_for(m, std::max(n, k));
  if (tile <= 0) tile = fused_tile_rows(m, row_bytes, weight_bytes, nt);
  // One block per thread: its run of tiles, summed in order.
  return {tile, std::max<int64_t>(1, ceil_div(ceil_div(m, tile), nt)) * tile, true};
}

Cut vector_sum_cut(int64_t m, int64_t cols) {
  const RowSplit s = row_split();
  if (s.mode == RowSplitMode::rows) return {s.rows, s.rows, false};
  if (s.mode == RowSplitMode::fixed) return {kVectorSumRows, kVectorSumRows, false};
  const int64_t b = std::max<int64_t>(1, ceil_div(m, threads_for(m, cols)));
  return {b, b, false};
}

GradCut weight_grad_cut(int64_t m, int64_t out, int64_t in) {
  const RowSplit s = row_split();
  if (s.mode == RowSplitMode::rows) return {s.rows, weight_grad_group(out), false};
  if (s.mode == RowSplitMode::fixed) return {sum_block_rows(out * in, 256), weight_grad_group(out), false};
  // fast: a tall gradient of a small weight (ConvNeXt's first stages: 8192 rows, a 160 x 40 weight; the stem:
  // 50176 rows, 96 x 48) gives a library an output too small to split well across threads and a long
  // reduction it packs in one piece (oneDNN 2.6 on 2 threads of a Xeon: the stem's 96 x 48 x 50176 at 147
  // GFLOP/s, 251 split), so its rows go one block per thread; any other is one call the library threads.
  const int threads = cpu_threads();
  const bool split =
      threads > 1 && m >= 2048 && m >= 16 * std::max(in, out) && in * out <= (int64_t(1) << 16);
  if (split) return {ceil_div(m, threads), out, false};
  return {std::max<int64_t>(1, m), out, true};
}

int64_t grad_block_of_tiles(const Cut& cut, int64_t partial_values) {
  if (row_split().mode != RowSplitMode::fixed) return cut.unit();
  return ceil_div(sum_block_rows(partial_values, cut.tile), cut.unit()) * cut.unit();
}

std::vector<GemmShape> gemm_calls_as_run(const GemmShape& s) {
  if (!s.ta) {
    const Cut c = gemm_rows_cut(s.m, s.n, s.k, 4);
    std::vector<GemmShape> calls = {{false, s.tb, std::min(c.tile, s.m), s.n, s.k}};
    if (s.m > c.tile && s.m % c.tile) calls.push_back({false, s.tb, s.m % c.tile, s.n, s.k});
    return calls;
  }
  const int64_t out = s.m, in = s.n, rows = s.k;
  const GradCut c = weight_grad_cut(rows, out, in);
  std::vector<int64_t> ks = {std::min(c.block, rows)}, ms = {std::min(c.group, out)};
  if (rows > c.block && rows % c.block) ks.push_back(rows % c.block);
  if (out > c.group && out % c.group) ms.push_back(out % c.group);
  std::vector<GemmShape> calls;
  for (int64_t m : ms)
    for (int64_t k : ks) calls.push_back({true, false, m, in, k});
  return calls;
}

}  // namespace cz::cpu
