// The normalization layers' ops as a model's walk hands them to its sink (NormOp, model.h): what each op of
// src/tensor/ops allocates and keeps for backward, and its least work, in one place for the planner's
// memory replay and the what-if's op costs.
#pragma once

#include <cstdint>

#include "nn/model.h"

namespace cz::nn {

// layer_norm over the last dim of rows x c activations (tensor/ops/layer_norm.cpp).
NormOp layer_norm_op(int64_t rows, int64_t c);
// grn over `images` NHWC images of rows x c activations in all (tensor/ops/grn.cpp).
NormOp grn_op(int64_t images, int64_t rows, int64_t c);

}  // namespace cz::nn
