// The CPU GEMM libraries (tensor/cpu/gemm_libraries.h) against an f64 reference, and the per-shape choice
// with its cache file (tensor/cpu/gemm_choice.h, Note [CPU GEMM libraries]).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/check.h"
#include "tensor/cpu/blas.h"
#include "tensor/cpu/gemm_choice.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k, pad;  // pad: each ld exceeds the operand's row length by this much
  float alpha, beta;
};

// Runs `c` on `lib` (from inside a parallel region of `threads` threads, each thread its own C, when
// `in_parallel`) and checks every element of C, pad included, against an f64 reference.
void check_case(GemmLibrary lib, const Case& c, bool in_parallel) {
  const int64_t arows = c.ta ? c.k : c.m, acols = c.ta ? c.m : c.k;
  const int64_t brows = c.tb ? c.n : c.k, bcols = c.tb ? c.k : c.n;
  const int64_t lda = acols + c.pad, ldb = bcols + c.pad, ldc = c.n + c.pad;
  std::mt19937 gen(uint32_t(c.m * 131 + c.n * 17 + c.k));
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(arows * lda)), b(size_t(brows * ldb)), c0(size_t(c.m * ldc));
  for (float& v : a) v = u(gen);
  for (float& v : b) v = u(gen);
  for (float& v : c0) v = u(gen);
  if (c.beta == 0) std::fill(c0.begin(), c0.end(), std::nanf(""));  // beta 0 must ignore C, NaN included
  auto A = [&](int64_t i, int64_t p) {
    return double(c.ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]);
  };
  auto B = [&](int64_t p, int64_t j) {
    return double(c.tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)]);
  };
  const int copies = in_parallel ? 3 : 1;
  std::vector<std::vector<float>> outs(size_t(copies), c0);
  if (in_parallel) {
#pragma omp parallel for num_threads(copies) schedule(static, 1)
    for (int t = 0; t < copies; ++t)
      sgemm_on(lib, c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta,
               outs[size_t(t)].data(), ldc);
  } else {
    sgemm_on(lib, c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, outs[0].data(),
             ldc);
  }
  const std::string what = fmt::format("{} {} alpha {} beta {} pad {}{}", gemm_library_name(lib),
                                       format_gemm_shape({c.ta, c.tb, c.m, c.n, c.k}), c.alpha, c.beta, c.pad,
                                       in_parallel ? " in a parallel region" : "");
  for (int t = 0; t < copies; ++t)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = outs[size_t(t)][size_t(i * ldc + j)];
        if (j >= c.n) {  // the pad beyond n columns is not C's: left as it was
          const float was = c0[size_t(i * ldc + j)];
          ASSERT_TRUE(std::isnan(was) ? std::isnan(got) : got == was)
              << what << " wrote pad (" << i << "," << j;
          continue;
        }
        double ref = 0, mag = 0;
        for (int64_t p = 0; p < c.k; ++p) ref += A(i, p) * B(p, j), mag += std::fabs(A(i, p) * B(p, j));
        ref *= c.alpha, mag *= std::fabs(c.alpha);
        if (c.beta != 0) ref += double(c.beta) * c0[size_t(i * ldc + j)], mag += std::fabs(c.beta);
        ASSERT_NEAR(got, ref, 1e-5 * (mag + 1)) << what << " at (" << i << "," << j << "), copy " << t;
      }
}

class EveryLibrary : public ::testing::TestWithParam<GemmLibrary> {};

TEST_P(EveryLibrary, MatchesDoubleReferenceOnEveryTransposeAndOddSize) {
  const GemmLibrary lib = GetParam();
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Case& shape : {Case{ta, tb, 37, 29, 13, 0, 1, 0}, Case{ta, tb, 130, 67, 300, 3, 1, 1},
                                Case{ta, tb, 1, 5, 7, 1, 0.5f, 1}, Case{ta, tb, 70, 1, 65, 2, -1.5f, 0},
                                Case{ta, tb, 65, 129, 257, 5, 2, 0.25f}})
        check_case(lib, shape, false);
}

