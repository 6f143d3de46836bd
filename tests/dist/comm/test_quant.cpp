// Block-quantized INT8 (Note [Quantized blocks], dist/comm/quant.h): the host kernels against scalar
// definitions bit for bit, round-trip error bounds, non-finite and tiny blocks, the per-hop step of a
// quantized reduction, error feedback, and the CUDA kernels' per-thread code run on the CPU for every thread
// (the emulation of cuda/quant_kernels.cu, as tests/tensor/depthwise_emulation.h does for the depthwise
// kernels).
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "dist/comm/quant.h"
#include "tensor/check.h"
#include "tensor/half.h"

namespace cz::dist {
namespace {

constexpr int64_t kBlocks[] = {32, 64, 128, 256, 1024, 4096};
constexpr int64_t kLengths[] = {0, 1, 31, 33, 100, 1000, 4097, 10007, 70001};  // 70001: OpenMP splits it

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Normal values with a few blocks scaled far apart, and an exact zero block: blocks of different peaks.
std::vector<float> test_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t region = (i / 700) % 5;
    const float scale = region == 1 ? 1e-6f : region == 3 ? 300.f : 1.f;
    v[size_t(i)] = region == 4 && i % 700 < 64 ? 0.f : normal(gen) * scale;
  }
  return v;
}

// --- Scalar definitions (Note [Quantized blocks]), written without quant_block.h ---------------------------

float ref_scale(const float* x, int64_t len) {
  float amax = 0.f;
  bool nan = false, inf = false;
  for (int64_t i = 0; i < len; ++i) {
    if (std::isnan(x[i])) nan = true;
    if (std::isinf(x[i])) inf = true;
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  if (inf) return std::numeric_limits<float>::infinity();
  return amax < 127.f * FLT_MIN ? 0.f : amax / 127.f;
}

void ref_quantize(const float* x, int64_t n, int64_t block, std::vector<int8_t>& q,
                  std::vector<float>& scales) {
  q.assign(size_t(n), 0);
  scales.assign(size_t(quant_scale_count(n, block)), 0.f);
  for (int64_t k = 0; k * block < n; ++k) {
    const int64_t first = k * block, len = std::min(block, n - first);
    const float s = ref_scale(x + first, len);
    scales[size_t(k)] = s;
    if (!(s > 0.f) || std::isinf(s)) continue;  // zero, tiny or non-finite: all codes 0
    const float inv = 1.f / s;
    for (int64_t i = first; i < first + len; ++i) q[size_t(i)] = int8_t(std::nearbyint(x[i] * inv));
  }
}

float ref_dequantize(int8_t q, float s) {
  return float(q) * s;
}

template <class T>
std::vector<T> cast(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = T(v[i]);
  return out;
}
template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
  return out;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(bits(got[i]), bits(want[i])) << what << " at " << i << ": " << got[i] << " vs " << want[i];
}

// --- Quantize and dequantize against the definitions ------------------------------------------------------

template <class T>
void check_quantize(DType dtype) {
  for (int64_t block : kBlocks)
    for (int64_t n : kLengths) {
      const auto x = cast<T>(test_values(n, uint32_t(n + block)));
      const auto xf = widen(x);
      std::vector<int8_t> q(static_cast<size_t>(n)), want_q;
      std::vector<float> scales(size_t(quant_scale_count(n, block))), want_s;
      quantize(dtype, x.data(), n, block, q.data(), scales.data());
      ref_quantize(xf.data(), n, block, want_q, want_s);
      const std::string what = fmt::format("{} n={} B={}", dtype_name(dtype), n, block);
      ASSERT_EQ(q, want_q) << what;
      expect_same_bits(scales, want_s, what + " scales");
      for (int8_t c : q) ASSERT_GE(c, -127) << what;  // symmetric: -128 is never used

      std::vector<T> out(static_cast<size_t>(n));
      dequantize(q.data(), scales.data(), n, block, dtype, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const T want = T(ref_dequantize(q[size_t(i)], scales[size_t(i / block)]));
        ASSERT_EQ(bits(float(out[size_t(i)])), bits(float(want))) << what << " dequantized at " << i;
      }
    }
}

