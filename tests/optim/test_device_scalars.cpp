// The optimizer update from device scalars (Note [The optimizer's device scalars], optim/device_scalars.h),
// on the CPU: the CUDA kernels' per-thread functions, run by device_scalars_emulation.h, against the host's
// eager step (LossScaler::unscale_, clip_coefficient, scale_, AdamW/SGD on the CPU) bit for bit, over steps
// with clipping and fp16 overflow skips; the clip coefficient; the bias corrections following the host's step
// count. Compiled with -ffp-contract=off, as the host side of the kernels' launchers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "device_scalars_emulation.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "optim_testing.h"

namespace cz {
namespace {

using testing::random_flat;
namespace os = optim_scalars;

template <class T>
std::vector<T> values(const Tensor& t) {
  return t.contiguous().to_vector<T>();
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Three segments with different weight decay and lr scale (padding between them: a piece each).
const std::vector<std::pair<std::string, Shape>> kSpecs = {
    {"stem.weight", {6, 5}}, {"stem.bias", {5}}, {"head.weight", {3, 7, 2}}};
const std::vector<ParamHyper> kHyper = {{0.05, 1.0}, {0.0, 0.5}, {0.05, 0.25}};

// Steps with a loss scale, clipping and an overflow at `overflow_step`: the eager host step (reference) and
// the device step emulated (candidate) on copies of the same state, compared after every step.
template <class T>
void run_steps(bool adamw, DType dtype, double clip, int overflow_step) {
  FlatParams ref_flat = random_flat(kSpecs, 7, dtype);
  const FlatLayout& layout = ref_flat.layout;
  const ShardRange all{0, layout.numel};
  const std::vector<ShardPiece> pieces = shard_pieces(layout, all, kHyper);
  const AdamWConfig acfg{0.9, 0.999, 1e-8};
  const SgdConfig scfg{0.9, 0.1, false};
  auto make = [&]() -> std::unique_ptr<Optimizer> {
    if (adamw) return std::make_unique<AdamW>(layout, all, kHyper, acfg, dtype);
    return std::make_unique<Sgd>(layout, all, kHyper, scfg, dtype);
  };
  std::unique_ptr<Optimizer> ref = make(), dev = make();
  LossScaler ref_scaler({LossScalerConfig::Mode::dynamic, 1024.0, 2.0, 0.5, 2, 1.0});
  LossScaler dev_scaler = ref_scaler;
  Tensor ref_p = ref_flat.params.clone();
  std::vector<T> p = values<T>(ref_p), m(size_t(layout.numel), T(0)), v(m);
  const double lrs[] = {1e-2, 3e-3, 5e-2, 1e-3, 2e-2, 7e-3};
  int skipped = 0, clipped = 0;
  for (int s = 0; s < 6; ++s) {
    // The scaled gradient of this step (an Inf in one element at overflow_step).
    Tensor grad = random_flat(kSpecs, 100 + uint64_t(s), dtype).grads.clone();
    grad.mul_(ref_scaler.scale());  // a power of two: exact
    if (s == overflow_step) grad.narrow(0, 3, 1).fill_(std::numeric_limits<double>::infinity());
    std::vector<T> g = values<T>(grad);
    // Eager, as ShardedState::prepare_gradients and Optimizer::step.
    const bool overflow = ref_scaler.unscale_(grad);
    const std::vector<T> unscaled = values<T>(grad);
    const bool take = ref_scaler.update(overflow);
    const double norm = std::sqrt(grad_sq_norm(grad).item());
    if (take && clip > 0) scale_(grad, clip_coefficient(norm, clip));
    if (take) ref->step(ref_p, grad, lrs[s]);
    // Device: the host's slots, then the kernels, then the host's bookkeeping after the read.
    std::vector<double> slots(os::kSlots, -1.0);
    dev->write_scalars(lrs[s], slots.data());
    slots[os::kInvScale] = 1.0 / dev_scaler.scale();
    float found = 0.0f;
    testing::emulate_unscale_dev(g, slots.data(), found);
    // The squared norm as the device sums it is another order; the test takes the host's sum of the same
    // unscaled values (the emulated unscale must have produced them: checked below).
    const Tensor g_unscaled = from_vector(g, {layout.numel});
    if (take) ASSERT_TRUE(same_bits(g, unscaled)) << "step " << s;
    testing::emulate_clip_scalars(grad_sq_norm(g_unscaled).item(), found, clip, slots.data());
    testing::emulate_scale_dev(g, slots.data(), found);
    clipped += slots[os::kClipCoef] < 1.0;
    if (adamw) {
      testing::emulate_adamw_dev(p, g, m, v, pieces, acfg, slots.data(), found);
    } else {
      testing::emulate_sgd_dev(p, g, m, pieces, scfg, slots.data(), found);
    }
    const bool dev_take = dev_scaler.update(slots[os::kFound] != 0);
    dev->count_step(dev_take);
    skipped += !dev_take;
    // Compared.
    EXPECT_EQ(dev_take, take) << "step " << s;
    EXPECT_TRUE(same_bits(slots[os::kNorm], norm))
        << "step " << s << ": " << slots[os::kNorm] << " vs " << norm;
    EXPECT_EQ(dev->step_count(), ref->step_count()) << "step " << s;
    EXPECT_EQ(dev_scaler.scale(), ref_scaler.scale()) << "step " << s;
    EXPECT_TRUE(same_bits(p, values<T>(ref_p))) << "params after step " << s;
    const NamedTensors st = ref->state();
    if (adamw) {
      EXPECT_TRUE(same_bits(m, values<T>(st[0].second))) << "exp_avg after step " << s;
      EXPECT_TRUE(same_bits(v, values<T>(st[1].second))) << "exp_avg_sq after step " << s;
    } else {
      EXPECT_TRUE(same_bits(m, values<T>(st[0].second))) << "momentum_buffer after step " << s;
    }
  }
  EXPECT_EQ(skipped, overflow_step >= 0 ? 1 : 0);
  EXPECT_EQ(clipped, clip > 0 && clip < 0.1 ? 6 - skipped : 0)
      << "max_norm 0.05 clips every step taken (gradient norms ~0.5), 10 none";
}

TEST(DeviceScalars, AdamWMatchesTheHostStepBitForBit) {
  run_steps<float>(true, DType::f32, 0.0, -1);
  run_steps<double>(true, DType::f64, 0.0, -1);
}

TEST(DeviceScalars, AdamWWithClippingAndAnOverflowSkip) {
  // max_norm 0.05: the gradients (norm ~ 0.5) are clipped on every step taken.
  run_steps<float>(true, DType::f32, 0.05, 2);
  run_steps<double>(true, DType::f64, 0.05, 0);  // the first step skipped: the bias corrections wait
}

TEST(DeviceScalars, SgdFirstStepFlagClippingAndSkip) {
  run_steps<float>(false, DType::f32, 0.05, -1);
  run_steps<float>(false, DType::f32, 0.05, 0);   // skipped first step: the next is the buffer's first
  run_steps<double>(false, DType::f64, 10.0, 3);  // never clipped (coef 1)
}

// clip_of against the host's clip_coefficient(sqrt(sq)) to the bit, NaN kept; overflow and no clipping
// give 1.
TEST(DeviceScalars, ClipCoefficientAsTheHost) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (double max_norm : {0.5, 1.0, 3.0, 1e-3})
    for (double sq : {0.0, 1e-300, 1e-20, 0.25, 1.0, max_norm * max_norm, 2.0, 9.0 + 1e-9, 1e10, inf, nan}) {
      const os::ClipResult r = os::clip_of(sq, false, max_norm);
      const double norm = std::sqrt(sq), coef = clip_coefficient(norm, max_norm);
      EXPECT_TRUE(same_bits(r.norm, norm) || (std::isnan(r.norm) && std::isnan(norm))) << sq;
      if (std::isnan(coef))
        EXPECT_TRUE(std::isnan(r.coef)) << sq << " " << max_norm;
      else
        EXPECT_TRUE(same_bits(r.coef, coef)) << sq << " " << max_norm << ": " << r.coef << " vs " << coef;
      if (!std::isnan(r.coef)) EXPECT_LE(r.coef, 1.0) << sq;
      EXPECT_EQ(os::clip_of(sq, true, max_norm).coef, 1.0) << "an overflow clips nothing";
    }
  EXPECT_EQ(os::clip_of(4.0, false, 0.0).coef, 1.0);  // --clip-grad 0: none
  EXPECT_EQ(os::clip_of(4.0, false, 0.0).norm, 2.0);  // the norm is still logged
  EXPECT_LT(os::clip_of(4.0, false, 1.0).coef, 0.5);
}

TEST(DeviceScalars, TheSkipFlag) {
  EXPECT_TRUE(os::take_step(0.0f));
  EXPECT_FALSE(os::take_step(1.0f));
  // A skipped update changes nothing: parameters, moments, buffer.
  std::vector<float> p{1, 2, 3}, g{0.5f, -1, 2}, m{0.1f, 0.2f, 0.3f}, v{0.01f, 0.02f, 0.03f};
  const auto p0 = p, m0 = m, v0 = v;
  const std::vector<ShardPiece> pieces{{0, 3, 0.05, 1.0}};
  std::vector<double> slots(os::kSlots, 0.0);
  slots[os::kLr] = 0.1;
  slots[os::kBc1] = 0.1;
  slots[os::kInvSqrtBc2] = 30.0;
  slots[os::kClipCoef] = 0.5;
  testing::emulate_adamw_dev(p, g, m, v, pieces, AdamWConfig{}, slots.data(), 1.0f);
  testing::emulate_sgd_dev(p, g, m, pieces, SgdConfig{0.9, 0.0, false}, slots.data(), 1.0f);
  std::vector<float> g2 = g;
  testing::emulate_scale_dev(g2, slots.data(), 1.0f);
  EXPECT_EQ(p, p0);
  EXPECT_EQ(m, m0);
  EXPECT_EQ(v, v0);
  EXPECT_EQ(g2, g);
  testing::emulate_scale_dev(g2, slots.data(), 0.0f);
  EXPECT_EQ(g2, (std::vector<float>{0.25f, -0.5f, 1.0f}));
  testing::emulate_adamw_dev(p, g, m, v, pieces, AdamWConfig{}, slots.data(), 0.0f);
  EXPECT_NE(p, p0);
}

// The host writes the bias corrections of the step it will count: a skipped step (count_step(false)) keeps
// them, a taken one moves them on; they are the eager path's (adamw_bias_corrections).
TEST(DeviceScalars, BiasCorrectionsFollowTheStepCount) {
  FlatParams flat = random_flat(kSpecs, 3);
  const ShardRange all{0, flat.layout.numel};
  AdamW opt(flat.layout, all, kHyper, {0.9, 0.999, 1e-8});
  Sgd sgd(flat.layout, all, kHyper, {0.9, 0.0, false});
  std::vector<double> slots(os::kSlots), before(os::kSlots);
  int64_t taken = 0;
  for (bool take : {false, true, true, false, false, true}) {
    opt.write_scalars(0.25, slots.data());
    const os::BiasCorrections bc = os::adamw_bias_corrections(0.9, 0.999, taken + 1);
    EXPECT_EQ(slots[os::kLr], 0.25);
    EXPECT_TRUE(same_bits(slots[os::kBc1], bc.bc1)) << taken;
    EXPECT_TRUE(same_bits(slots[os::kInvSqrtBc2], bc.inv_sqrt_bc2)) << taken;
    EXPECT_DOUBLE_EQ(slots[os::kBc1], 1.0 - std::pow(0.9, double(taken + 1)));
    sgd.write_scalars(0.25, slots.data());
    EXPECT_EQ(slots[os::kFirstStep], taken == 0 ? 1.0 : 0.0) << taken;
    opt.count_step(take);
    sgd.count_step(take);
    taken += take;
    EXPECT_EQ(opt.step_count(), taken);
    EXPECT_EQ(sgd.step_count(), taken);
  }
  EXPECT_THROW(opt.write_scalars(-1.0, slots.data()), ValueError);
  // The update from device scalars is CUDA's: a CPU optimizer refuses it.
  Tensor found = zeros({}, DType::f32);
  EXPECT_THROW(
      opt.step_on_device({&flat.params, 1}, {&flat.grads, 1}, zeros({os::kSlots}, DType::f64), found),
      DeviceError);
}

}  // namespace
}  // namespace cz
