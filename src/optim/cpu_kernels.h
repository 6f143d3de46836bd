// CPU kernels of the optimizer layer. Callers have validated shapes, dtypes and devices: every tensor is
// contiguous, on the CPU, f32 or f64, and the tensors of one call share a dtype. Update kernels take a shard
// (1-D, shard.numel() elements) and its pieces (Note [Shard pieces]); updates are SIMD (tensor/cpu/simd.h)
// and OpenMP-parallel, and give the same bits for an element whatever the shard boundaries or thread count.
#pragma once

#include <span>

#include "optim/kernel_args.h"
#include "optim/param_groups.h"
#include "tensor/tensor.h"

namespace cz::cpu {

// p, g, exp_avg, exp_avg_sq: (n). See AdamWStepArgs for the formula.
void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq,
                std::span<const ShardPiece> pieces, const AdamWStepArgs& args);
// p, g: (n); momentum_buffer: (n), or undefined when args.momentum == 0.
void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buffer, std::span<const ShardPiece> pieces,
              const SgdStepArgs& args);

// out: 0-d f64 = sum of x*x over x, accumulated in f64 in fixed blocks, so the value does not depend on the
// thread count.
void sq_norm(const Tensor& x, Tensor& out);
// x *= factor, and found (0-d f32) is set to 1 if x holds any Inf or NaN afterwards (an Inf or NaN stays one
// when scaled by a finite factor, and an overflow of the product is caught too); found is never reset to 0,
// so one flag can collect several tensors. factor == 1: x is only read.
void unscale_and_check(Tensor& x, double factor, Tensor& found);
// ema = decay * ema + (1 - decay) * p.
void ema_update(Tensor& ema, const Tensor& p, double decay);

}  // namespace cz::cpu
