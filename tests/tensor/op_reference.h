// Naive f64 references for the ConvNeXt ops: plain loops over host values, written for clarity, not speed.
// Inputs may be any floating dtype (labels: any integer dtype); results are f64 CPU tensors.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace cz::testing {

Tensor ref_gelu(const Tensor& x);
// weight/bias: nullptr for none.
Tensor ref_layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, double eps);
// x: (N, H, W, C); weight: (C, 1, k, k); bias: nullptr for none.
Tensor ref_depthwise_conv2d(const Tensor& x, const Tensor& weight, const Tensor* bias);
// x: (N, H, W, Cin); weight: (Cout, Cin, k, k); bias: nullptr for none.
Tensor ref_patchify_conv2d(const Tensor& x, const Tensor& weight, const Tensor* bias);
Tensor ref_global_avg_pool(const Tensor& x);
// x: (N, H, W, C); gamma, beta: (C). timm's GlobalResponseNorm (channels last).
Tensor ref_grn(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps);
// y = x w^T + bias over the last dim of x; w: (out, in).
Tensor ref_linear(const Tensor& x, const Tensor& weight, const Tensor* bias);
Tensor ref_cross_entropy(const Tensor& logits, const Tensor& labels, double smoothing);
// mean_n sum_k -t_nk log_softmax(z_n)_k, as timm's SoftTargetCrossEntropy.
Tensor ref_soft_target_cross_entropy(const Tensor& logits, const Tensor& targets);
// Recomputes the mask from a fresh Generator(seed), as drop_path(x, p, gen) with gen = Generator(seed).
Tensor ref_drop_path(const Tensor& x, double p, uint64_t seed);

}  // namespace cz::testing
