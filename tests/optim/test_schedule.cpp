// Learning-rate schedules against closed-form values, with the step indexing spelled out.
#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "optim_testing.h"

namespace cz {
namespace {

using testing::throws_with;

double cosine(double base, double min, double t, double total) {
  return min + 0.5 * (base - min) * (1 + std::cos(std::numbers::pi * t / total));
}

TEST(Schedule, CosineWithWarmupFromZeroFollowsTimm) {
  const double base = 4e-3, min = 1e-6;
  const LrSchedule s = cosine_schedule(base, min, /*total=*/100, /*warmup=*/10);
  EXPECT_EQ(s.lr_at(1), 0.0);  // t = 0: the first update runs at warmup_start_lr
  EXPECT_DOUBLE_EQ(s.lr_at(2), base / 10);
  EXPECT_DOUBLE_EQ(s.lr_at(10), base * 9 / 10);  // the last warmup step is one increment short of base
  // t >= W: cosine in absolute t over [0, total) (timm's warmup_prefix=False), so step 11 is just below base.
  EXPECT_DOUBLE_EQ(s.lr_at(11), cosine(base, min, 10, 100));
  EXPECT_DOUBLE_EQ(s.lr_at(51), cosine(base, min, 50, 100));
  EXPECT_DOUBLE_EQ(s.lr_at(100), cosine(base, min, 99, 100));
  EXPECT_EQ(s.lr_at(101), min);  // after total steps: min_lr for ever
  EXPECT_EQ(s.lr_at(1000000), min);
  for (int64_t k = 11; k < 110; ++k) EXPECT_LE(s.lr_at(k + 1), s.lr_at(k)) << k;
}

TEST(Schedule, CosineVariants) {
  const LrSchedule no_warmup = cosine_schedule(1.0, 0.1, 20);
  EXPECT_EQ(no_warmup.lr_at(1), 1.0);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(11), 0.55);  // half way: (base + min) / 2
  EXPECT_EQ(no_warmup.lr_at(21), 0.1);

  const LrSchedule start = cosine_schedule(1.0, 0.0, 20, 4, 0.2);
  EXPECT_EQ(start.lr_at(1), 0.2);
  EXPECT_DOUBLE_EQ(start.lr_at(3), 0.2 + 2 * 0.8 / 4);

  ScheduleConfig c;  // warmup_prefix: the cosine starts at base_lr right after the warmup
  c.base_lr = 1.0;
  c.min_lr = 0.0;
  c.total_steps = 30;
  c.warmup_steps = 10;
  c.warmup_prefix = true;
  const LrSchedule prefix(c);
  EXPECT_EQ(prefix.lr_at(11), 1.0);
  EXPECT_DOUBLE_EQ(prefix.lr_at(21), 0.5);
  EXPECT_DOUBLE_EQ(prefix.lr_at(30), cosine(1.0, 0.0, 19, 20));
  EXPECT_EQ(prefix.lr_at(31), 0.0);
}

TEST(Schedule, ConstantWithOptionalWarmup) {
  const LrSchedule flat = constant_schedule(0.1);
  EXPECT_EQ(flat.lr_at(1), 0.1);
  EXPECT_EQ(flat.lr_at(123456), 0.1);
  const LrSchedule warm = constant_schedule(0.1, 5, 0.05);
  EXPECT_EQ(warm.lr_at(1), 0.05);
  EXPECT_DOUBLE_EQ(warm.lr_at(5), 0.05 + 4 * 0.05 / 5);
  EXPECT_EQ(warm.lr_at(6), 0.1);
  EXPECT_EQ(warm.lr_at(1000), 0.1);
}

TEST(Schedule, BadConfigNamesTheField) {
  EXPECT_TRUE(throws_with<ValueError>([] { cosine_schedule(1.0, 0.0, 0); }, {"total_steps", "0"}));
  EXPECT_TRUE(
      throws_with<ValueError>([] { cosine_schedule(1.0, 0.0, 10, 11); }, {"warmup_steps (11)", "(10)"}));
  EXPECT_TRUE(throws_with<ValueError>([] { cosine_schedule(-1.0, 0.0, 10); }, {"base_lr", "-1"}));
  EXPECT_TRUE(throws_with<ValueError>([] { cosine_schedule(1.0, NAN, 10); }, {"min_lr", "nan"}));
  EXPECT_TRUE(throws_with<ValueError>([] { constant_schedule(1.0, -2); }, {"warmup_steps", "-2"}));
  EXPECT_TRUE(throws_with<ValueError>([] { constant_schedule(1.0).lr_at(0); }, {"1-based", "0"}));
}

}  // namespace
}  // namespace cz
