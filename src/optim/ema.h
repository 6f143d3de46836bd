// Exponential moving average of weights over a flat buffer (or a ZeRO shard of it), as timm's ModelEmaV2:
// ema = decay * ema + (1 - decay) * params after each optimizer step; swap() exchanges the EMA weights with
// the live ones for evaluation and back.
#pragma once

#include <span>

#include "optim/optimizer.h"

namespace cz {

class WeightEma {
 public:
  // Starts as a copy of `params` (f32/f64, contiguous; typically the flat master weights or a shard of them).
  // decay in [0, 1].
  WeightEma(const Tensor& params, double decay) : WeightEma(std::span<const Tensor>(&params, 1), decay) {}
  // An EMA of several 1-D pieces (a ZeRO rank's chunks: Note [ZeRO partitioning]), kept as one buffer, the
  // pieces back to back. update() and swap() then take the same pieces in the same order.
  WeightEma(std::span<const Tensor> params, double decay);

  // ema = decay * ema + (1 - decay) * params. Refused while swapped.
  void update(const Tensor& params);
  // The same with an explicit decay (for a warmup of the decay, as timm's `min(decay, (1 + n) / (10 + n))`).
  void update(const Tensor& params, double decay) { update(std::span<const Tensor>(&params, 1), decay); }
  // skip (CUDA: a 0-d f32 flag on the EMA's device, read by the kernel): nothing changes where it is != 0, so
  // a CUDA graph can replay the update of a step it may skip (Note [The optimizer's device scalars]).
  void update(std::span<const Tensor> params, double decay, const Tensor& skip = Tensor());

  // Exchanges the values of `params` and the EMA weights in place (the parameters' storage is kept, so every
  // view of it sees the EMA weights). Call again to swap back. Costs one temporary copy of the buffer.
  void swap(const Tensor& params) { swap(std::span<const Tensor>(&params, 1)); }
  void swap(std::span<const Tensor> params);
  bool swapped() const { return swapped_; }

  const Tensor& weights() const { return ema_; }  // the EMA (the live weights while swapped)
  double decay() const { return decay_; }

  // For checkpoints: {"ema"} laid out like `params` (Note [Optimizer state layout]). Refused while swapped.
  NamedTensors state() const;
  void load_state(const NamedTensors& state);

 private:
  void check_params(const char* op, std::span<const Tensor> params) const;

  Tensor ema_;
  double decay_;
  bool swapped_ = false;
};

}  // namespace cz
