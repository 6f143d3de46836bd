// LayerNorm over the last dimension: the channel dimension of NHWC activations.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// x: (..., C); weight, bias: (C), or undefined for no affine transform. Biased variance, as PyTorch.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

}  // namespace cz
