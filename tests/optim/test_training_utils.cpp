// Gradient clipping, non-finite detection, the loss-scaler state machine and the weight EMA.
#include <omp.h>

#include <cmath>
#include <limits>

#include "optim/clip.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim_testing.h"

namespace cz {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::throws_with;

// ---- clipping ----

TEST(Clip, SquaredNormIsF64AndIndependentOfThreads) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor g = random_tensor({100003}, 1, dtype);
    double want = 0;
    for (double x : g.to_vector<double>()) want += x * x;
    const Tensor s = grad_sq_norm(g);
    EXPECT_EQ(s.dtype(), DType::f64);
    EXPECT_EQ(s.dim(), 0);
    EXPECT_NEAR(s.item(), want, 1e-12 * want);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const double one = grad_sq_norm(g).item();
    omp_set_num_threads(2);
    const double two = grad_sq_norm(g).item();
    omp_set_num_threads(saved);
    EXPECT_EQ(one, two);
  }
  // Any layout: a non-contiguous view.
  const Tensor m = random_tensor({40, 30}, 2, DType::f32);
  EXPECT_DOUBLE_EQ(grad_sq_norm(m.transpose(0, 1)).item(), grad_sq_norm(m).item());
}

TEST(Clip, ShardedPartialNormsAddUpToTheGlobalNorm) {
  const Tensor g = random_tensor({5000}, 3, DType::f32);
  const double total = grad_sq_norm(g).item();
  const double parts =
      grad_sq_norm(g.narrow(0, 0, 1234)).item() + grad_sq_norm(g.narrow(0, 1234, 3766)).item();
  EXPECT_NEAR(parts, total, 1e-12 * total);
}

TEST(Clip, CoefficientLikeTorch) {
  EXPECT_DOUBLE_EQ(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
  EXPECT_TRUE(std::isnan(clip_coefficient(NAN, 1.0)));
  EXPECT_TRUE(throws_with<ValueError>([] { clip_coefficient(1.0, 0.0); }, {"max_norm", "0"}));
  EXPECT_TRUE(throws_with<ValueError>([] { clip_coefficient(1.0, -5.0); }, {"max_norm", "-5"}));
}

TEST(Clip, ClipsAboveMaxAndLeavesGradientsAloneBelow) {
  Tensor g = random_tensor({777}, 4, DType::f32);
  const double norm = std::sqrt(grad_sq_norm(g).item());
  const auto before = g.to_vector<float>();
  EXPECT_DOUBLE_EQ(clip_grad_norm_(g, norm * 2), norm);
  EXPECT_EQ(g.to_vector<float>(), before);  // under max: not touched at all
  EXPECT_DOUBLE_EQ(clip_grad_norm_(g, norm / 4), norm);
  EXPECT_NEAR(std::sqrt(grad_sq_norm(g).item()), norm / 4, 1e-5 * norm);
  Tensor h = g.clone();
  scale_(h, 1.0);
  EXPECT_EQ(h.to_vector<float>(), g.to_vector<float>());
  scale_(h, 0.5);
  EXPECT_TRUE(all_close(h, g.clone().mul_(0.5), 0, 0));
}

TEST(NonFinite, FindsInfAndNanAnywhere) {
  for (DType dtype : {DType::f32, DType::f64}) {
    Tensor t = random_tensor({50001}, 5, dtype);
    EXPECT_FALSE(has_non_finite(t));
    for (int64_t at : {int64_t(0), int64_t(17), int64_t(50000)}) {  // vector body, and the tail
      for (double bad : {INFINITY, -INFINITY, NAN}) {
        Tensor u = t.clone();
        u.narrow(0, at, 1).fill_(bad);
        EXPECT_TRUE(has_non_finite(u)) << at << " " << bad;
        EXPECT_TRUE(has_non_finite(u.view({1, 50001}).transpose(0, 1)));
      }
    }
    Tensor big = t.clone();
    big.narrow(0, 3, 1).fill_(dtype == DType::f32 ? 3e38 : 1e308);  // large but finite
    EXPECT_FALSE(has_non_finite(big));
  }
  EXPECT_TRUE(throws_with<DtypeError>([] { has_non_finite(zeros({3}, DType::i64)); }, {"i64"}));
}

// ---- loss scaling ----

Tensor grads_with(double first) {
  Tensor g = full({20000}, 8.0);
  g.narrow(0, 0, 1).fill_(first);
  return g;
}

TEST(LossScaler, OverflowHalvesAndSkipsCleanStepsDouble) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_FALSE(s.update(true));  // overflow: skip the step, halve
  EXPECT_EQ(s.scale(), 32768.0);
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.clean_steps(), 1999);
  EXPECT_TRUE(s.update(false));  // the 2000th clean step in a row doubles
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.clean_steps(), 0);
  // An overflow resets the run of clean steps.
  for (int i = 0; i < 1500; ++i) s.update(false);
  s.update(true);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);
}

TEST(LossScaler, NeverBacksOffBelowTheFloor) {
  LossScalerConfig c;
  c.init_scale = 1024;
  c.min_scale = 128;
  c.growth_interval = 3;
  LossScaler s(c);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 128.0);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 256.0);
}

