// Matrix products and the fully connected layer.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// a: (M, K), b: (K, N) -> (M, N).
Tensor matmul(const Tensor& a, const Tensor& b);
// x: (..., in), weight: (out, in) (PyTorch's layout), bias: (out) or undefined -> (..., out).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace cz