// One test an input dtype: suite.f32_name runs check<float>(f32), and so on for bf16 and f16.
#define TEST_EACH_DTYPE(suite, f32_name, bf16_name, f16_name, check) \
  TEST(suite, f32_name) {                                            \
    check<float>(DType::f32);                                        \
  }                                                                  \
  TEST(suite, bf16_name) {                                           \
    check<BFloat16>(DType::bf16);                                    \
  }                                                                  \
  TEST(suite, f16_name) {                                            \
    check<Half>(DType::f16);                                         \
  }

TEST_EACH_DTYPE(Quant, QuantizeF32MatchesDefinition, QuantizeBf16MatchesDefinition,
                QuantizeF16MatchesDefinition, check_quantize)

TEST(Quant, DequantizeIntoEveryDtype) {
  const int64_t n = 5000, block = 128;
  const auto x = test_values(n, 7);
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> s(size_t(quant_scale_count(n, block)));
  quantize(DType::f32, x.data(), n, block, q.data(), s.data());
  std::vector<float> f(static_cast<size_t>(n));
  std::vector<BFloat16> b(static_cast<size_t>(n));
  std::vector<Half> h(static_cast<size_t>(n));
  dequantize(q.data(), s.data(), n, block, DType::f32, f.data());
  dequantize(q.data(), s.data(), n, block, DType::bf16, b.data());
  dequantize(q.data(), s.data(), n, block, DType::f16, h.data());
  for (int64_t i = 0; i < n; ++i) {  // one rounding from the f32 value
    ASSERT_EQ(b[size_t(i)].bits, BFloat16(f[size_t(i)]).bits) << i;
    ASSERT_EQ(h[size_t(i)].bits, Half(f[size_t(i)]).bits) << i;
  }
}

// --- Round-trip error --------------------------------------------------------------------------------------

TEST(Quant, RoundTripWithinHalfAScale) {
  for (int64_t block : kBlocks)
    for (int64_t n : {int64_t(1), int64_t(33), int64_t(4097), int64_t(70001)}) {
      const auto x = test_values(n, uint32_t(3 * n + block));
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> s(size_t(quant_scale_count(n, block))), y(static_cast<size_t>(n));
      quantize(DType::f32, x.data(), n, block, q.data(), s.data());
      dequantize(q.data(), s.data(), n, block, DType::f32, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const float scale = s[size_t(i / block)];
        const double err = std::fabs(double(x[size_t(i)]) - double(y[size_t(i)]));
        ASSERT_LE(err, double(scale) * (0.5 + std::ldexp(1.0, -15)))
            << "n=" << n << " B=" << block << " i=" << i;
      }
    }
}

// Relative L2 error on normal data: uniform rounding error of a scale s has RMS s / sqrt(12), and s is the
// block's peak / 127, about 3.1 sigma / 127 at B = 256, so about 0.7%; larger blocks have larger peaks.
TEST(Quant, RelativeErrorOnNormalData) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.f, 0.02f);
  const int64_t n = 1 << 18;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(gen);
  double prev = 0;
  for (int64_t block : kBlocks) {
    std::vector<int8_t> q(static_cast<size_t>(n));
    std::vector<float> s(size_t(quant_scale_count(n, block))), y(static_cast<size_t>(n));
    quantize(DType::f32, x.data(), n, block, q.data(), s.data());
    dequantize(q.data(), s.data(), n, block, DType::f32, y.data());
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      num += std::pow(double(x[size_t(i)]) - y[size_t(i)], 2);
      den += std::pow(double(x[size_t(i)]), 2);
    }
    const double rel = std::sqrt(num / den);
    EXPECT_LT(rel, 0.0105) << "B=" << block;  // B = 4096: peak about 3.9 sigma, 0.9%
    EXPECT_GT(rel, prev) << "B=" << block << ": larger blocks have larger peaks";
    prev = rel;
  }
}

// --- Edge cases
// ----------------------------------------------------------------------------------------------