TEST(LossScaler, UnscaleDividesAndReportsOverflow) {
  LossScaler s;
  Tensor g = grads_with(65536.0 * 3);
  EXPECT_FALSE(s.unscale_(g));
  EXPECT_EQ(g.narrow(0, 0, 1).item(), 3.0);
  EXPECT_EQ(g.narrow(0, 1, 1).item(), 8.0 / 65536.0);
  Tensor bad = grads_with(INFINITY);
  EXPECT_TRUE(s.unscale_(bad));
  Tensor nan = grads_with(NAN);
  EXPECT_TRUE(s.unscale_(nan.narrow(0, 0, 10)));
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] {
        s.unscale_(g.view({100, 200}).transpose(0, 1));
      },
      {"contiguous"}));
}

TEST(LossScaler, FixedAndDisabledModes) {
  LossScaler fixed = LossScaler::fixed(128.0);
  EXPECT_FALSE(fixed.update(true));  // skip, but keep the scale
  for (int i = 0; i < 5000; ++i) fixed.update(false);
  EXPECT_EQ(fixed.scale(), 128.0);
  Tensor g = grads_with(256.0);
  EXPECT_FALSE(fixed.unscale_(g));
  EXPECT_EQ(g.narrow(0, 0, 1).item(), 2.0);

  LossScaler off = LossScaler::disabled();
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.scale(), 1.0);
  Tensor h = grads_with(INFINITY);
  EXPECT_FALSE(off.unscale_(h));  // does not look
  EXPECT_TRUE(off.update(false));
  EXPECT_FALSE(off.update(true));  // a caller that checked itself can still skip
  EXPECT_EQ(off.scale(), 1.0);
}

TEST(LossScaler, StateRoundTripAndBadConfig) {
  LossScaler a;
  a.update(true);
  for (int i = 0; i < 7; ++i) a.update(false);
  LossScaler b;
  b.load_state(a.state());
  EXPECT_EQ(b.scale(), 32768.0);
  EXPECT_EQ(b.clean_steps(), 7);
  EXPECT_TRUE(throws_with<IoError>([&] { b.load_state({-1.0, 0}); }, {"scale", "-1"}));
  EXPECT_TRUE(throws_with<IoError>([&] { b.load_state({2.0, 2000}); }, {"clean_steps", "2000"}));
  LossScalerConfig c;
  c.growth_interval = 0;
  EXPECT_TRUE(throws_with<ValueError>([&] { LossScaler{c}; }, {"growth_interval", "0"}));
  c = {};
  c.backoff_factor = 1.0;
  EXPECT_TRUE(throws_with<ValueError>([&] { LossScaler{c}; }, {"backoff_factor", "1"}));
  c = {};
  c.init_scale = 0.5;
  EXPECT_TRUE(throws_with<ValueError>([&] { LossScaler{c}; }, {"init_scale (0.5)", "min_scale (1)"}));
}

// ---- EMA ----

TEST(Ema, UpdatesSwapsAndRoundTrips) {
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor p = random_tensor({30001}, 6, dtype);
    WeightEma ema(p, 0.9);
    std::vector<double> ref = p.to_vector<double>();
    for (int step = 0; step < 3; ++step) {
      p.mul_(-0.5).add_(random_tensor({30001}, 7 + step, dtype), 0.1);
      const auto pv = p.to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = 0.9 * ref[i] + 0.1 * pv[i];
      ema.update(p);
    }
    const Tensor want = from_vector(ref, {30001});
    EXPECT_TRUE(all_close(ema.weights(), want, dtype == DType::f32 ? 1e-6 : 1e-14, 1e-7));

    const auto live = p.to_vector<double>(), avg = ema.weights().to_vector<double>();
    ema.swap(p);
    EXPECT_TRUE(ema.swapped());
    EXPECT_EQ(p.to_vector<double>(), avg);
    EXPECT_TRUE(throws_with<ValueError>([&] { ema.update(p); }, {"swap back"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { ema.state(); }, {"swap back"}));
    ema.swap(p);
    EXPECT_EQ(p.to_vector<double>(), live);
    EXPECT_EQ(ema.weights().to_vector<double>(), avg);

    WeightEma other(p, 0.5);
    other.load_state(ema.state());
    EXPECT_EQ(other.weights().to_vector<double>(), avg);
    ema.update(p, 0.0);  // decay 0: the EMA becomes the weights
    EXPECT_EQ(ema.weights().to_vector<double>(), live);
  }
  Tensor p = random_tensor({10}, 9, DType::f32);
  EXPECT_TRUE(throws_with<ValueError>([&] { WeightEma(p, 1.5); }, {"decay", "1.5"}));
  WeightEma ema(p, 0.99);
  EXPECT_TRUE(
      throws_with<ShapeError>([&] { ema.update(random_tensor({11}, 1, DType::f32)); }, {"(11)", "(10)"}));
  EXPECT_TRUE(throws_with<DtypeError>([&] { ema.update(p.to(DType::f64)); }, {"f64", "f32"}));
  EXPECT_TRUE(throws_with<IoError>([&] { ema.load_state({{"ema", zeros({9})}}); }, {"(9)", "(10)"}));
}

}  // namespace
}  // namespace cz
