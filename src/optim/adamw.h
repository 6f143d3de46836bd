// AdamW (decoupled weight decay, Loshchilov & Hutter) over a shard of the flat parameter space, matching
// torch.optim.AdamW: see AdamWStepArgs (kernel_args.h) for the update and docs/optim.md for the details.
#pragma once

#include "optim/kernel_args.h"
#include "optim/optimizer.h"

namespace cz {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;  // added to sqrt(v_hat), outside the square root (PyTorch)
};

// State: "exp_avg", "exp_avg_sq" (Note [Optimizer state layout]) and "step".
class AdamW final : public Optimizer {
 public:
  // hyper: one entry per segment of `layout` (weight decay, lr scale), e.g. timm_weight_decay(layout, 0.05).
  // The state is allocated for the shard only, zeroed, in `dtype` on `device`.
  AdamW(const FlatLayout& layout, ShardRange shard, const std::vector<ParamHyper>& hyper,
        AdamWConfig config = {}, DType dtype = DType::f32, Device device = Device::cpu())
      : AdamW(layout, std::vector<ShardRange>{shard}, hyper, config, dtype, device) {}
  // A shard of several ranges (Note [Optimizer state layout]); pinned_state: see Optimizer.
  AdamW(const FlatLayout& layout, std::vector<ShardRange> ranges, const std::vector<ParamHyper>& hyper,
        AdamWConfig config = {}, DType dtype = DType::f32, Device device = Device::cpu(),
        bool pinned_state = false);

  NamedTensors state() const override;
  void load_state(const NamedTensors& state) override;

  const AdamWConfig& config() const { return config_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }

 private:
  void update_range(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                    std::span<const ShardPiece> pieces, double lr) override;
  void update_range_dev(Tensor& p, const Tensor& g, int64_t state_offset, int64_t numel,
                        std::span<const ShardPiece> pieces, const Tensor& scalars,
                        const Tensor& found) override;
  void write_own_scalars(double* slots) const override;
  void finish_step(std::span<const Tensor> params) override;

  AdamWConfig config_;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

}  // namespace cz
