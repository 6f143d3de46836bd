// SGD with momentum over a shard of the flat parameter space, matching torch.optim.SGD (coupled weight decay,
// dampening, Nesterov): see SgdStepArgs (kernel_args.h) for the update.
#pragma once

#include "optim/kernel_args.h"
#include "optim/optimizer.h"

namespace cz {

struct SgdConfig {
  double momentum = 0.0;   // [0, 1); 0 keeps no buffer
  double dampening = 0.0;  // [0, 1]
  bool nesterov = false;   // needs momentum > 0 and dampening 0 (as PyTorch)
};

// State: "momentum_buffer" (only when momentum != 0; Note [Optimizer state layout]) and "step". As in
// PyTorch, the first step initialises the buffer to the (weight-decayed) gradient.
class Sgd final : public Optimizer {
 public:
  // hyper: one entry per segment of `layout`; weight_decay here is coupled (added to the gradient).
  Sgd(const FlatLayout& layout, ShardRange shard, const std::vector<ParamHyper>& hyper, SgdConfig config = {},
      DType dtype = DType::f32, Device device = Device::cpu())
      : Sgd(layout, std::vector<ShardRange>{shard}, hyper, config, dtype, device) {}
  // A shard of several ranges (Note [Optimizer state layout]); pinned_state: see Optimizer.
  Sgd(const FlatLayout& layout, std::vector<ShardRange> ranges, const std::vector<ParamHyper>& hyper,
      SgdConfig config = {}, DType dtype = DType::f32, Device device = Device::cpu(),
      bool pinned_state = false);

  NamedTensors state() const override;
  void load_state(const NamedTensors& state) override;

  const SgdConfig& config() const { return config_; }
  const Tensor& momentum_buffer() const { return momentum_buffer_; }  // undefined when momentum == 0

 private:
  void update_range(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                    std::span<const ShardPiece> pieces, double lr) override;
  void update_range_dev(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                        std::span<const ShardPiece> pieces, const Tensor& scalars,
                        const Tensor& found) override;
  void write_own_scalars(double* slots) const override;
  void finish_step(std::span<const Tensor> params) override;

  SgdConfig config_;
  Tensor momentum_buffer_;
};

}  // namespace cz