TEST(Quant, NonFiniteBlocksDequantizeToNaN) {
  const int64_t n = 256, block = 64;
  auto x = test_values(n, 5);
  x[10] = std::numeric_limits<float>::quiet_NaN();   // block 0
  x[70] = std::numeric_limits<float>::infinity();    // block 1
  x[140] = -std::numeric_limits<float>::infinity();  // block 2
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> s(4), y(static_cast<size_t>(n));
  quantize(DType::f32, x.data(), n, block, q.data(), s.data());
  EXPECT_TRUE(std::isnan(s[0]));
  EXPECT_TRUE(std::isinf(s[1]) && s[1] > 0);
  EXPECT_TRUE(std::isinf(s[2]) && s[2] > 0);
  EXPECT_TRUE(std::isfinite(s[3]));
  for (int64_t i = 0; i < 192; ++i) ASSERT_EQ(q[size_t(i)], 0) << i;
  dequantize(q.data(), s.data(), n, block, DType::f32, y.data());
  for (int64_t i = 0; i < 192; ++i)
    ASSERT_TRUE(std::isnan(y[size_t(i)])) << "a non-finite block leaks a finite value at " << i;
  for (int64_t i = 192; i < n; ++i) ASSERT_TRUE(std::isfinite(y[size_t(i)])) << i;
  // In 16-bit outputs too, and through the per-hop step (NaN stays NaN in the sum and the next scale).
  std::vector<BFloat16> yb(static_cast<size_t>(n));
  dequantize(q.data(), s.data(), n, block, DType::bf16, yb.data());
  EXPECT_TRUE(std::isnan(float(yb[0])));
  std::vector<float> zeros(size_t(n), 0.f), sum(static_cast<size_t>(n)), s2(4);
  std::vector<int8_t> q2(static_cast<size_t>(n));
  dequantize_add_quantize(q.data(), s.data(), zeros.data(), n, block, q2.data(), s2.data(), sum.data());
  EXPECT_TRUE(std::isnan(sum[5]) && std::isnan(s2[0]) && std::isnan(s2[1]) && std::isfinite(s2[3]));
}

TEST(Quant, ZeroAndTinyBlocksAreZeros) {
  EXPECT_EQ(quant::kMinAmaxBits, bits(127.f * FLT_MIN));
  const int64_t block = 32;
  std::vector<float> x(96, 0.f);
  for (int i = 32; i < 64; ++i) x[size_t(i)] = (i % 2 ? 1.f : -1.f) * 1e-37f;  // below 127 FLT_MIN
  for (int i = 64; i < 96; ++i) x[size_t(i)] = (i % 2 ? 1.f : -1.f) * 1e-35f;  // above: a normal scale
  std::vector<int8_t> q(96);
  std::vector<float> s(3), y(96);
  quantize(DType::f32, x.data(), 96, block, q.data(), s.data());
  EXPECT_EQ(s[0], 0.f);
  EXPECT_EQ(s[1], 0.f);
  EXPECT_GE(s[2], FLT_MIN);
  dequantize(q.data(), s.data(), 96, block, DType::f32, y.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(y[size_t(i)], 0.f) << i;
  for (int i = 64; i < 96; ++i) EXPECT_EQ(y[size_t(i)], x[size_t(i)]) << i;  // +-peak: code +-127 exactly
}

TEST(Quant, SymmetricAndTiesToEven) {
  // A block with peak 127: scale 1, so the codes are the values rounded; .5 ties go to the even integer.
  std::vector<float> x = {127.f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -127.f};
  x.resize(32, 0.f);
  std::vector<int8_t> q(32);
  float s = 0;
  quantize(DType::f32, x.data(), 32, 32, q.data(), &s);
  EXPECT_EQ(s, 1.f);
  const std::vector<int8_t> want = {127, 2, 4, -2, 0, 0, 2, -127};
  EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 8), want);
}

