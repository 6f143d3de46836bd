// Global Response Normalization (ConvNeXt V2's GRN, timm's GlobalResponseNorm with channels last).
#pragma once

#include "tensor/tensor.h"

namespace cz {

// x: (N, H, W, C); gamma, beta: (C) (timm's weight and bias). Per image and channel the L2 norm over H and
// W, gx (N, 1, 1, C), is divided by its mean over the channels plus eps: nx = gx / (mean_c(gx) + eps), and
// y = x + (beta + gamma * (x * nx)). timm's eps is 1e-6. f32/f64 on the CPU; f32/f64/f16/bf16 on CUDA
// (computed in f32 for the 16-bit types).
Tensor grn(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-6);

}  // namespace cz