TEST_P(EveryLibrary, CorrectFromInsideAParallelRegion) {
  const GemmLibrary lib = GetParam();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case(lib, Case{ta, tb, 77, 45, 130, 1, 1, 0}, true);
      check_case(lib, Case{ta, tb, 33, 70, 9, 2, 0.75f, 1}, true);
    }
}

TEST_P(EveryLibrary, ConvNeXtSizedShapesAtTheProcessThreads) {
  // Large enough that every library splits the work over its threads (and libxsmm over many tiles and
  // several blocks of k).
  const GemmLibrary lib = GetParam();
  check_case(lib, Case{false, true, 512, 160, 40, 0, 1, 1}, false);   // fc1 forward, beta 1 (bias in C)
  check_case(lib, Case{true, false, 40, 160, 600, 0, 1, 0}, false);   // weight gradient
  check_case(lib, Case{false, false, 300, 40, 160, 4, 1, 0}, false);  // input gradient, ld > n
}

TEST_P(EveryLibrary, RepeatsBitForBitWhereverTheOperandsLie) {
  // Resumed and repeated runs rely on it: the same product in a new process (other addresses) has the same
  // bits. Operands copied to buffers offset by one float (other alignments), the call repeated.
  const GemmLibrary lib = GetParam();
  for (const GemmShape& s : {GemmShape{false, true, 2048, 160, 40}, GemmShape{true, false, 160, 40, 4096},
                             GemmShape{false, false, 333, 77, 515}}) {
    const int64_t na = s.m * s.k, nb = s.k * s.n, nc = s.m * s.n;
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> a(size_t(na + 1)), b(size_t(nb + 1)), c1(size_t(nc + 1)), c2(size_t(nc + 1));
    for (float& v : a) v = u(gen);
    for (float& v : b) v = u(gen);
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    sgemm_on(lib, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c1.data(), s.n);
    std::vector<float> a2(a), b2(b);
    std::copy_n(a.begin(), na, a2.begin() + 1);
    std::copy_n(b.begin(), nb, b2.begin() + 1);
    for (int rep = 0; rep < 2; ++rep) {
      sgemm_on(lib, s.ta, s.tb, s.m, s.n, s.k, 1.f, a2.data() + 1, lda, b2.data() + 1, ldb, 0.f,
               c2.data() + 1, s.n);
      ASSERT_EQ(std::memcmp(c1.data(), c2.data() + 1, size_t(nc) * sizeof(float)), 0)
          << gemm_library_name(lib) << " " << format_gemm_shape(s) << " differs at other addresses";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuGemm, EveryLibrary, ::testing::ValuesIn(kGemmLibraries),
                         [](const auto& info) { return std::string(gemm_library_name(info.param)); });

TEST(CpuGemm, LibraryNamesRoundTripAndUnknownIsRejected) {
  for (GemmLibrary lib : kGemmLibraries) EXPECT_EQ(parse_gemm_library(gemm_library_name(lib)), lib);
  EXPECT_FALSE(parse_gemm_library("mkl").has_value());
  EXPECT_FALSE(parse_gemm_library("auto").has_value());
  for (GemmLibrary lib : kGemmLibraries) EXPECT_FALSE(gemm_library_version(lib).empty());
}

TEST(CpuGemm, ShapeTextRoundTrips) {
  const GemmShape s{true, false, 8192, 160, 40};
  EXPECT_EQ(format_gemm_shape(s), "TN 8192x160x40");
  EXPECT_EQ(parse_gemm_shape("TN 8192x160x40"), s);
  for (const char* bad : {"", "XN 1x2x3", "NN 1x2", "NN 1x2x3 ", "NN 0x2x3", "NN 1x2x3x4"})
    EXPECT_FALSE(parse_gemm_shape(bad).has_value()) << bad;
}

TEST(CpuGemm, PlanRoutesShapesAndFallsBackToTheDefault) {
  const GemmPlan saved = gemm_plan();
  GemmPlan p;
  p.fixed.reset();
  p.table[{false, true, 64, 32, 16}] = GemmLibrary::blis;
  set_gemm_plan(p);
  EXPECT_EQ(gemm_library_for({false, true, 64, 32, 16}), GemmLibrary::blis);
  EXPECT_EQ(gemm_library_for({false, true, 64, 32, 17}), kDefaultGemmLibrary);
  // gemm<float> goes through the plan: the tabled shape still computes the right product.
  std::vector<float> a(64 * 16, 1.f), b(32 * 16, 2.f), c(64 * 32, 0.f);
  gemm<float>(false, true, 64, 32, 16, 1.f, a.data(), 16, b.data(), 16, 0.f, c.data(), 32);
  EXPECT_EQ(c[0], 32.f);
  EXPECT_EQ(c[64 * 32 - 1], 32.f);
  p.fixed = GemmLibrary::onednn;
  set_gemm_plan(p);
  EXPECT_EQ(gemm_library_for({false, true, 64, 32, 16}), GemmLibrary::onednn);
  set_gemm_plan(saved);
}

TEST(CpuGemm, TableTextRoundTripsAndRejectsBadLines) {
  GemmTable t;
  t[{false, false, 3, 4, 5}] = GemmLibrary::libxsmm;
  t[{true, false, 6, 7, 8}] = GemmLibrary::onednn;
  EXPECT_EQ(parse_gemm_table(format_gemm_table(t)), t);
  EXPECT_THROW(parse_gemm_table("NN 3x4x5\tmkl\n"), ValueError);
  EXPECT_EQ(summarize_gemm_table(t), "onednn 1, libxsmm 1");  // most shapes first, ties in library order
}

TEST(CpuGemm, TimingProxyCutsTheBatchDimensionOnly) {
  const GemmShape fc1{false, true, 50176, 384, 96};  // ConvNeXt-T stage 0 fc1 at batch 16
  const GemmShape p = timing_proxy(fc1);
  EXPECT_EQ(p.n, 384);
  EXPECT_EQ(p.k, 96);
  EXPECT_LT(p.m, fc1.m);
  EXPECT_GE(p.m, 1024);
  EXPECT_LE(double(p.m) * p.n * p.k, double(int64_t(1) << 26));
  const GemmShape small{false, false, 64, 32, 16};
  EXPECT_EQ(timing_proxy(small), small);
}

TEST(CpuGemm, TimingGivesAPositiveTimeOnEveryLibrary) {
  for (GemmLibrary lib : kGemmLibraries) EXPECT_GT(time_gemm(lib, {false, true, 64, 48, 32}, 2, 0.01), 0.0);
}

TEST(CpuGemm, CacheKeyNamesTheThreadCountAndTheLibraries) {
  const std::string one = gemm_cache_key(1), two = gemm_cache_key(2);
  EXPECT_NE(one, two);
  EXPECT_NE(one.find("1 threads"), std::string::npos) << one;
  EXPECT_NE(one.find("oneDNN"), std::string::npos) << one;
  EXPECT_NE(one.find("BLIS"), std::string::npos) << one;
  EXPECT_NE(one.find("libxsmm"), std::string::npos) << one;
  EXPECT_EQ(one.find('\t'), std::string::npos);
}

struct CacheDir {
  std::filesystem::path dir;
  CacheDir() {
    dir = std::filesystem::temp_directory_path() / fmt::format("cz_gemm_cache_{}", ::getpid());
    std::filesystem::remove_all(dir);
  }
  ~CacheDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file() const { return (dir / "sub" / "cpu_gemm.tsv").string(); }
};

TEST(CpuGemmCache, RoundTripMeasuresOnlyWhatTheFileLacks) {
  CacheDir d;
  const std::vector<GemmShape> shapes = {{false, true, 64, 32, 16}, {true, false, 32, 16, 64}};
  int calls = 0;
  auto fake = [&](const GemmShape& s) {
    ++calls;
    return s.ta ? GemmLibrary::blis : GemmLibrary::onednn;
  };
  const GemmChoice first = choose_gemms(shapes, d.file(), "key A", fake);
  EXPECT_EQ(first.measured, 2);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(first.warnings.empty());
  EXPECT_EQ(first.table.at(shapes[0]), GemmLibrary::onednn);
  EXPECT_EQ(first.table.at(shapes[1]), GemmLibrary::blis);
  EXPECT_TRUE(first.cached);
  // A second process: everything from the file, whatever a measurement would say now.
  auto never = [&](const GemmShape&) -> GemmLibrary {
    ADD_FAILURE() << "measured a cached shape";
    return GemmLibrary::libxsmm;
  };
  const GemmChoice again = choose_gemms(shapes, d.file(), "key A", never);
  EXPECT_EQ(again.measured, 0);
  EXPECT_EQ(again.table, first.table);
  EXPECT_TRUE(again.cached);
  // One new shape: only it is measured, and the old entries stay as they were.
  std::vector<GemmShape> more = shapes;
  more.push_back({false, false, 8, 8, 8});
  auto xsmm = [&](const GemmShape&) { return GemmLibrary::libxsmm; };
  const GemmChoice grown = choose_gemms(more, d.file(), "key A", xsmm);
  EXPECT_EQ(grown.measured, 1);
  EXPECT_EQ(grown.table.at(shapes[0]), GemmLibrary::onednn);
  EXPECT_EQ(grown.table.at(more[2]), GemmLibrary::libxsmm);
  // Another key (another thread count, say) shares nothing with the first.
  const GemmChoice other = choose_gemms(shapes, d.file(), "key B", xsmm);
  EXPECT_EQ(other.measured, 2);
  EXPECT_EQ(other.table.at(shapes[0]), GemmLibrary::libxsmm);
  EXPECT_EQ(choose_gemms(shapes, d.file(), "key A", never).table.at(shapes[0]), GemmLibrary::onednn);
  EXPECT_FALSE(std::filesystem::exists(d.file() + ".tmp." + std::to_string(::getpid())));
}

TEST(CpuGemmCache, CorruptFileIsReportedAndMeasuredAgain) {
  CacheDir d;
  std::filesystem::create_directories(std::filesystem::path(d.file()).parent_path());
  std::ofstream(d.file()) << "key A\tNN 64x32x16\n";  // a line with a missing field
  const std::vector<GemmShape> shapes = {{false, false, 64, 32, 16}};
  auto blis = [](const GemmShape&) { return GemmLibrary::blis; };
  const GemmChoice c = choose_gemms(shapes, d.file(), "key A", blis);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("corrupt"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[0].find(d.file()), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[0].find("line 1"), std::string::npos) << c.warnings[0];
  EXPECT_EQ(c.measured, 1);
  EXPECT_EQ(c.table.at(shapes[0]), GemmLibrary::blis);
  // The file was replaced by a good one.
  const GemmChoice after = choose_gemms(shapes, d.file(), "key A", [](const GemmShape&) -> GemmLibrary {
    ADD_FAILURE() << "measured again";
    return GemmLibrary::openblas;
  });
  EXPECT_TRUE(after.warnings.empty());
  EXPECT_EQ(after.table.at(shapes[0]), GemmLibrary::blis);
  // An unknown library name is corrupt too.
  std::ofstream(d.file()) << "key A\tNN 64x32x16\tmkl\n";
  EXPECT_EQ(choose_gemms(shapes, d.file(), "key A", blis).warnings.size(), 1u);
}

TEST(CpuGemmCache, UnwritableCacheStillChoosesAndSaysSo) {
  CacheDir d;
  std::filesystem::create_directories(d.dir);
  std::ofstream(d.dir / "file") << "x";
  const std::string path = (d.dir / "file" / "cpu_gemm.tsv").string();  // under a plain file
  const GemmChoice c = choose_gemms({{false, false, 4, 4, 4}}, path, "k",
                                    [](const GemmShape&) { return GemmLibrary::onednn; });
  EXPECT_EQ(c.table.at({false, false, 4, 4, 4}), GemmLibrary::onednn);
  EXPECT_FALSE(c.warnings.empty());
  EXPECT_FALSE(
      c.cached);  // the trainer then keeps the default: a choice no later process could repeat is none
}

}  // namespace
}  // namespace cz::cpu
