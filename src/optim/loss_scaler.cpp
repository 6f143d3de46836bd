// LossScaler: the dynamic loss-scale state machine and the fused unscale + overflow check.
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "optim/cpu_kernels.h"
#include "optim/cuda_kernels.h"
#include "tensor/dispatch.h"
#include "tensor/stream.h"

namespace cz {

LossScaler::LossScaler(LossScalerConfig config) : config_(config), scale_(config.init_scale) {
  const auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  CZ_CHECK(positive(config.init_scale), "LossScaler: init_scale must be a finite value > 0, got {}",
           config.init_scale);
  CZ_CHECK(positive(config.min_scale), "LossScaler: min_scale must be a finite value > 0, got {}",
           config.min_scale);
  CZ_CHECK(config.init_scale >= config.min_scale, "LossScaler: init_scale ({}) is below min_scale ({})",
           config.init_scale, config.min_scale);
  CZ_CHECK(std::isfinite(config.growth_factor) && config.growth_factor > 1,
           "LossScaler: growth_factor must be > 1, got {}", config.growth_factor);
  CZ_CHECK(config.backoff_factor > 0 && config.backoff_factor < 1,
           "LossScaler: backoff_factor must be in (0, 1), got {}", config.backoff_factor);
  CZ_CHECK(config.growth_interval >= 1, "LossScaler: growth_interval must be >= 1, got {}",
           config.growth_interval);
  if (config.mode == LossScalerConfig::Mode::disabled) scale_ = 1.0;
}

LossScaler LossScaler::disabled() {
  LossScalerConfig c;
  c.mode = LossScalerConfig::Mode::disabled;
  c.init_scale = 1.0;
  return LossScaler(c);
}

LossScaler LossScaler::fixed(double scale) {
  LossScalerConfig c;
  c.mode = LossScalerConfig::Mode::fixed;
  c.init_scale = scale;
  c.min_scale = std::min(1.0, scale);
  return LossScaler(c);
}

bool LossScaler::unscale_(const Tensor& grads) const {
  CZ_CHECK(grads.defined(), "LossScaler::unscale_: undefined tensor");
  CZ_CHECK_DTYPE(grads.dtype() == DType::f32 || grads.dtype() == DType::f64,
                 "LossScaler::unscale_: needs f32 or f64 gradients, got {}", dtype_name(grads.dtype()));
  CZ_CHECK_SHAPE(grads.is_contiguous(), "LossScaler::unscale_: gradients of shape {} must be contiguous",
                 shape_str(grads.sizes()));
  if (!enabled()) return false;
  Tensor g = grads;
  Tensor found = zeros({}, DType::f32, grads.device());
  const double inv = 1.0 / scale_;
  if (g.is_cpu())
    cpu::unscale_and_check(g, inv, found);
  else
    CZ_CUDA_CALL(cuda::unscale_and_check(g, inv, found, current_stream(g.device())));
  if (inv != 1.0) g.storage()->bump_version();
  return found.item() != 0.0;
}

bool LossScaler::update(bool found_non_finite) {
  if (config_.mode != LossScalerConfig::Mode::dynamic) return !found_non_finite;
  if (found_non_finite) {
    scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
    clean_steps_ = 0;
    return false;
  }
  if (++clean_steps_ == config_.growth_interval) {
    const double grown = scale_ * config_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    clean_steps_ = 0;
  }
  return true;
}

void LossScaler::load_state(const State& state) {
  CZ_CHECK_IO(std::isfinite(state.scale) && state.scale > 0,
              "LossScaler::load_state: scale must be > 0, got {}", state.scale);
  CZ_CHECK_IO(state.clean_steps >= 0 && state.clean_steps < config_.growth_interval,
              "LossScaler::load_state: clean_steps must be in [0, {}), got {}", config_.growth_interval,
              state.clean_steps);
  if (config_.mode == LossScalerConfig::Mode::disabled) return;
  scale_ = state.scale;
  clean_steps_ = state.clean_steps;
}

}  // namespace cz
