// Elementwise arithmetic. Shapes must match exactly: nothing broadcasts implicitly; per-channel scaling of
// NHWC data is its own op (channel_scale, residual_scale_add).
#pragma once

#include "tensor/tensor.h"

namespace cz {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double factor);  // x * factor
// x: (..., C), gamma: (C) -> x * gamma (ConvNeXt's layer scale).
Tensor channel_scale(const Tensor& x, const Tensor& gamma);
// residual + x * gamma, fused (layer scale + residual connection of a ConvNeXt block). Same shapes as above.
Tensor residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma);

}  // namespace cz
