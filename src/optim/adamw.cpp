// AdamW: configuration checks, state, and dispatch to the CPU or CUDA update kernel.
#include "optim/adamw.h"

#include <cmath>

#include "optim/cpu_kernels.h"
#include "optim/cuda_kernels.h"
#include "optim/device_scalars.h"
#include "tensor/dispatch.h"
#include "tensor/profiler.h"
#include "tensor/stream.h"

namespace cz {

AdamW::AdamW(const FlatLayout& layout, std::vector<ShardRange> ranges, const std::vector<ParamHyper>& hyper,
             AdamWConfig config, DType dtype, Device device, bool pinned_state)
    : Optimizer("AdamW", layout, std::move(ranges), hyper, dtype, device, pinned_state), config_(config) {
  CZ_CHECK(config.beta1 >= 0 && config.beta1 < 1, "AdamW: beta1 must be in [0, 1), got {}", config.beta1);
  CZ_CHECK(config.beta2 >= 0 && config.beta2 < 1, "AdamW: beta2 must be in [0, 1), got {}", config.beta2);
  CZ_CHECK(std::isfinite(config.eps) && config.eps >= 0, "AdamW: eps must be a finite value >= 0, got {}",
           config.eps);
  exp_avg_ = new_state();
  exp_avg_sq_ = new_state();
}

void AdamW::update_range(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                         std::span<const ShardPiece> pieces, double lr) {
  profiler::Scope prof("adamw_step", device_);
  const AdamWStepArgs args{lr, config_.beta1, config_.beta2, config_.eps, step_ + 1};
  Tensor m = exp_avg_.narrow(0, state_offset, numel), v = exp_avg_sq_.narrow(0, state_offset, numel);
  if (p.is_cpu())
    cpu::adamw_step(p, g, m, v, pieces, args);
  else
    CZ_CUDA_CALL(cuda::adamw_step(p, g, m, v, pieces, args, current_stream(device_)));
}

void AdamW::update_range_dev(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                             std::span<const ShardPiece> pieces, const Tensor& scalars, const Tensor& found) {
  profiler::Scope prof("adamw_step", device_);
  const AdamWStepArgs args{0.0, config_.beta1, config_.beta2, config_.eps, 0};
  Tensor m = exp_avg_.narrow(0, state_offset, numel), v = exp_avg_sq_.narrow(0, state_offset, numel);
  CZ_CUDA_CALL(cuda::adamw_step_dev(p, g, m, v, pieces, args, scalars, found, current_stream(device_)));
}

void AdamW::write_own_scalars(double* slots) const {
  const auto bc = optim_scalars::adamw_bias_corrections(config_.beta1, config_.beta2, step_ + 1);
  slots[optim_scalars::kBc1] = bc.bc1;
  slots[optim_scalars::kInvSqrtBc2] = bc.inv_sqrt_bc2;
}

void AdamW::finish_step(std::span<const Tensor>) {
  bump(exp_avg_);
  bump(exp_avg_sq_);
}

NamedTensors AdamW::state() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}, {"step", step_tensor()}};
}

void AdamW::load_state(const NamedTensors& state) {
  load_named(state, {"exp_avg", "exp_avg_sq"}, {&exp_avg_, &exp_avg_sq_});
}

}  // namespace cz
