// The ConvNeXt MLP's linear layers with their epilogues fused (Note [Fused epilogues on the CPU]).
#pragma once

#include "tensor/tensor.h"

namespace cz {

// gelu(linear(x, weight, bias)) in one op. x: (..., in), weight: (out, in), bias: (out) or undefined ->
// (..., out). Saves what linear and gelu would: x and the pre-activation.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// residual_scale_add(residual, linear(x, weight, bias), gamma) in one op: residual + gamma * (x weight^T +
// bias). x: (..., in), weight: (out, in), bias: (out) or undefined, gamma: (out), residual: (..., out). Saves
// what the two ops would: x, and the linear output before gamma.
Tensor linear_scale_residual(const Tensor& residual, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, const Tensor& gamma);

// ConvNeXt's MLP branch with layer scale and residual in one op (Note [The MLP on one tile]):
// residual + gamma * linear(gelu(linear(x, w1, b1)), w2, b2). x, residual: (..., C); w1: (H, C); w2: (C, H);
// b1: (H), b2: (C), either may be undefined; gamma: (C). Saves x, fc1's pre-activation and fc2's output
// before gamma; backward recomputes the GELU output. On CUDA the existing kernels in sequence.
Tensor mlp_scale_residual(const Tensor& residual, const Tensor& x, const Tensor& w1, const Tensor& b1,
                          const Tensor& w2, const Tensor& b2, const Tensor& gamma);
// Whether a ConvNeXt block on `device` runs its MLP as mlp_scale_residual (the CPU, where both weights of
// channels x hidden fit the per-thread partial sums of their gradients) rather than as linear_gelu and
// linear_scale_residual. The block and the planner's replay ask the same question.
bool mlp_as_one_op(bool cuda, int64_t channels, int64_t hidden);

}  // namespace cz