TEST(Quant, BadArgumentsAreRefused) {
  std::vector<float> x(64);
  std::vector<int8_t> q(64);
  float s[2];
  for (int64_t block : {0, 16, 48 + 1, 8192})
    EXPECT_THROW(quantize(DType::f32, x.data(), 64, block, q.data(), s), ValueError) << block;
  try {
    quantize(DType::f32, x.data(), 64, 100, q.data(), s);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32 in [32, 4096], got 100"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(quantize(DType::f64, x.data(), 64, 32, q.data(), s), DtypeError);
  EXPECT_THROW(dequantize(q.data(), s, 64, 32, DType::i32, x.data()), DtypeError);
}

TEST(Quant, SameBitsOnAnyThreadCount) {
  const int64_t n = 200003, block = 128;
  const auto x = test_values(n, 9);
  std::vector<int8_t> q1(static_cast<size_t>(n)), q2(static_cast<size_t>(n));
  std::vector<float> s1(size_t(quant_scale_count(n, block))), s2(s1.size());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  quantize(DType::f32, x.data(), n, block, q1.data(), s1.data());
  omp_set_num_threads(std::max(2, threads));
  quantize(DType::f32, x.data(), n, block, q2.data(), s2.data());
  omp_set_num_threads(threads);
  EXPECT_EQ(q1, q2);
  expect_same_bits(s1, s2, "scales");
}

TEST(Quant, PackedRecordLayout) {
  EXPECT_EQ(quant_scales_offset(5), 8);
  EXPECT_EQ(quant_packed_bytes(5, 32), 12);
  EXPECT_EQ(quant_packed_bytes(256, 256), 260);
  EXPECT_EQ(quant_packed_bytes(0, 256), 0);
}

// --- The per-hop step and error feedback -------------------------------------------------------------------

TEST(Quant, DequantizeAddQuantizeMatchesDefinition) {
  for (int64_t block : {int64_t(32), int64_t(256), int64_t(4096)})
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(70001)}) {
      const auto a = test_values(n, 21), b = test_values(n, 22), c = test_values(n, 23);
      std::vector<int8_t> aq, cq;
      std::vector<float> as, cs;
      ref_quantize(a.data(), n, block, aq, as);
      ref_quantize(c.data(), n, block, cq, cs);
      // deq(a) + b, and deq(a) + deq(c), by definition: one fma.
      std::vector<float> v1(static_cast<size_t>(n)), v2(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        v1[size_t(i)] = std::fma(float(aq[size_t(i)]), as[size_t(i / block)], b[size_t(i)]);
        v2[size_t(i)] = std::fma(float(aq[size_t(i)]), as[size_t(i / block)],
                                 float(cq[size_t(i)]) * cs[size_t(i / block)]);
      }
      std::vector<int8_t> want_q1, want_q2;
      std::vector<float> want_s1, want_s2;
      ref_quantize(v1.data(), n, block, want_q1, want_s1);
      ref_quantize(v2.data(), n, block, want_q2, want_s2);

      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> s(as.size()), sum(static_cast<size_t>(n));
      dequantize_add_quantize(aq.data(), as.data(), b.data(), n, block, q.data(), s.data(), sum.data());
      EXPECT_EQ(q, want_q1);
      expect_same_bits(s, want_s1, "scales");
      expect_same_bits(sum, v1, "sum");
      // In place (q == aq, scales == a_scales, sum == b), and the sum alone.
      auto aq2 = aq;
      auto as2 = as;
      auto b2 = b;
      dequantize_add_quantize(aq2.data(), as2.data(), b2.data(), n, block, aq2.data(), as2.data(), b2.data());
      EXPECT_EQ(aq2, want_q1);
      expect_same_bits(as2, want_s1, "in-place scales");
      expect_same_bits(b2, v1, "in-place sum");
      std::vector<float> sum_only(static_cast<size_t>(n));
      dequantize_add_quantize(aq.data(), as.data(), b.data(), n, block, nullptr, nullptr, sum_only.data());
      expect_same_bits(sum_only, v1, "sum only");

      dequantize_add_quantize(aq.data(), as.data(), cq.data(), cs.data(), n, block, q.data(), s.data(),
                              sum.data());
      EXPECT_EQ(q, want_q2);
      expect_same_bits(s, want_s2, "scales (two quantized)");
      expect_same_bits(sum, v2, "sum (two quantized)");
    }
}

