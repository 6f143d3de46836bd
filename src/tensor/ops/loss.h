// Classification loss and metrics.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace cz {

// Softmax cross-entropy with label smoothing, averaged over the batch (PyTorch's F.cross_entropy with
// label_smoothing): target = (1 - s) one_hot(label) + s / K. logits: (N, K) float; labels: (N) i64 or i32 in
// [0, K); a label out of range is a ValueError naming its index and value. Returns a scalar.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing = 0.0);

// Softmax cross-entropy against soft targets, averaged over the batch: mean_n sum_k -t_nk log_softmax(z_n)_k
// (timm's SoftTargetCrossEntropy, the loss of Mixup/CutMix with smoothing folded into the targets).
// logits: (N, K) float; targets: (N, K), the logits' dtype and device. Rows need not sum to 1 (the gradient
// is exact either way: dz = (softmax(z) sum_k t_k - t) / N). Both inputs are differentiable. Returns a
// scalar.
Tensor soft_target_cross_entropy(const Tensor& logits, const Tensor& targets);

// Index of the largest value along the last dimension. x: (..., K) -> (...) i64. Not differentiable.
Tensor argmax(const Tensor& x);
// Number of rows whose argmax equals the label. logits: (N, K), labels: (N).
int64_t count_correct(const Tensor& logits, const Tensor& labels);
// Number of rows whose label is among the k largest logits (top-k accuracy's numerator), 1 <= k <= K. Ties
// and NaN rank as argmax ranks them: NaN above every number, and among equal values the lower index first,
// so count_top_k(logits, labels, 1) == count_correct(logits, labels). logits: (N, K), labels: (N).
int64_t count_top_k(const Tensor& logits, const Tensor& labels, int64_t k);

}  // namespace cz
