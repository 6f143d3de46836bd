// The host reduction kernels against a scalar reference, for every dtype, odd lengths (vector tails),
// aliasing and scaling; plus the shard arithmetic, enum names, and the poller's deadline and abort.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dist/comm/progress.h"
#include "dist/comm/reduce_kernels.h"
#include "dist/comm/types.h"
#include "tensor/check.h"

namespace cz::dist {
namespace {

template <class T>
std::vector<T> random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(0.05f, 4.0f);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = T((gen() & 1) ? dist(gen) : -dist(gen));
  return v;
}

template <class T>
void check_add(DType dt, int64_t n, double scale) {
  const auto a = random_values<T>(n, 1), b = random_values<T>(n, 2);
  std::vector<T> out(static_cast<size_t>(n)), alias = a;
  reduce_add(dt, out.data(), a.data(), b.data(), n, scale);
  reduce_add(dt, alias.data(), alias.data(), b.data(), n, scale);  // dst == a
  for (int64_t i = 0; i < n; ++i) {
    // The contract: widen to f32 (f64 stays f64), add and scale there, round once.
    T want;
    if constexpr (std::is_same_v<T, double>) {
      want = scale == 1.0 ? a[size_t(i)] + b[size_t(i)] : (a[size_t(i)] + b[size_t(i)]) * scale;
    } else {
      const float s = float(a[size_t(i)]) + float(b[size_t(i)]);
      want = T(scale == 1.0 ? s : s * float(scale));
    }
    ASSERT_EQ(double(out[size_t(i)]), double(want)) << dtype_name(dt) << " n=" << n << " i=" << i;
    ASSERT_EQ(double(alias[size_t(i)]), double(want)) << dtype_name(dt) << " aliased, i=" << i;
  }
}

template <class T>
void check_scale(DType dt, int64_t n, double scale) {
  const auto a = random_values<T>(n, 3);
  std::vector<T> out = a;
  scale_copy(dt, out.data(), out.data(), n, scale);
  for (int64_t i = 0; i < n; ++i) {
    T want;
    if constexpr (std::is_same_v<T, double>)
      want = a[size_t(i)] * scale;
    else
      want = T(float(a[size_t(i)]) * float(scale));
    ASSERT_EQ(double(out[size_t(i)]), double(want)) << dtype_name(dt) << " i=" << i;
  }
}

TEST(ReduceKernels, MatchScalarReferenceForEveryDtype) {
  for (int64_t n : {1, 7, 8, 15, 16, 17, 63, 1000, 4099}) {
    for (double scale : {1.0, 0.25, 1.0 / 3}) {
      check_add<float>(DType::f32, n, scale);
      check_add<double>(DType::f64, n, scale);
      check_add<Half>(DType::f16, n, scale);
      check_add<BFloat16>(DType::bf16, n, scale);
      check_scale<float>(DType::f32, n, scale);
      check_scale<double>(DType::f64, n, scale);
      check_scale<Half>(DType::f16, n, scale);
      check_scale<BFloat16>(DType::bf16, n, scale);
    }
  }
}

TEST(ReduceKernels, SpecialValuesRoundLikeTheStorageTypes) {
  // Overflow to inf, NaN stays NaN, subnormal halves.
  const std::vector<Half> a = {Half(60000.f), Half(NAN), Half(6e-8f), Half(-0.f)};
  const std::vector<Half> b = {Half(60000.f), Half(1.f), Half(6e-8f), Half(-0.f)};
  std::vector<Half> out(4);
  reduce_add(DType::f16, out.data(), a.data(), b.data(), 4);
  EXPECT_TRUE(std::isinf(float(out[0])));
  EXPECT_TRUE(std::isnan(float(out[1])));
  EXPECT_EQ(float(out[2]), float(Half(float(Half(6e-8f)) * 2)));
  EXPECT_EQ(out[3].bits, Half(-0.f).bits);
  const std::vector<BFloat16> c = {BFloat16(3e38f), BFloat16(NAN)}, d = {BFloat16(3e38f), BFloat16(1.f)};
  std::vector<BFloat16> o2(2);
  reduce_add(DType::bf16, o2.data(), c.data(), d.data(), 2);
  EXPECT_TRUE(std::isinf(float(o2[0])));
  EXPECT_TRUE(std::isnan(float(o2[1])));
}

TEST(ReduceKernels, RejectNonFloatDtypes) {
  int32_t x[2] = {1, 2};
  EXPECT_THROW(reduce_add(DType::i32, x, x, x, 2), DtypeError);
}

TEST(Shards, CoverTheBufferInRankOrderForAnyCount) {
  for (int n : {1, 2, 3, 4, 7}) {
    for (int64_t count : {0, 1, 2, 5, 6, 7, 100, 101}) {
      int64_t next = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(shard_offset(count, n, r), next);
        const int64_t c = shard_count(count, n, r);
        EXPECT_TRUE(c == count / n || c == count / n + 1);
        next += c;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(Names, RoundTripAndRejectUnknown) {
  EXPECT_EQ(parse_collective("reduce_scatter"), Collective::reduce_scatter);
  EXPECT_EQ(parse_algorithm("ring"), Algorithm::ring);
  EXPECT_EQ(parse_algorithm("hier"), Algorithm::hier);
  EXPECT_EQ(parse_algorithm("auto"), Algorithm::automatic);
  EXPECT_EQ(name(Algorithm::automatic), "auto");
  EXPECT_EQ(parse_backend("nccl"), Backend::nccl);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::avg);
  EXPECT_THROW(parse_algorithm("tree"), ValueError);
  EXPECT_EQ(describe_call(Collective::all_gather, 64, {0, 1, 2}),
            "all_gather of 64 bytes on ranks [0, 1, 2]");
  EXPECT_EQ(describe_call(Collective::all_reduce, 8, {1, 3}), "all_reduce of 8 bytes on ranks [1, 3]");
  EXPECT_EQ(rank_list(40), "[0..39]");
}

}  // namespace
}  // namespace cz::dist

namespace cz::dist {
namespace {

TEST(Poller, TimesOutNamingTheCollectiveAndThePeer) {
  Poller p(nullptr, "all_reduce of 64 bytes on ranks [0, 1]", 0.05);
  try {
    p.until([] { return false; }, 1);
    FAIL() << "no timeout";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(),
                 "comm timeout: all_reduce of 64 bytes on ranks [0, 1] after 0.1 s (waiting for rank 1)");
  }
  EXPECT_GE(p.elapsed_s(), 0.05);
  EXPECT_LT(p.elapsed_s(), 5.0);
}

TEST(Poller, StopsWhenAborted) {
  std::atomic<bool> aborted{true};
  Poller p(nullptr, "barrier of 0 bytes on ranks [0, 1]", 60);
  p.set_abort_flag(&aborted);
  int calls = 0;
  EXPECT_THROW(p.until([&] { return ++calls > 1000000; }), CommError);
  EXPECT_LT(calls, 1000000);
}

}  // namespace
}  // namespace cz::dist