// The planned quantized reduce-scatter on a ring of P ranks (Note [Quantized reduction] in docs/zero.md): a
// chunk starts as Q(x_1), every hop adds its rank's f32 values to the dequantized partial sum and quantizes
// again, the owner adds its own values and keeps the f32 sum. The error stays within the sum of the hops'
// bounds (half a scale of each partial sum's block): hops add their errors, they do not compound.
TEST(Quant, RingReductionErrorIsTheSumOfPerHopBounds) {
  const int64_t n = 1 << 14, block = 256;
  std::mt19937 gen(4);
  std::normal_distribution<float> normal(0.f, 1e-3f);
  for (int ranks : {2, 4, 8}) {
    std::vector<std::vector<float>> x(size_t(ranks), std::vector<float>(static_cast<size_t>(n)));
    for (auto& r : x)
      for (auto& v : r) v = normal(gen);
    std::vector<int8_t> q(static_cast<size_t>(n));
    std::vector<float> s(size_t(quant_scale_count(n, block))), bound(size_t(n), 0.f),
        sum(static_cast<size_t>(n));
    quantize(DType::f32, x[0].data(), n, block, q.data(), s.data());
    auto add_bound = [&] {
      for (int64_t i = 0; i < n; ++i)
        bound[size_t(i)] += s[size_t(i / block)] * (0.5f + std::ldexp(1.f, -15));
    };
    add_bound();
    for (int r = 1; r < ranks - 1; ++r) {
      dequantize_add_quantize(q.data(), s.data(), x[size_t(r)].data(), n, block, q.data(), s.data());
      add_bound();
    }
    dequantize_add_quantize(q.data(), s.data(), x[size_t(ranks - 1)].data(), n, block, nullptr, nullptr,
                            sum.data());
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int r = 0; r < ranks; ++r) exact += x[size_t(r)][size_t(i)];
      const double err = std::fabs(sum[size_t(i)] - exact);
      // The f32 additions themselves add up to one rounding of the sum per hop.
      ASSERT_LE(err, bound[size_t(i)] + ranks * std::ldexp(std::fabs(exact) + 1e-3, -23))
          << ranks << " " << i;
      num += std::pow(sum[size_t(i)] - exact, 2);
      den += exact * exact;
    }
    // Hop k quantizes a partial sum of k ranks' values (RMS error growing as sqrt(k) times one quantization's
    // e1, about 0.66% at B = 256), so relative to the sum of P the error is e1 sqrt((P - 1) / 2): 0.47%,
    // 0.81%, 1.2% at 2, 4, 8 ranks.
    const double rel = std::sqrt(num / den);
    EXPECT_LT(rel, 0.0075 * std::sqrt((ranks - 1) / 2.0)) << ranks << " ranks";
    std::printf("[quant ring] %d ranks, B=%lld: relative L2 error %.4f%%\n", ranks, (long long)block,
                rel * 100);
  }
}

// Error feedback: what the receiver gets over T steps adds up to the sum of the inputs minus the last
// residual, so the accumulated error stays at one quantization's, where without feedback it grows with T.
TEST(Quant, ErrorFeedbackKeepsTheAccumulatedErrorBounded) {
  const int64_t n = 4096, block = 256;
  const int steps = 50;
  std::mt19937 gen(8);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> residual(size_t(n), 0.f), x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::vector<double> sent_fb(size_t(n), 0), sent_plain(size_t(n), 0), exact(size_t(n), 0);
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> s(size_t(quant_scale_count(n, block)));
  for (int t = 0; t < steps; ++t) {
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = 0.01f + normal(gen) * 0.1f;  // a small bias under noise
    for (int64_t i = 0; i < n; ++i) exact[size_t(i)] += x[size_t(i)];
    quantize_with_feedback(x.data(), residual.data(), n, block, q.data(), s.data());
    dequantize(q.data(), s.data(), n, block, DType::f32, y.data());
    for (int64_t i = 0; i < n; ++i) sent_fb[size_t(i)] += y[size_t(i)];
    quantize(DType::f32, x.data(), n, block, q.data(), s.data());
    dequantize(q.data(), s.data(), n, block, DType::f32, y.data());
    for (int64_t i = 0; i < n; ++i) sent_plain[size_t(i)] += y[size_t(i)];
  }
  double fb = 0, plain = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Telescoping: sent = exact - residual, up to the f32 roundings of x + r (one per step).
    ASSERT_NEAR(sent_fb[size_t(i)] + residual[size_t(i)], exact[size_t(i)], 1e-4) << i;
    fb += std::pow(sent_fb[size_t(i)] - exact[size_t(i)], 2);
    plain += std::pow(sent_plain[size_t(i)] - exact[size_t(i)], 2);
  }
  EXPECT_LT(fb * 4, plain) << "feedback should leave far less accumulated error";
  std::printf("[quant feedback] RMS of the error summed over %d steps: %.3g with feedback, %.3g without\n",
              steps, std::sqrt(fb / double(n)), std::sqrt(plain / double(n)));
}

TEST(Quant, ErrorFeedbackResetsANonFiniteBlock) {
  const int64_t n = 64, block = 32;
  std::vector<float> x(size_t(n), 0.3f), residual(size_t(n), 0.001f);
  x[3] = std::numeric_limits<float>::infinity();
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> s(2);
  quantize_with_feedback(x.data(), residual.data(), n, block, q.data(), s.data());
  EXPECT_TRUE(std::isinf(s[0]));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(residual[size_t(i)], 0.f) << i;
  for (int i = 32; i < 64; ++i)
    EXPECT_TRUE(std::isfinite(residual[size_t(i)]) && residual[size_t(i)] != 0.001f);
}

