// Note [Cutting the rows] from the inside (tensor/cpu/row_tiles.h): under the fixed cut a row GEMM's rows,
// the sums over rows and the kernels built on them give the same bits at any thread count; under rows:N a
// batch cut in two halves of whole pieces gives the whole batch's rows, and its sums add to the whole
// batch's, bit for bit, on every library; the pairwise order of the sums.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/threads.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cpu/gemm_choice.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz::cpu {
namespace {

using cz::testing::with_threads;

// The process's cut for a scope.
class ScopedRowSplit {
 public:
  explicit ScopedRowSplit(RowSplit s) : prev_(row_split()) { set_row_split(s); }
  ~ScopedRowSplit() { set_row_split(prev_); }
  ScopedRowSplit(const ScopedRowSplit&) = delete;
  ScopedRowSplit& operator=(const ScopedRowSplit&) = delete;

 private:
  RowSplit prev_;
};

const RowSplit kFixed{RowSplitMode::fixed, 0};
RowSplit rows_of_n(int64_t n) {
  return {RowSplitMode::rows, n};
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

// The row GEMMs of ConvNeXt's step: fc1 and fc2 forward (NT) and their input gradients (NN) at atto's and
// ConvNeXt-T's widths, a patchify convolution's, and a head.
struct RowShape {
  bool tb;
  int64_t n, k;
};
const RowShape kRowShapes[] = {{true, 160, 40},   {true, 40, 160},    {false, 160, 40},
                               {false, 40, 160},  {true, 96, 48},     {false, 48, 96},
                               {true, 1536, 384}, {false, 384, 1536}, {true, 10, 320}};

// Rows [off, off + len) of A op(B), as gemm_rows computes them when given only those rows, on `threads`.
std::vector<float> rows_of(const RowShape& s, const std::vector<float>& a, const std::vector<float>& b,
                           int64_t off, int64_t len, int threads) {
  std::vector<float> c(size_t(len * s.n));
  with_threads(threads, [&] {
    gemm_rows<float>(s.tb, len, s.n, s.k, 1.f, a.data() + off * s.k, s.k, b.data(), s.tb ? s.k : s.n, 0.f,
                     c.data(), s.n);
    return 0;
  });
  return c;
}

// Every row of `part` (rows [off, off + len) of the batch) against the same row of `whole`: equal to the bit,
// or where `exact` is false within the fp32 bound of a k-term dot product's other order (2 k u sum |a_i b_i|,
// bounded here by 2 k u k since |a|, |b| <= 1).
void expect_rows_equal(const RowShape& s, const std::vector<float>& whole, const std::vector<float>& part,
                       int64_t off, int64_t len, bool exact, const std::string& what) {
  int64_t differing = 0;
  double worst = 0;
  for (int64_t r = 0; r < len; ++r)
    for (int64_t j = 0; j < s.n; ++j) {
      const float x = whole[size_t((off + r) * s.n + j)], y = part[size_t(r * s.n + j)];
      if (std::memcmp(&x, &y, 4) != 0) ++differing;
      worst = std::max(worst, double(std::fabs(x - y)));
    }
  if (exact) {
    EXPECT_EQ(differing, 0) << what << ": " << differing << " values differ (largest by " << worst << ")";
  } else {
    EXPECT_LE(worst, 2.0 * double(s.k) * double(s.k) * 0x1p-24) << what;
  }
}

class RowTilesOn : public ::testing::TestWithParam<GemmLibrary> {
 protected:
  void SetUp() override {
    saved_ = gemm_plan();
    set_gemm_plan(GemmPlan{GetParam(), {}});
  }
  void TearDown() override { set_gemm_plan(saved_); }
  GemmPlan saved_;
};

// The fixed cut: 1000 rows on 1, 2 and 3 threads give the same bits.
TEST_P(RowTilesOn, FixedCutRowsDoNotFollowTheThreads) {
  ScopedRowSplit fixed(kFixed);
  const int64_t m = 1000;
  for (const RowShape& s : kRowShapes) {
    const auto a = random_values(size_t(m * s.k), 1), b = random_values(size_t(s.n * s.k), 2);
    const auto whole = rows_of(s, a, b, 0, m, 2);
    for (int threads : {1, 3})
      expect_rows_equal(s, whole, rows_of(s, a, b, 0, m, threads), 0, m, true,
                        fmt::format("{} N{} {}x{}x{} on {} threads", gemm_library_name(GetParam()),
                                    s.tb ? 'T' : 'N', m, s.n, s.k, threads));
  }
}

// rows:N: rows given as a rank's half, a quarter or a piece at a multiple of N (1 and 3 threads) equal the
// same rows of the whole batch on 2 threads: every library, since each piece is the same call on the same
// rows. Under the fixed cut a part at another place agrees to rounding (a library's row follows the shape of
// its call and its place in it: oneDNN's no-copy kernels, OpenBLAS's rows in groups of 12).
TEST_P(RowTilesOn, PiecesOfNRowsDoNotFollowTheBatch) {
  const int64_t m = 1024;
  for (const RowShape& s : kRowShapes) {
    const auto a = random_values(size_t(m * s.k), 3), b = random_values(size_t(s.n * s.k), 4);
    struct Part {
      int64_t off, len;
      int threads;
    };
    {
      ScopedRowSplit rows(rows_of_n(64));
      const auto whole = rows_of(s, a, b, 0, m, 2);
      for (const Part& p : {Part{512, 512, 1}, Part{0, 256, 1}, Part{768, 256, 3}, Part{192, 320, 2}})
        expect_rows_equal(
            s, whole, rows_of(s, a, b, p.off, p.len, p.threads), p.off, p.len, true,
            fmt::format("{} N{} n {} k {}, rows:64: rows {}..{} on {} threads", gemm_library_name(GetParam()),
                        s.tb ? 'T' : 'N', s.n, s.k, p.off, p.off + p.len, p.threads));
    }
    ScopedRowSplit fixed(kFixed);
    const auto whole = rows_of(s, a, b, 0, m, 2);
    expect_rows_equal(s, whole, rows_of(s, a, b, 37, 211, 1), 37, 211, false,
                      fmt::format("{} N{} n {} k {}, fixed: rows 37..248", gemm_library_name(GetParam()),
                                  s.tb ? 'T' : 'N', s.n, s.k));
  }
}

INSTANTIATE_TEST_SUITE_P(Libraries, RowTilesOn, ::testing::ValuesIn(kGemmLibraries),
                         [](const auto& info) { return std::string(gemm_library_name(info.param)); });

// The same with bf16 operands (Note [bf16 on the CPU]): AMX, AVX512_BF16, or emulated
// (CZ_CPU_BF16_EMULATE=1).
TEST(RowTiles, Bf16PiecesAndThreads) {
  if (bf16_isa(cpu_features()).empty()) GTEST_SKIP() << "this CPU has neither AVX512_BF16 nor AMX";
  ScopedMatmulPrecision bf16(MatmulPrecision::bf16);
  const int64_t m = 1024;
  for (const RowShape& s : kRowShapes) {
    const auto a = random_values(size_t(m * s.k), 5), b = random_values(size_t(s.n * s.k), 6);
    const std::string isa = bf16_isa(cpu_features());
    {
      ScopedRowSplit rows(rows_of_n(64));
      const auto whole = rows_of(s, a, b, 0, m, 2);
      expect_rows_equal(
          s, whole, rows_of(s, a, b, 512, 512, 1), 512, 512, true,
          fmt::format("bf16 ({}) N{} n {} k {}, rows:64: the second half", isa, s.tb ? 'T' : 'N', s.n, s.k));
    }
    ScopedRowSplit fixed(kFixed);
    expect_rows_equal(
        s, rows_of(s, a, b, 0, m, 2), rows_of(s, a, b, 0, m, 3), 0, m, true,
        fmt::format("bf16 ({}) N{} n {} k {}, fixed: 3 threads against 2", isa, s.tb ? 'T' : 'N', s.n, s.k));
  }
}

TEST(RowSplit, TextRoundTripsAndBadTextIsRefused) {
  for (const std::string t : {"fast", "fixed", "rows:1", "rows:64"}) {
    const auto s = parse_row_split(t);
    ASSERT_TRUE(s.has_value()) << t;
    EXPECT_EQ(format_row_split(*s), t);
  }
  for (const std::string t : {"", "rows", "rows:", "rows:0", "rows:-3", "rows:8x", "Fast", "fixed "})
    EXPECT_FALSE(parse_row_split(t).has_value()) << "'" << t << "'";
  EXPECT_THROW(set_row_split({RowSplitMode::rows, 0}), ValueError);
}

// The cuts' sizes: fixed ones follow the shape alone (not the rows or the threads); rows:N is N everywhere.
TEST(RowSplit, FixedSizesFollowTheShapeAlone) {
  ScopedRowSplit fixed(kFixed);
  const Cut a = with_threads(1, [] { return gemm_rows_cut(100, 160, 40, 4); });
  const Cut b = with_threads(3, [] { return gemm_rows_cut(100000, 160, 40, 4); });
  EXPECT_EQ(a.tile, b.tile);
  EXPECT_FALSE(a.library_threads);
  const GradCut g1 = with_threads(1, [] { return weight_grad_cut(100, 640, 160); });
  const GradCut g2 = with_threads(3, [] { return weight_grad_cut(100000, 640, 160); });
  EXPECT_EQ(g1.block, g2.block);
  EXPECT_EQ(g1.group, g2.group);
  EXPECT_EQ(vector_sum_cut(7, 40).block, kVectorSumRows);
  ScopedRowSplit rows(rows_of_n(24));
  EXPECT_EQ(gemm_rows_cut(1000, 160, 40, 4).tile, 24);
  EXPECT_EQ(fused_cut(1000, 160, 40, 800, 25600, 4).tile, 24);
  EXPECT_EQ(fused_cut(1000, 160, 40, 800, 25600, 4).block, 24);
  EXPECT_EQ(weight_grad_cut(1000, 640, 160).block, 24);
}

// pairwise_sum halves the sequence: 5 partials add as ((p0 + p1) + (p2 + (p3 + p4))).
TEST(BatchSums, PairwiseSumHalvesTheSequence) {
  std::vector<double> parts = {1e16, 1.0, -1e16, 1.0, 1.0};  // each a partial of one value
  std::vector<double> copy = parts;
  double out = 0;
  pairwise_sum(copy.data(), 5, 1, 1, &out);
  EXPECT_EQ(out, (parts[0] + parts[1]) + (parts[2] + (parts[3] + parts[4])));
  pairwise_sum(parts.data(), 0, 1, 1, &out);
  EXPECT_EQ(out, 0.0);
}

// The sums over rows: under the fixed cut at 1, 2 and 3 threads one result; under rows:N a batch cut in two
// halves of whole pieces sums, half by half and then the halves added, to the whole batch's bits: what 2
// ranks and their reduction give against 1 rank.
TEST(BatchSums, ColumnAndWeightSumsIgnoreTheThreadsAndNestAtTheHalves) {
  const int64_t out = 40, in = 160, m = 2048;
  const auto g = random_values(size_t(m * out), 8), x = random_values(size_t(m * in), 9);
  const auto sums = [&](int64_t off, int64_t rows, int threads) {
    std::vector<float> dw(size_t(out * in)), db(static_cast<size_t>(out));
    with_threads(threads, [&] {
      weight_and_bias_grad<float>(g.data() + off * out, x.data() + off * in, rows, in, out, dw.data(),
                                  db.data());
      return 0;
    });
    dw.insert(dw.end(), db.begin(), db.end());
    return dw;
  };
  {
    ScopedRowSplit fixed(kFixed);
    const auto whole = sums(0, m, 2);
    EXPECT_EQ(whole, sums(0, m, 1));
    EXPECT_EQ(whole, sums(0, m, 3));
  }
  ScopedRowSplit rows(rows_of_n(64));
  const auto whole = sums(0, m, 2);
  auto halves = sums(0, m / 2, 1);
  const auto second = sums(m / 2, m / 2, 3);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] += second[i];
  EXPECT_EQ(whole, halves);
}

// Every CPU kernel with a sum over rows: under the fixed cut at 1, 2 and 3 threads, and under rows:8 on a
// batch cut in halves (each half's rows, and its parameter gradients added), the same bits as the whole batch
// on 2 threads.
struct KernelCase {
  const char* name;
  int64_t rows;  // the batch's leading extent: images for the convolutions, rows otherwise
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run;  // inputs (batch-major) -> outputs
  std::vector<std::vector<int64_t>> shapes;                            // inputs; [0] is the batch extent
  int batch_outputs;  // outputs [0, batch_outputs) are per row; the rest are parameter gradients
};

Tensor slice_rows(const Tensor& t, int64_t r0, int64_t r1) {
  std::vector<int64_t> sizes = t.sizes();
  const int64_t per = t.numel() / sizes[0];
  sizes[0] = r1 - r0;
  Tensor out = empty(sizes, t.dtype());
  std::memcpy(out.data<float>(), t.data<float>() + r0 * per, size_t((r1 - r0) * per) * 4);
  return out;
}

std::vector<KernelCase> kernel_cases() {
  std::vector<KernelCase> cases;
  const int64_t c = 40, hid = 160;
  cases.push_back({"linear_backward",
                   1024,
                   [=](const std::vector<Tensor>& in) {
                     Tensor dx = empty_like(in[1]), dw = empty({hid, c}), db = empty({hid});
                     linear_backward(in[0], in[1], in[2], dx, dw, db);
                     return std::vector<Tensor>{dx, dw, db};
                   },
                   {{1024, hid}, {1024, c}, {hid, c}},
                   1});
  cases.push_back({"layer_norm_backward",
                   512,
                   [=](const std::vector<Tensor>& in) {
                     Tensor y = empty_like(in[1]), mean = empty({in[1].size(0)}),
                            rstd = empty({in[1].size(0)});
                     layer_norm_forward(in[1], in[2], in[3], 1e-6, y, mean, rstd);
                     Tensor dx = empty_like(in[1]), dw = empty({c}), db = empty({c});
                     layer_norm_backward(in[0], in[1], in[2], mean, rstd, dx, dw, db);
                     return std::vector<Tensor>{dx, dw, db};
                   },
                   {{512, c}, {512, c}, {c}, {c}},
                   1});
  cases.push_back({"grn_backward",
                   8,
                   [=](const std::vector<Tensor>& in) {
                     const int64_t n = in[1].size(0);
                     Tensor y = empty_like(in[1]), gx = empty({n, c}), d = empty({n});
                     grn_forward(in[1], in[2], in[3], 1e-6, y, gx, d);
                     Tensor dx = empty_like(in[1]), dgamma = empty({c}), dbeta = empty({c});
                     grn_backward(in[0], in[1], in[2], gx, d, dx, dgamma, dbeta);
                     return std::vector<Tensor>{y, dx, dgamma, dbeta};
                   },
                   {{8, 16, 16, c}, {8, 16, 16, c}, {c}, {c}},
                   2});
  cases.push_back({"channel_scale_backward",
                   512,
                   [=](const std::vector<Tensor>& in) {
                     Tensor dx = empty_like(in[0]), dgamma = empty({c});
                     channel_scale_backward(in[0], in[1], in[2], dx, dgamma);
                     return std::vector<Tensor>{dx, dgamma};
                   },
                   {{512, c}, {512, c}, {c}},
                   1});
  cases.push_back({"depthwise_conv2d_backward",
                   8,
                   [=](const std::vector<Tensor>& in) {
                     Tensor dx = empty_like(in[1]), dw = empty({7, 7, c}), db = empty({c});
                     depthwise_conv2d_backward(in[0], in[1], in[2], dx, dw, db);
                     return std::vector<Tensor>{dx, dw, db};
                   },
                   {{8, 16, 16, c}, {8, 16, 16, c}, {7, 7, c}},
                   1});
  cases.push_back({"patchify_conv2d_backward",
                   8,
                   [=](const std::vector<Tensor>& in) {
                     Tensor dx = empty_like(in[1]), dw = empty({c, 4, 4, 3}), db = empty({c});
                     patchify_conv2d_backward(in[0], in[1], in[2], dx, dw, db);
                     return std::vector<Tensor>{dx, dw, db};
                   },
                   {{8, 16, 16, c}, {8, 64, 64, 3}, {c, 4, 4, 3}},
                   1});
  cases.push_back(
      {"linear_gelu_backward",
       1024,
       [=](const std::vector<Tensor>& in) {
         Tensor h = empty({in[1].size(0), hid}), y = empty({in[1].size(0), hid});
         linear_gelu_forward(in[1], in[2], in[3], h, y);
         Tensor gh = empty_like(h), dx = empty_like(in[1]), dw = empty({hid, c}), db = empty({hid});
         linear_gelu_backward(in[0], in[1], h, in[2], gh, dx, dw, db);
         return std::vector<Tensor>{y, dx, dw, db};
       },
       {{1024, hid}, {1024, c}, {hid, c}, {hid}},
       2});
  cases.push_back({"linear_scale_residual_backward",
                   1024,
                   [=](const std::vector<Tensor>& in) {
                     const int64_t m = in[1].size(0);
                     Tensor y = empty({m, c}), out = empty({m, c});
                     linear_scale_residual_forward(in[1], in[2], in[3], in[4], in[0], y, out);
                     Tensor gb = empty({m, c}), dx = empty_like(in[1]), dw = empty({c, hid}), db = empty({c}),
                            dgamma = empty({c});
                     linear_scale_residual_backward(in[0], in[1], y, in[2], in[4], gb, dx, dw, db, dgamma);
                     return std::vector<Tensor>{out, dx, dw, db, dgamma};
                   },
                   {{1024, c}, {1024, hid}, {c, hid}, {c}, {c}},
                   2});
  cases.push_back({"mlp_scale_residual_backward",
                   1024,
                   [=](const std::vector<Tensor>& in) {
                     const int64_t m = in[1].size(0);
                     Tensor h = empty({m, hid}), y2 = empty({m, c}), out = empty({m, c});
                     mlp_scale_residual_forward(in[1], in[2], in[3], in[4], in[5], in[6], in[0], h, y2, out);
                     Tensor dx = empty_like(in[1]), dw1 = empty({hid, c}), db1 = empty({hid}),
                            dw2 = empty({c, hid}), db2 = empty({c}), dgamma = empty({c});
                     mlp_scale_residual_backward(in[0], in[1], h, y2, in[2], in[4], in[6], dx, dw1, db1, dw2,
                                                 db2, dgamma);
                     return std::vector<Tensor>{out, dx, dw1, db1, dw2, db2, dgamma};
                   },
                   {{1024, c}, {1024, c}, {hid, c}, {hid}, {c, hid}, {c}, {c}},
                   2});
  return cases;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  int64_t differing = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    differing += std::memcmp(a.data<float>() + i, b.data<float>() + i, 4) != 0;
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << a.numel() << " values differ";
}

TEST(BatchSums, KernelsIgnoreTheThreadsAndNestAtTheHalves) {
  for (const KernelCase& k : kernel_cases()) {
    std::vector<Tensor> in;
    Generator gen(11);
    for (const auto& shape : k.shapes) in.push_back(randn(shape, gen));
    {
      ScopedRowSplit fixed(kFixed);
      const auto whole = with_threads(2, [&] { return k.run(in); });
      for (int threads : {1, 3}) {
        const auto again = with_threads(threads, [&] { return k.run(in); });
        for (size_t o = 0; o < whole.size(); ++o)
          expect_same_bits(whole[o], again[o], fmt::format("{} output {} on {} threads", k.name, o, threads));
      }
    }
    ScopedRowSplit rows(rows_of_n(8));
    const auto whole = with_threads(2, [&] { return k.run(in); });
    // Halves: batch-major inputs cut at the middle; the others (weights) whole.
    std::vector<std::vector<Tensor>> halves(2);
    for (int h = 0; h < 2; ++h) {
      std::vector<Tensor> part;
      for (size_t i = 0; i < in.size(); ++i)
        part.push_back(in[i].dim() > 0 && in[i].size(0) == k.rows && k.shapes[i].size() > 1
                           ? slice_rows(in[i], h * k.rows / 2, (h + 1) * k.rows / 2)
                           : in[i]);
      halves[size_t(h)] = with_threads(1, [&] { return k.run(part); });
    }
    for (size_t o = 0; o < whole.size(); ++o) {
      const std::string what = fmt::format("{} output {} from two halves", k.name, o);
      Tensor joined = empty(whole[o].sizes());
      const int64_t n0 = halves[0][o].numel();
      if (int(o) < k.batch_outputs) {
        std::memcpy(joined.data<float>(), halves[0][o].data<float>(), size_t(n0) * 4);
        std::memcpy(joined.data<float>() + n0, halves[1][o].data<float>(), size_t(halves[1][o].numel()) * 4);
      } else {
        for (int64_t i = 0; i < n0; ++i)
          joined.data<float>()[i] = halves[0][o].data<float>()[i] + halves[1][o].data<float>()[i];
      }
      expect_same_bits(whole[o], joined, what);
    }
  }
}

}  // namespace
}  // namespace cz::cpu
