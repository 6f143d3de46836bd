// --precision bf16 on the CPU (Note [bf16 on the CPU]): the rounding to bf16 against a scalar reference, the
// bf16 GEMM against the exact GEMM of the rounded operands (every transpose, odd sizes, padded leading
// dimensions, alpha and beta, from inside a parallel region), and the refusal where the CPU has no bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/cpu/blas.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/gemm_bf16.h"

namespace cz::testing {
namespace {

using cpu::MatmulPrecision;

// Round to nearest even, written out independently of the kernel: NaN quiet, denormals to signed zero.
float reference_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (std::isnan(v)) {
    u = (u | 0x00400000u) & 0xffff0000u;
  } else if (std::fpclassify(v) == FP_SUBNORMAL) {
    u &= 0x80000000u;
  } else {
    const uint32_t lower = u & 0xffffu, keep = u & 0xffff0000u;
    const bool up = lower > 0x8000u || (lower == 0x8000u && (keep & 0x10000u));
    u = keep + (up ? 0x10000u : 0u);
  }
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

bool have_bf16() {
  return !cpu::bf16_isa(cpu::cpu_features()).empty();
}

TEST(Bf16Rounding, MatchesRoundToNearestEvenOnEveryKindOfValue) {
  std::mt19937 rng(7);
  std::vector<float> x;
  for (int i = 0; i < 20011; ++i) {  // random bit patterns: normals, denormals, infinities, NaNs
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 1.0f, 1.00390625f /* tie, to even: 1 */, 1.01171875f /* tie, up */,
                  3.4028235e38f /* rounds to inf */, -1e-40f, INFINITY, -INFINITY, NAN})
    x.push_back(f);
  std::vector<uint16_t> y(x.size());
  for (size_t off : {size_t(0), size_t(3)}) {  // a misaligned start and a ragged tail
    cpu::round_to_bf16(x.data() + off, y.data(), int64_t(x.size() - off));
    for (size_t i = off; i < x.size(); ++i) {
      const float want = reference_bf16(x[i]), got = widen(y[i - off]);
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(got)) << i;
      else
        ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "x=" << x[i] << " want " << want << " got " << got;
    }
  }
}

struct Shape {
  int64_t m, n, k;
};

// The exact result (products of bf16 values are exact; summed in double) and, per element, sum |a||b|: the
// scale of fp32 accumulation's error.
void reference_gemm(bool ta, bool tb, const Shape& s, float alpha, const std::vector<float>& a, int64_t lda,
                    const std::vector<float>& b, int64_t ldb, float beta, const std::vector<float>& c0,
                    int64_t ldc, bool round, std::vector<double>& out, std::vector<double>& mag) {
  out.assign(size_t(s.m * ldc), 0);
  mag.assign(size_t(s.m * ldc), 0);
  auto r = [&](float v) { return double(round ? reference_bf16(v) : v); };
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0, abs = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double x = r(ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]);
        const double y = r(tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)]);
        acc += x * y;
        abs += std::fabs(x * y);
      }
      const size_t o = size_t(i * ldc + j);
      out[o] = alpha * acc + beta * double(c0[o]);
      mag[o] = std::fabs(alpha) * abs + std::fabs(beta * double(c0[o]));
    }
}

struct Case {
  bool ta, tb;
  Shape s;
  float alpha, beta;
  int pad;
};

std::vector<Case> cases() {
  const std::vector<Shape> shapes = {{1, 1, 1},      {3, 5, 7},       {17, 33, 65},   {64, 96, 384},
                                     {257, 31, 129}, {32, 1000, 320}, {200, 40, 160}, {7, 130, 1}};
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (size_t i = 0; i < shapes.size(); ++i) {
        const float alpha = i % 2 ? 1.0f : 0.5f, beta = i % 2 ? 1.0f : -2.0f;
        out.push_back({ta, tb, shapes[i], 1.0f, 0.0f, 0});
        out.push_back({ta, tb, shapes[i], alpha, beta, 0});  // dense C: scales and a sum in oneDNN
        out.push_back({ta, tb, shapes[i], alpha, beta, int(i % 3) + 1});  // padded: through a dense C
      }
  return out;
}