// --- The CUDA kernels' per-thread code, run on the CPU
// ------------------------------------------------------

struct HostCvt {
  static float in(float v) { return v; }
  static float in(BFloat16 v) { return float(v); }
  static float in(Half v) { return float(v); }
};

// What cuda/quant_kernels.cu's quantize_kernel computes: every CUDA block (one quantized block), phase 1 for
// every thread, the block maximum (on the GPU by shuffles and shared memory; the maximum of bits is exact in
// any order), phase 2 for every thread, then thread 0's scale.
// The CUDA kernels' block loop run on the host, thread by thread: int8 codes (one a byte) or int4 codes
// (packed two a byte, `Code` = uint8_t).
template <class Blocks, class Code>
void emulate_quantize(const Blocks& blocks, int64_t n, int64_t block, Code* codes, float* scales) {
  constexpr bool int4 = std::is_same_v<Code, uint8_t>;
  const int threads = quant::quant_threads(block);
  for (int64_t k = 0; k < quant::block_count(n, block); ++k) {
    const int64_t first = k * block, len = std::min(block, n - first);
    const auto src = blocks(k, first);
    uint32_t m = 0;
    for (int tid = 0; tid < threads; ++tid)
      m = quant::max_bits(m, quant::thread_amax(src, len, tid, threads));
    const float scale = int4 ? quant::block_scale4(m) : quant::block_scale(m);
    for (int tid = 0; tid < threads; ++tid) {
      if constexpr (int4)
        quant::thread_quantize4(src, len, scale, codes + first / 2, tid, threads);
      else
        quant::thread_quantize(src, len, scale, codes + first, tid, threads);
    }
    scales[k] = scale;
  }
}

template <class T>
void check_emulated_quantize(DType dtype) {
  for (int64_t block : kBlocks)
    for (int64_t n : {int64_t(1), int64_t(33), int64_t(4097), int64_t(10007)}) {
      auto xf = test_values(n, uint32_t(n * 7 + block));
      if (n > 40) xf[40] = std::numeric_limits<float>::quiet_NaN();
      const auto x = cast<T>(xf);
      std::vector<int8_t> q(static_cast<size_t>(n)), eq(static_cast<size_t>(n));
      std::vector<float> s(size_t(quant_scale_count(n, block))), es(s.size());
      quantize(dtype, x.data(), n, block, q.data(), s.data());
      emulate_quantize(quant::InputBlocks<T, HostCvt>{x.data()}, n, block, eq.data(), es.data());
      ASSERT_EQ(q, eq) << dtype_name(dtype) << " n=" << n << " B=" << block;
      expect_same_bits(s, es, "emulated scales");
      // dequantize_kernel, one thread per element (its bf16/f16 stores round to nearest even, as the host's).
      std::vector<float> y(static_cast<size_t>(n));
      dequantize(q.data(), s.data(), n, block, DType::f32, y.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(quant::dequantize_element(eq.data(), es.data(), block, i)), bits(y[size_t(i)])) << i;
    }
}

TEST_EACH_DTYPE(QuantCudaEmulation, QuantizeF32, QuantizeBf16, QuantizeF16, check_emulated_quantize)

