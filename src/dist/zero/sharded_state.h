// The sharded optimizer state: this rank's fp32 master chunks (under mixed precision or offload), its fp32
// gradient chunks, and the optimizer and EMA the trainer built for them; the step's unscale, overflow
// decision, global norm, clipping and update, over the process group the state is sharded across (a group of
// one at stage 0, where every rank holds all of it).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/comm/process_group.h"
#include "dist/zero/partition.h"
#include "dist/zero/step_stats.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace cz::zero {

// What an optimizer is built over: this rank's ranges of the flat parameter space, on `device` (the CPU
// under offload, with its state in pinned memory: `pinned`).
struct ShardSpec {
  const FlatLayout& flat;
  std::vector<ShardRange> ranges;
  Device device;
  bool pinned = false;
};
using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(const ShardSpec&)>;
// Builds the EMA of this rank's master chunks (f32, one per partition); empty: no EMA.
using MakeEma = std::function<std::unique_ptr<WeightEma>(std::span<const Tensor> weights)>;

// The step's learning rate and clipping, given when it begins: offload updates each range from the
// reducer's hand-off as soon as its gradient arrives.
struct UpdateArgs {
  double lr = 0;
  double clip_grad = 0;  // 0: no clipping
  double inv_scale = 1;  // fp16: 1 / the step's loss scale (the device-scalar update reads it)
};

class ShardedState {
 public:
  // Per partition p: weights[p] is this rank's master chunk (a view of `master`, or of the compute copy in
  // fp32 without offload), grads[p] its fp32 gradient chunk (a view of `grad_shard`, or of the reducer's full
  // buffer); from_compute[p], where given, the 16-bit gradient chunk each step copies into grads[p] first.
  // `host`: master, gradients and optimizer state live in pinned host memory (offload).
  ShardedState(const ZeroLayout& layout, dist::ProcessGroup group, Tensor master, Tensor grad_shard,
               bool host, std::vector<Tensor> weights, std::vector<Tensor> grads,
               std::vector<Tensor> from_compute, const MakeOptimizer& make_optimizer,
               const MakeEma& make_ema);

  // Gradient chunks to zero (except under offload): filled on CUDA, deferred on the CPU (receive, step).
  void begin_step(const UpdateArgs& plan);
  const UpdateArgs& update_args() const { return args_; }
  // A partition's reduced chunk, added into its fp32 gradient chunk.
  void receive(size_t p, const Tensor& chunk);
  // The update on every chunk, after the last backward: whether it was taken (not an fp16 overflow).
  bool step(LossScaler& scaler, StepStats& s);
  // fp16 unscale and the group's overflow decision, the global norm, clipping: whether to take the step.
  bool prepare_gradients(LossScaler& scaler, StepStats& s);
  double global_grad_norm();
  void update_ema();

  // The step as device work only, for a CUDA graph to capture and replay (Note [The optimizer's device
  // scalars] in optim/device_scalars.h): one rank, CUDA, no offload. use_device_scalars() allocates the
  // scalars and the overflow flag; each begin_step() then uploads the step's host-written slots (lr, bias
  // corrections, 1 / loss scale); device_step() queues the copy from the compute gradients, fp16's unscale
  // and check, the norm, the clip coefficient, clipping, the update and the EMA, none reading the device from
  // the host; finish_device_step(), after the step's closing synchronize, reads the norm and the flag (one
  // 16-byte copy) and advances the LossScaler and the optimizer's step count on the host.
  void use_device_scalars();
  bool device_scalars() const { return scalars_.defined(); }
  void device_step(bool loss_scaling);
  void finish_device_step(LossScaler& scaler, StepStats& s);
  // The master chunks cast into the compute copy's chunks (nothing to do where they are the same).
  void write_compute(const std::vector<Tensor>& compute_chunks);

  const std::vector<Tensor>& weights() const { return weights_; }
  const std::vector<Tensor>& grads() const { return grads_; }
  const Tensor& master() const { return master_; }
  const Tensor& grad_shard() const { return grad_shard_; }
  Optimizer& optimizer() { return *optimizer_; }
  WeightEma* ema() { return ema_.get(); }
  const dist::ProcessGroup& group() const { return group_; }
  // Checkpoints' view of this state (ZeroEngine::owned_state), in flat ranges.
  std::vector<std::pair<std::string, std::vector<std::pair<ShardRange, Tensor>>>> owned() const;

  // Gradient chunks, master chunks and optimizer state, as the allocator holds them; the EMA's.
  int64_t state_bytes() const;
  int64_t ema_bytes() const;

 private:
  const ZeroLayout& layout_;
  dist::ProcessGroup group_;
  Tensor master_, grad_shard_;
  bool host_ = false;
  std::vector<Tensor> weights_, grads_, from_compute_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<WeightEma> ema_;
  UpdateArgs args_;
  std::vector<char> received_;  // on the CPU, per partition: its chunk came this step (empty: filled)
  Tensor scalars_, found_;      // use_device_scalars(): f64 [optim_scalars::kSlots] and the 0-d f32 flag
};

}  // namespace cz::zero
