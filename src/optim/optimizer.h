// The optimizer interface over a shard of the flat parameter space, and the state-layout contract that
// checkpointing and ZeRO build on (Note [Optimizer state layout]).
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "optim/param_groups.h"

namespace cz {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Note [Optimizer state layout]: an optimizer owns state for its shard [begin, end) of the flat space only.
// Every per-element state tensor (exp_avg, exp_avg_sq, momentum_buffer) is 1-D, shard.numel() elements, in
// the optimizer's dtype and device, laid out exactly like the shard: element i belongs to flat offset begin +
// i, and padding elements have state like any other. So the state of a whole model is the concatenation of
// the shards' state in rank order, and resharding is cutting that concatenation at new boundaries. The scalar
// "step" (0-d i64 on the CPU) counts the steps taken; every shard of one model has the same value.
//
// A shard may also be several ranges of the flat space (a ZeRO rank owns one chunk of every bucket or unit:
// Note [ZeRO partitioning] in dist/zero/partition.h). Its state is then the ranges' state concatenated in
// range order, and step() takes one params/grads tensor per range, so the parameters can stay where they
// are (chunks of a full flat buffer) while the state is one contiguous allocation.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates `params` in place. params, grads: 1-D, contiguous, shard().numel() elements, of the optimizer's
  // dtype and device. lr >= 0 is the scheduled learning rate (each piece multiplies it by its lr_scale).
  void step(const Tensor& params, const Tensor& grads, double lr) { step({&params, 1}, {&grads, 1}, lr); }
  // The same over a shard of several ranges: params[i], grads[i] hold ranges()[i].numel() elements.
  void step(std::span<const Tensor> params, std::span<const Tensor> grads, double lr);
  // One step taken range by range, as each range's gradient becomes ready (CPU offload): step_range(i, ...)
  // once for every range, in any order, then end_step(). Same arithmetic as step(), bit for bit.
  void step_range(size_t i, const Tensor& params, const Tensor& grads, double lr);
  void end_step();

  // The update with its per-step scalars in device memory, so that a CUDA graph can replay it (Note [The
  // optimizer's device scalars] in optim/device_scalars.h; CUDA only). write_scalars fills this step's
  // host-written slots of `slots` (optim_scalars::kSlots doubles): lr, and the bias corrections of step
  // step_count() + 1 or SGD's first-step flag. step_on_device queues the update of every range reading
  // `scalars` (those slots, uploaded) and skipping where `found` (0-d f32) != 0; it does not count the step:
  // count_step(taken) does, once the host has read whether it was skipped.
  void write_scalars(double lr, double* slots) const;
  void step_on_device(std::span<const Tensor> params, std::span<const Tensor> grads, const Tensor& scalars,
                      const Tensor& found);
  void count_step(bool taken);

  // The live state tensors (views, not copies) and "step"; see Note [Optimizer state layout].
  virtual NamedTensors state() const = 0;
  // Copies values in: exactly the names state() returns, each of the same shape (dtype converted).
  virtual void load_state(const NamedTensors& state) = 0;

  const char* name() const { return name_; }
  int64_t step_count() const { return step_; }
  // For checkpoints whose state tensors were written into state()'s views directly.
  void set_step_count(int64_t steps);
  // The single range of a one-range shard (asserts there is one).
  ShardRange shard() const;
  const std::vector<ShardPiece>& pieces() const;
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  int64_t numel() const { return numel_; }  // elements of state per per-element state tensor
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

 protected:
  // pinned_state: the state in pinned host memory (CPU offload: Note [CPU offload]); device must be the CPU.
  Optimizer(const char* name, const FlatLayout& layout, std::vector<ShardRange> ranges,
            const std::vector<ParamHyper>& hyper, DType dtype, Device device, bool pinned_state = false);
  // One range's update: p, g hold ranges()[i].numel() elements; `state_offset` is where the range's state
  // starts in the state tensors; `pieces` are the range's (Note [Shard pieces]).
  virtual void update_range(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                            std::span<const ShardPiece> pieces, double lr) = 0;
  // update_range reading the step's scalars from device memory (step_on_device).
  virtual void update_range_dev(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                                std::span<const ShardPiece> pieces, const Tensor& scalars,
                                const Tensor& found) = 0;
  // This optimizer's slots of write_scalars (bias corrections, first-step flag).
  virtual void write_own_scalars(double* slots) const = 0;
  // Called once per step() after every range has been updated.
  virtual void finish_step(std::span<const Tensor> params) {}
  // Throws naming the optimizer and what is wrong with the arguments of step().
  void check_step(std::span<const Tensor> params, std::span<const Tensor> grads, double lr) const;
  void check_range(size_t i, const Tensor& params, const Tensor& grads) const;
  Tensor new_state() const;  // zeros of the shard's size, dtype and device
  Tensor step_tensor() const;
  // Checks that `state` holds exactly `names` plus "step", copies each named tensor into `dst` (same order as
  // names) and sets the step count.
  void load_named(const NamedTensors& state, const std::vector<std::string>& names,
                  const std::vector<Tensor*>& dst);
  static void bump(const Tensor& t) { t.storage()->bump_version(); }

  const char* name_;
  std::vector<ShardRange> ranges_;
  std::vector<int64_t> offsets_;                 // state offset of each range
  std::vector<std::vector<ShardPiece>> pieces_;  // per range
  int64_t numel_ = 0;
  DType dtype_;
  Device device_;
  bool pinned_state_ = false;
  int64_t step_ = 0;
};

}  // namespace cz
