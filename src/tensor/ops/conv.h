// The two convolutions ConvNeXt uses, on NHWC activations with PyTorch-layout weights.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// Depthwise k x k convolution (k odd; ConvNeXt uses 7), stride 1, zero padding k/2, so H and W are kept.
// x: (N, H, W, C); weight: (C, 1, k, k) (PyTorch's layout); bias: (C) or undefined -> (N, H, W, C).
Tensor depthwise_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Patchify convolution: kernel = stride = k, no padding (ConvNeXt's 4x4/4 stem, 2x2/2 downsampling).
// x: (N, H, W, Cin); weight: (Cout, Cin, k, k) (PyTorch's layout); bias: (Cout) or undefined
// -> (N, H/k, W/k, Cout), rounding down as PyTorch does.
Tensor patchify_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace cz
