// The sharded optimizer state's step.
#include "dist/zero/sharded_state.h"

#include <cmath>

#include "dist/zero/held_bytes.h"
#include "optim/clip.h"
#include "optim/cuda_kernels.h"
#include "optim/device_scalars.h"
#include "tensor/autograd/engine.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

namespace cz::zero {
ShardedState::ShardedState(const ZeroLayout& layout, dist::ProcessGroup group, Tensor master,
                           Tensor grad_shard, bool host, std::vector<Tensor> weights,
                           std::vector<Tensor> grads, std::vector<Tensor> from_compute,
                           const MakeOptimizer& make_optimizer, const MakeEma& make_ema)
    : layout_(layout),
      group_(std::move(group)),
      master_(std::move(master)),
      grad_shard_(std::move(grad_shard)),
      host_(host),
      weights_(std::move(weights)),
      grads_(std::move(grads)),
      from_compute_(std::move(from_compute)) {
  const Device dev = host_ ? Device::cpu() : group_.device();
  optimizer_ = make_optimizer(ShardSpec{layout_.flat, layout_.ranges(group_.rank()), dev, host_});
  CZ_ASSERT(optimizer_ != nullptr, "ZeRO: the optimizer factory built nothing");
  if (make_ema) ema_ = make_ema(std::span<const Tensor>(weights_));
}

void ShardedState::begin_step(const UpdateArgs& args) {
  NoGradGuard no_grad;
  args_ = args;
  // Offload overwrites each host gradient chunk on its first arrival instead (the worker may still be
  // reading them for the previous step's delayed update).
  // On the CPU the chunks are not filled: each partition's first chunk of the step is copied, the others
  // added, and a chunk that never came is zeroed before the update (Note [Deferred gradient zero]).
  if (grad_shard_.defined() && !host_) {
    if (grad_shard_.is_cpu())
      received_.assign(layout_.partitions.size(), 0);
    else
      grad_shard_.zero_();
  }
  if (scalars_.defined()) {
    // One host-to-device copy, queued before the step's graphs: the slots kLr..kInvScale.
    std::vector<double> slots(optim_scalars::kNorm, 0.0);
    optimizer_->write_scalars(args.lr, slots.data());
    slots[optim_scalars::kInvScale] = args.inv_scale;
    scalars_.narrow(0, 0, optim_scalars::kNorm).copy_(from_vector(slots, {optim_scalars::kNorm}));
  }
}

void ShardedState::use_device_scalars() {
  const Device dev = group_.device();
  CZ_CHECK_DEVICE(dev.is_cuda() && !host_ && group_.size() == 1,
                  "ZeRO: the update from device scalars needs one CUDA rank without offload (device {}, {} "
                  "rank(s), offload {})",
                  dev.str(), group_.size(), host_);
  scalars_ = zeros({optim_scalars::kSlots}, DType::f64, dev);
  found_ = zeros({}, DType::f32, dev);
}

void ShardedState::device_step(bool loss_scaling) {
  NoGradGuard no_grad;
  CZ_ASSERT(scalars_.defined(), "ShardedState::device_step without use_device_scalars()");
  const Stream stream = current_stream(scalars_.device());
  for (size_t p = 0; p < from_compute_.size(); ++p) Tensor(grads_[p]).copy_(from_compute_[p]);
  found_.zero_();
  for (Tensor t : grads_)
    if (loss_scaling) CZ_CUDA_CALL(cuda::unscale_and_check_dev(t, scalars_, found_, stream));
  // The same sums as global_grad_norm's, left on the device.
  Tensor sq;
  for (const Tensor& t : grads_) sq = sq.defined() ? add(sq, grad_sq_norm(t)) : grad_sq_norm(t);
  CZ_CUDA_CALL(cuda::clip_scalars(sq, found_, args_.clip_grad, scalars_, stream));
  for (Tensor t : grads_)
    if (args_.clip_grad > 0) CZ_CUDA_CALL(cuda::scale_dev(t, scalars_, found_, stream));
  optimizer_->step_on_device(std::span<const Tensor>(weights_), std::span<const Tensor>(grads_), scalars_,
                             found_);
  if (ema_) ema_->update(std::span<const Tensor>(weights_), ema_->decay(), found_);
}

void ShardedState::finish_device_step(LossScaler& scaler, StepStats& s) {
  const std::vector<double> r = scalars_.narrow(0, optim_scalars::kNorm, 2).to_vector<double>();
  const bool overflow = r[1] != 0;
  // The kernels skipped exactly when the flag was set: update() decides the same (and moves the scale).
  const bool take = scaler.enabled() ? scaler.update(overflow) : !overflow;
  CZ_ASSERT(take == !overflow, "the LossScaler took a step the device skipped, or the reverse");
  s.skipped = !take;
  s.grad_norm = r[0];
  optimizer_->count_step(take);
  if (take) {
    for (const Tensor& w : weights_) w.storage()->bump_version();
  }
}

void ShardedState::receive(size_t p, const Tensor& chunk) {
  Tensor dst = grad_shard_.narrow(0, layout_.local_offset(p), layout_.chunk(p));
  if (!received_.empty() && !received_[p]) {
    dst.copy_streaming_(chunk);
    received_[p] = 1;
  } else {
    dst.add_(chunk.dtype() == DType::f32 ? chunk : chunk.to(DType::f32));
  }
}

bool ShardedState::step(LossScaler& scaler, StepStats& s) {
  NoGradGuard no_grad;
  for (size_t p = 0; p < from_compute_.size(); ++p) Tensor(grads_[p]).copy_(from_compute_[p]);
  // Where reductions deliver the chunks: those none delivered this step (all of them in a step without
  // backward) read zero.
  if (from_compute_.empty())
    for (size_t p = 0; p < received_.size(); ++p)
      if (!received_[p]) Tensor(grads_[p]).zero_();
  received_.clear();
  if (!prepare_gradients(scaler, s)) return false;
  optimizer_->step(std::span<const Tensor>(weights_), std::span<const Tensor>(grads_), args_.lr);
  update_ema();
  return true;
}

bool ShardedState::prepare_gradients(LossScaler& scaler, StepStats& s) {
  bool take = true;
  if (scaler.enabled()) {
    bool overflow = false;
    for (const Tensor& t : grads_) overflow = scaler.unscale_(t) || overflow;
    // Every rank must skip the same steps: any rank's overflow is everyone's.
    overflow = group_.all_reduce(overflow ? 1.0 : 0.0, dist::ReduceOp::sum) > 0;
    take = scaler.update(overflow);
  }
  s.skipped = !take;
  s.grad_norm = global_grad_norm();
  if (take && args_.clip_grad > 0) {
    const double coef = clip_coefficient(s.grad_norm, args_.clip_grad);
    for (const Tensor& t : grads_) scale_(t, coef);
  }
  return take;
}

double ShardedState::global_grad_norm() {
  Tensor sq;
  for (const Tensor& t : grads_) sq = sq.defined() ? add(sq, grad_sq_norm(t)) : grad_sq_norm(t);
  return std::sqrt(group_.all_reduce(sq.item(), dist::ReduceOp::sum));
}

void ShardedState::update_ema() {
  if (ema_) ema_->update(std::span<const Tensor>(weights_), ema_->decay());
}

void ShardedState::write_compute(const std::vector<Tensor>& compute_chunks) {
  NoGradGuard no_grad;
  if (!master_.defined()) return;
  for (size_t p = 0; p < compute_chunks.size(); ++p) Tensor(compute_chunks[p]).copy_(weights_[p]);
}

std::vector<std::pair<std::string, std::vector<std::pair<ShardRange, Tensor>>>> ShardedState::owned() const {
  const int me = group_.rank();
  std::vector<std::pair<std::string, std::vector<std::pair<ShardRange, Tensor>>>> out;
  auto chunks_of = [&](const Tensor& shard_buffer) {  // a buffer laid out like this rank's shard
    std::vector<std::pair<ShardRange, Tensor>> v;
    for (size_t p = 0; p < layout_.partitions.size(); ++p)
      v.emplace_back(layout_.chunk_range(p, me),
                     shard_buffer.narrow(0, layout_.local_offset(p), layout_.chunk(p)));
    return v;
  };
  std::vector<std::pair<ShardRange, Tensor>> params;
  for (size_t p = 0; p < weights_.size(); ++p) params.emplace_back(layout_.chunk_range(p, me), weights_[p]);
  out.emplace_back("params", std::move(params));
  for (const auto& [name, t] : optimizer_->state())
    if (name != "step") out.emplace_back(name, chunks_of(t));
  if (ema_) out.emplace_back("ema", chunks_of(ema_->weights()));
  return out;
}

int64_t ShardedState::state_bytes() const {
  int64_t n = held_bytes(grad_shard_) + held_bytes(master_);
  for (const auto& [name, t] : optimizer_->state())
    if (name != "step") n += held_bytes(t);
  return n;
}

int64_t ShardedState::ema_bytes() const {
  return ema_ ? held_bytes(ema_->weights()) : 0;
}

}  // namespace cz::zero
