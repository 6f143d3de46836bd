// Constant and warmup + cosine learning-rate schedules (timm's per-step semantics).
#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "tensor/check.h"

namespace cz {

LrSchedule::LrSchedule(ScheduleConfig c) : config_(c) {
  const auto lr_ok = [](double x) { return std::isfinite(x) && x >= 0; };
  CZ_CHECK(lr_ok(c.base_lr), "lr schedule: base_lr must be a finite value >= 0, got {}", c.base_lr);
  CZ_CHECK(lr_ok(c.min_lr), "lr schedule: min_lr must be a finite value >= 0, got {}", c.min_lr);
  CZ_CHECK(lr_ok(c.warmup_start_lr), "lr schedule: warmup_start_lr must be a finite value >= 0, got {}",
           c.warmup_start_lr);
  CZ_CHECK(c.warmup_steps >= 0, "lr schedule: warmup_steps must be >= 0, got {}", c.warmup_steps);
  if (c.kind == ScheduleConfig::Kind::cosine) {
    CZ_CHECK(c.total_steps >= 1, "cosine schedule: total_steps must be >= 1, got {}", c.total_steps);
    CZ_CHECK(c.warmup_prefix ? c.warmup_steps < c.total_steps : c.warmup_steps <= c.total_steps,
             "cosine schedule: warmup_steps ({}) must be {} total_steps ({})", c.warmup_steps,
             c.warmup_prefix ? "below" : "at most", c.total_steps);
  }
}

double LrSchedule::lr_at(int64_t step) const {
  CZ_CHECK(step >= 1, "lr schedule: step is 1-based, got {}", step);
  const ScheduleConfig& c = config_;
  const int64_t t = step - 1;
  if (t < c.warmup_steps)
    return c.warmup_start_lr + double(t) * (c.base_lr - c.warmup_start_lr) / double(c.warmup_steps);
  if (c.kind == ScheduleConfig::Kind::constant) return c.base_lr;
  if (t >= c.total_steps) return c.min_lr;
  const int64_t c0 = c.warmup_prefix ? c.warmup_steps : 0;
  const double x = double(t - c0) / double(c.total_steps - c0);
  return c.min_lr + 0.5 * (c.base_lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * x));
}

LrSchedule constant_schedule(double lr, int64_t warmup_steps, double warmup_start_lr) {
  ScheduleConfig c;
  c.kind = ScheduleConfig::Kind::constant;
  c.base_lr = lr;
  c.warmup_steps = warmup_steps;
  c.warmup_start_lr = warmup_start_lr;
  return LrSchedule(c);
}

LrSchedule cosine_schedule(double base_lr, double min_lr, int64_t total_steps, int64_t warmup_steps,
                           double warmup_start_lr) {
  ScheduleConfig c;
  c.base_lr = base_lr;
  c.min_lr = min_lr;
  c.total_steps = total_steps;
  c.warmup_steps = warmup_steps;
  c.warmup_start_lr = warmup_start_lr;
  return LrSchedule(c);
}

}  // namespace cz
