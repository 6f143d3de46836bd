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

}  // namespace cz
