// Loss scaling for fp16 mixed precision: the loss is multiplied by scale() before backward, gradients are
// unscaled before clipping and the step, and a step whose gradients overflowed is skipped. Dynamic mode
// follows torch.cuda.amp.GradScaler (plus a floor); fixed and disabled modes serve static scaling and
// bf16/fp32 training. See docs/optim.md.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace cz {

struct LossScalerConfig {
  enum class Mode { dynamic, fixed, disabled };
  Mode mode = Mode::dynamic;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // after growth_interval clean steps in a row
  double backoff_factor = 0.5;  // on overflow
  int64_t growth_interval = 2000;
  double min_scale = 1.0;  // the scale never backs off below this
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config = {});
  static LossScaler disabled();           // scale 1, unscale_ does nothing, every step is taken
  static LossScaler fixed(double scale);  // constant scale; overflowing steps are still skipped

  double scale() const { return scale_; }  // multiply the loss by this
  bool enabled() const { return config_.mode != LossScalerConfig::Mode::disabled; }
  int64_t clean_steps() const { return clean_steps_; }  // clean steps since the last overflow or growth
  const LossScalerConfig& config() const { return config_; }

  // grads *= 1 / scale() in place (contiguous f32/f64) and returns whether they held an Inf or NaN. With
  // several tensors or ranks, OR the results (all-reduce max across ranks) and pass that to update().
  // Disabled mode: returns false without reading the gradients.
  bool unscale_(const Tensor& grads) const;

  // Records the outcome of one step and returns whether to apply it (false: skip the optimizer step).
  // dynamic: overflow -> scale = max(scale * backoff_factor, min_scale), counter reset, skip;
  //          clean   -> counter + 1; when it reaches growth_interval, scale *= growth_factor, counter reset.
  // fixed:   the scale never changes; overflow -> skip.   disabled: overflow -> skip (if the caller checked).
  bool update(bool found_non_finite);

  // For checkpoints.
  struct State {
    double scale = 1.0;
    int64_t clean_steps = 0;
  };
  State state() const { return {scale_, clean_steps_}; }
  void load_state(const State& state);

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t clean_steps_ = 0;
};

}  // namespace cz
