// SGD: configuration checks, state, and dispatch to the CPU or CUDA update kernel.
#include "optim/sgd.h"

#include "optim/cpu_kernels.h"
#include "optim/cuda_kernels.h"
#include "optim/device_scalars.h"
#include "tensor/dispatch.h"
#include "tensor/profiler.h"
#include "tensor/stream.h"

namespace cz {

Sgd::Sgd(const FlatLayout& layout, std::vector<ShardRange> ranges, const std::vector<ParamHyper>& hyper,
         SgdConfig config, DType dtype, Device device, bool pinned_state)
    : Optimizer("SGD", layout, std::move(ranges), hyper, dtype, device, pinned_state), config_(config) {
  CZ_CHECK(config.momentum >= 0 && config.momentum < 1, "SGD: momentum must be in [0, 1), got {}",
           config.momentum);
  CZ_CHECK(config.dampening >= 0 && config.dampening <= 1, "SGD: dampening must be in [0, 1], got {}",
           config.dampening);
  CZ_CHECK(!config.nesterov || (config.momentum > 0 && config.dampening == 0),
           "SGD: nesterov needs momentum > 0 and dampening 0, got momentum {} and dampening {}",
           config.momentum, config.dampening);
  if (config.momentum != 0) momentum_buffer_ = new_state();
}

void Sgd::update_range(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                       std::span<const ShardPiece> pieces, double lr) {
  profiler::Scope prof("sgd_step", device_);
  const SgdStepArgs args{lr, config_.momentum, config_.dampening, config_.nesterov, step_ == 0};
  Tensor buf = momentum_buffer_.defined() ? momentum_buffer_.narrow(0, state_offset, numel) : Tensor();
  if (p.is_cpu())
    cpu::sgd_step(p, g, buf, pieces, args);
  else
    CZ_CUDA_CALL(cuda::sgd_step(p, g, buf, pieces, args, current_stream(device_)));
}

void Sgd::update_range_dev(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                           std::span<const ShardPiece> pieces, const Tensor& scalars, const Tensor& found) {
  profiler::Scope prof("sgd_step", device_);
  const SgdStepArgs args{0.0, config_.momentum, config_.dampening, config_.nesterov, false};
  Tensor buf = momentum_buffer_.defined() ? momentum_buffer_.narrow(0, state_offset, numel) : Tensor();
  CZ_CUDA_CALL(cuda::sgd_step_dev(p, g, buf, pieces, args, scalars, found, current_stream(device_)));
}

void Sgd::write_own_scalars(double* slots) const {
  slots[optim_scalars::kFirstStep] = step_ == 0 ? 1.0 : 0.0;
}

void Sgd::finish_step(std::span<const Tensor>) {
  if (momentum_buffer_.defined()) bump(momentum_buffer_);
}

NamedTensors Sgd::state() const {
  if (!momentum_buffer_.defined()) return {{"step", step_tensor()}};
  return {{"momentum_buffer", momentum_buffer_}, {"step", step_tensor()}};
}

void Sgd::load_state(const NamedTensors& state) {
  if (momentum_buffer_.defined())
    load_named(state, {"momentum_buffer"}, {&momentum_buffer_});
  else
    load_named(state, {}, {});
}

}  // namespace cz