// Runs gemm<float> (the hook at its top) on one case, in row tiles from `threads` threads of an OpenMP
// parallel region where threads > 1 (as callers that split the rows do), and checks it.
void check_case(const Case& t, int threads) {
  const Shape& s = t.s;
  const int64_t lda = (t.ta ? s.m : s.k) + t.pad, ldb = (t.tb ? s.k : s.n) + t.pad, ldc = s.n + t.pad;
  std::mt19937 rng(unsigned(s.m * 131 + s.n * 7 + s.k));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(size_t((t.ta ? s.k : s.m) * lda)), b(size_t((t.tb ? s.n : s.k) * ldb)),
      c(size_t(s.m * ldc));
  for (auto* v : {&a, &b, &c})
    for (float& x : *v) x = nd(rng);
  const std::vector<float> c0 = c;
  std::vector<double> want, mag, plain, plain_mag;
  reference_gemm(t.ta, t.tb, s, t.alpha, a, lda, b, ldb, t.beta, c0, ldc, true, want, mag);
  reference_gemm(t.ta, t.tb, s, t.alpha, a, lda, b, ldb, t.beta, c0, ldc, false, plain, plain_mag);
  {
    cpu::ScopedMatmulPrecision bf16(MatmulPrecision::bf16);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t r0 = s.m * id / nt, r1 = s.m * (id + 1) / nt;
      if (r1 > r0) {
        const float* ap = t.ta ? a.data() + r0 : a.data() + r0 * lda;
        cpu::gemm<float>(t.ta, t.tb, r1 - r0, s.n, s.k, t.alpha, ap, lda, b.data(), ldb, t.beta,
                         c.data() + r0 * ldc, ldc);
      }
    }
  }
  // fp32 accumulation of k exact products: at most about k * 2^-24 of sum |a||b| from the exact sum.
  const double eps = std::ldexp(1.0, -24) * double(s.k + 4);
  double worst_plain = 0;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t o = size_t(i * ldc + j);
      if (j >= s.n) {
        ASSERT_EQ(c[o], c0[o]) << "wrote into C's padding at (" << i << ", " << j << ")";
        continue;
      }
      ASSERT_NEAR(c[o], want[o], eps * mag[o] + 1e-30)
          << "(" << i << ", " << j << ") ta " << t.ta << " tb " << t.tb << " m " << s.m << " n " << s.n
          << " k " << s.k << " alpha " << t.alpha << " beta " << t.beta << " threads " << threads;
      worst_plain = std::max(worst_plain, std::fabs(double(c[o]) - plain[o]) / (eps * mag[o] + 1e-30));
    }
  // The operands were rounded: the result is not the fp32 GEMM of the unrounded ones (where there are
  // enough products to tell).
  if (s.m * s.n * s.k >= 1000) EXPECT_GT(worst_plain, 1.0) << "m " << s.m << " n " << s.n << " k " << s.k;
}

TEST(GemmBf16, EqualsTheGemmOfTheRoundedOperands) {
  if (!have_bf16()) GTEST_SKIP() << "this CPU has neither AVX512_BF16 nor AMX";
  for (const Case& t : cases()) check_case(t, 1);
}

TEST(GemmBf16, RowTilesFromInsideAParallelRegion) {
  if (!have_bf16()) GTEST_SKIP() << "this CPU has neither AVX512_BF16 nor AMX";
  for (const Case& t : cases()) check_case(t, 3);
}

TEST(GemmBf16, Fp32PrecisionLeavesGemmUnrounded) {
  cpu::ScopedMatmulPrecision fp32(MatmulPrecision::fp32);
  const float a[2] = {1.00390625f, 1.0f}, b[2] = {1.0f, 1.00390625f};  // 1 + 2^-8 rounds to 1 in bf16
  float c = 0;
  cpu::gemm<float>(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
  EXPECT_EQ(c, 2.0078125f);
  if (!have_bf16()) return;
  cpu::ScopedMatmulPrecision bf16(MatmulPrecision::bf16);
  cpu::gemm<float>(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
  EXPECT_EQ(c, 2.0f);
}

TEST(CpuFeatures, RefusesBf16WhereTheCpuHasNeither) {
  cpu::CpuFeatures none;
  none.model = "Test CPU 9000";
  EXPECT_EQ(cpu::bf16_isa(none), "");
  try {
    cpu::require_bf16(none);
    FAIL() << "no refusal";
  } catch (const std::exception& e) {
    EXPECT_STREQ(
        e.what(),
        "--precision bf16 on the CPU needs AVX512_BF16 or AMX; this CPU (Test CPU 9000) has neither");
  }
  cpu::CpuFeatures avx = none, amx = none;
  avx.avx512_bf16 = amx.avx512_bf16 = amx.amx_bf16 = true;
  EXPECT_EQ(cpu::bf16_isa(avx), "AVX512_BF16");
  EXPECT_EQ(cpu::bf16_isa(amx), "AMX-BF16");
  EXPECT_NO_THROW(cpu::require_bf16(avx));
}

TEST(CpuFeatures, HiddenFeaturesAreNotDetected) {
  const cpu::CpuFeatures all = cpu::detect_cpu_features("");
  EXPECT_FALSE(all.model.empty());
  const cpu::CpuFeatures hidden = cpu::detect_cpu_features("amx_bf16,avx512_bf16");
  EXPECT_FALSE(hidden.avx512_bf16);
  EXPECT_FALSE(hidden.amx_bf16);
  EXPECT_EQ(hidden.model, all.model);
  EXPECT_THROW(cpu::require_bf16(hidden), std::exception);
  const cpu::CpuFeatures no_amx = cpu::detect_cpu_features("amx_bf16");
  EXPECT_FALSE(no_amx.amx_bf16);
  EXPECT_EQ(no_amx.avx512_bf16, all.avx512_bf16);
}

}  // namespace
}  // namespace cz::testing
