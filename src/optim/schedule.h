// Learning-rate schedules, per optimizer step with timm's semantics (CosineLRScheduler with
// t_in_epochs=False, driven by step_update(num_updates) after each update). The exact indexing is in the
// comment on LrSchedule::lr_at and in docs/optim.md.
#pragma once

#include <cstdint>

namespace cz {

struct ScheduleConfig {
  enum class Kind { constant, cosine };
  Kind kind = Kind::cosine;
  double base_lr = 0.0;          // peak lr, reached at the end of the warmup
  double min_lr = 0.0;           // cosine: the final lr
  int64_t total_steps = 0;       // cosine: steps until min_lr (>= 1); unused by constant
  int64_t warmup_steps = 0;      // linear warmup length W (0: none)
  double warmup_start_lr = 0.0;  // lr of the first warmup step
  bool warmup_prefix = false;    // cosine: false (timm's default) -> cosine over [0, total) in absolute t,
                                 // true -> cosine over [W, total) starting at base_lr
};

class LrSchedule {
 public:
  explicit LrSchedule(ScheduleConfig config);  // throws ValueError naming a bad field and its value

  // The lr of optimizer step `step` (1-based: the first update is step 1). With t = step - 1, the number of
  // updates completed before it (timm's num_updates):
  //   t < W:                  warmup_start_lr + t * (base_lr - warmup_start_lr) / W
  //   constant, t >= W:       base_lr
  //   cosine, W <= t < total: min_lr + (base_lr - min_lr) * (1 + cos(pi * (t - c0) / (total - c0))) / 2,
  //                           c0 = warmup_prefix ? W : 0
  //   cosine, t >= total:     min_lr (for ever)
  // So a warmup from 0 gives step 1 lr 0 and step W + 1 the first post-warmup lr, exactly like timm.
  double lr_at(int64_t step) const;

  const ScheduleConfig& config() const { return config_; }

 private:
  ScheduleConfig config_;
};

LrSchedule constant_schedule(double lr, int64_t warmup_steps = 0, double warmup_start_lr = 0.0);
LrSchedule cosine_schedule(double base_lr, double min_lr, int64_t total_steps, int64_t warmup_steps = 0,
                           double warmup_start_lr = 0.0);

}  // namespace cz