TEST(QuantCudaEmulation, PerHopStepAndFeedback) {
  for (int64_t block : kBlocks) {
    const int64_t n = 9001;
    const auto a = test_values(n, 31), b = test_values(n, 32), c = test_values(n, 33);
    std::vector<int8_t> aq(static_cast<size_t>(n)), cq(static_cast<size_t>(n));
    std::vector<float> as(size_t(quant_scale_count(n, block))), cs(as.size());
    quantize(DType::f32, a.data(), n, block, aq.data(), as.data());
    quantize(DType::f32, c.data(), n, block, cq.data(), cs.data());
    std::vector<int8_t> q(static_cast<size_t>(n)), eq(static_cast<size_t>(n));
    std::vector<float> s(as.size()), es(as.size()), sum(static_cast<size_t>(n)), esum(static_cast<size_t>(n));

    dequantize_add_quantize(aq.data(), as.data(), b.data(), n, block, q.data(), s.data(), sum.data());
    emulate_quantize(quant::AddBlocks{aq.data(), as.data(), b.data(), esum.data()}, n, block, eq.data(),
                     es.data());
    ASSERT_EQ(q, eq) << block;
    expect_same_bits(s, es, "add: scales");
    expect_same_bits(sum, esum, "add: sum");

    dequantize_add_quantize(aq.data(), as.data(), cq.data(), cs.data(), n, block, q.data(), s.data(),
                            sum.data());
    emulate_quantize(quant::AddQuantizedBlocks{aq.data(), as.data(), cq.data(), cs.data(), esum.data()}, n,
                     block, eq.data(), es.data());
    ASSERT_EQ(q, eq) << block;
    expect_same_bits(s, es, "add quantized: scales");
    expect_same_bits(sum, esum, "add quantized: sum");

    std::vector<float> r(size_t(n), 0.01f), er = r;
    quantize_with_feedback(b.data(), r.data(), n, block, q.data(), s.data());
    emulate_quantize(quant::FeedbackBlocks{b.data(), er.data()}, n, block, eq.data(), es.data());
    ASSERT_EQ(q, eq) << block;
    expect_same_bits(s, es, "feedback: scales");
    expect_same_bits(r, er, "feedback: residual");
  }
}

// --- INT4 (Note [INT4 blocks])
// -------------------------------------------------------------------------------

float ref_scale4(const float* x, int64_t len) {
  const float s127 = ref_scale(x, len);
  if (std::isnan(s127) || std::isinf(s127)) return s127;
  float amax = 0.f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax < 7.f * FLT_MIN ? 0.f : amax / 7.f;
}

void ref_quantize4(const float* x, int64_t n, int64_t block, std::vector<uint8_t>& packed,
                   std::vector<float>& scales) {
  packed.assign(size_t((n + 1) / 2), 0);
  scales.assign(size_t(quant_scale_count(n, block)), 0.f);
  for (int64_t k = 0; k * block < n; ++k) {
    const int64_t first = k * block, len = std::min(block, n - first);
    const float s = ref_scale4(x + first, len);
    scales[size_t(k)] = s;
    if (!(s > 0.f) || std::isinf(s)) continue;
    const float inv = 1.f / s;
    for (int64_t i = first; i < first + len; ++i) {
      const int q = int(std::nearbyint(x[i] * inv));
      EXPECT_TRUE(q >= -7 && q <= 7) << q;
      packed[size_t(i / 2)] |= uint8_t((q & 0xf) << (i % 2 ? 4 : 0));
    }
  }
}
float ref_code4(const std::vector<uint8_t>& packed, int64_t i) {
  const int nib = (packed[size_t(i / 2)] >> (i % 2 ? 4 : 0)) & 0xf;
  return float(nib >= 8 ? nib - 16 : nib);
}

template <class T>
void check_quantize4(DType dtype) {
  for (int64_t block : kBlocks)
    for (int64_t n : kLengths) {
      const auto x = cast<T>(test_values(n, uint32_t(n + 5 * block)));
      const auto xf = widen(x);
      std::vector<uint8_t> packed(size_t(quant4_code_bytes(n))), want_p;
      std::vector<float> scales(size_t(quant_scale_count(n, block))), want_s;
      quantize_int4(dtype, x.data(), n, block, packed.data(), scales.data());
      ref_quantize4(xf.data(), n, block, want_p, want_s);
      const std::string what = fmt::format("int4 {} n={} B={}", dtype_name(dtype), n, block);
      ASSERT_EQ(packed, want_p) << what;
      expect_same_bits(scales, want_s, what + " scales");
      std::vector<T> out(static_cast<size_t>(n));
      dequantize_int4(packed.data(), scales.data(), n, block, dtype, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const T want = T(ref_code4(packed, i) * scales[size_t(i / block)]);
        ASSERT_EQ(bits(float(out[size_t(i)])), bits(float(want))) << what << " dequantized at " << i;
        if (dtype == DType::f32 && std::isfinite(scales[size_t(i / block)])) {
          ASSERT_LE(std::fabs(double(xf[size_t(i)]) - double(float(out[size_t(i)]))),
                    double(scales[size_t(i / block)]) * (0.5 + std::ldexp(1.0, -15)))
              << what << " at " << i;
        }
      }
    }
}

TEST_EACH_DTYPE(Quant4, QuantizeF32MatchesDefinition, QuantizeBf16MatchesDefinition,
                QuantizeF16MatchesDefinition, check_quantize4)

TEST(Quant4, NibbleOrderAndEdges) {
  EXPECT_EQ(quant::kMinAmaxBits4, bits(7.f * FLT_MIN));
  std::vector<float> x = {7.f, -7.f, 2.5f, -1.f, 3.5f};  // peak 7: scale 1; ties to even; odd length
  x.resize(33, 0.f);
  x[32] = -2.f;  // block 1 (B = 32) of one value: scale 2/7, code -7 in the low nibble, high nibble 0
  std::vector<uint8_t> p(size_t(quant4_code_bytes(33)));
  float s[2];
  quantize_int4(DType::f32, x.data(), 33, 32, p.data(), s);
  EXPECT_EQ(s[0], 1.f);
  EXPECT_EQ(p[0], 0x97);  // 7 low, -7 (0x9) high
  EXPECT_EQ(p[1], 0xf2);  // 2 low, -1 high
  EXPECT_EQ(p[2], 0x04);  // 4 low (3.5 to even), 0 high
  EXPECT_EQ(p[16], 0x09);
  EXPECT_EQ(quant4_packed_bytes(33, 32), 20 + 8);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  quantize_int4(DType::f32, x.data(), 33, 32, p.data(), s);
  std::vector<float> y(33);
  dequantize_int4(p.data(), s, 33, 32, DType::f32, y.data());
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(y[size_t(i)])) << i;
  EXPECT_FLOAT_EQ(y[32], -2.f);
}

TEST(Quant4, RelativeErrorOnNormalData) {
  std::mt19937 gen(12);
  std::normal_distribution<float> normal(0.f, 0.02f);
  const int64_t n = 1 << 18;
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  for (auto& v : x) v = normal(gen);
  for (int64_t block : {int64_t(32), int64_t(256)}) {
    std::vector<uint8_t> p(size_t(quant4_code_bytes(n)));
    std::vector<float> s(size_t(quant_scale_count(n, block)));
    quantize_int4(DType::f32, x.data(), n, block, p.data(), s.data());
    dequantize_int4(p.data(), s.data(), n, block, DType::f32, y.data());
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      num += std::pow(double(x[size_t(i)]) - y[size_t(i)], 2);
      den += std::pow(double(x[size_t(i)]), 2);
    }
    // 127 / 7 times INT8's error: about 9.5% at B = 32 and 12.6% at B = 256.
    const double rel = std::sqrt(num / den);
    EXPECT_LT(rel, block == 32 ? 0.105 : 0.14) << block;
    std::printf("[quant int4] normal data, B=%lld: relative L2 error %.2f%%\n", (long long)block, rel * 100);
  }
}

template <class T>
void check_emulated_quantize4(DType dtype) {
  for (int64_t block : kBlocks)
    for (int64_t n : {int64_t(1), int64_t(33), int64_t(4097), int64_t(10007)}) {
      auto xf = test_values(n, uint32_t(n * 3 + block));
      if (n > 40) xf[40] = std::numeric_limits<float>::infinity();
      const auto x = cast<T>(xf);
      std::vector<uint8_t> p(size_t(quant4_code_bytes(n))), ep(p.size());
      std::vector<float> s(size_t(quant_scale_count(n, block))), es(s.size()), y(static_cast<size_t>(n));
      quantize_int4(dtype, x.data(), n, block, p.data(), s.data());
      emulate_quantize(quant::InputBlocks<T, HostCvt>{x.data()}, n, block, ep.data(), es.data());
      ASSERT_EQ(p, ep) << dtype_name(dtype) << " n=" << n << " B=" << block;
      expect_same_bits(s, es, "emulated int4 scales");
      dequantize_int4(p.data(), s.data(), n, block, DType::f32, y.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(quant::dequantize_element4(ep.data(), es.data(), block, i)), bits(y[size_t(i)])) << i;
    }
}

TEST(QuantCudaEmulation, QuantizeInt4) {
  check_emulated_quantize4<float>(DType::f32);
  check_emulated_quantize4<BFloat16>(DType::bf16);
  check_emulated_quantize4<Half>(DType::f16);
}

}  // namespace
}  // namespace cz::dist
