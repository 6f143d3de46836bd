// Global-norm gradient clipping over flat gradient buffers, split so ZeRO can sum partial norms across ranks:
//   partial = grad_sq_norm(my grad shard)       (each rank)
//   total   = sqrt(all-reduce-sum(partial))     (the caller; a single process skips the all-reduce)
//   scale_(my grad shard, clip_coefficient(total, max_norm))
// and the non-finite check behind loss scaling.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// Sum of squares of `grads` (any shape, f32/f64), accumulated in f64, as a 0-d f64 tensor on the same device
// (so it can be all-reduced without a host round trip; .item() reads it). Deterministic for any thread count.
Tensor grad_sq_norm(const Tensor& grads);

// min(1, max_norm / (total_norm + 1e-6)), as torch.nn.utils.clip_grad_norm_. max_norm must be finite and
// > 0. A non-finite total_norm gives a non-finite coefficient, as in PyTorch: check for overflow first (the
// LossScaler does).
double clip_coefficient(double total_norm, double max_norm);

// grads *= coef in place (contiguous f32/f64); coef == 1 does nothing.
void scale_(const Tensor& grads, double coef);

// True when `t` (f32/f64, any shape) holds an Inf or NaN. Reads the answer back to the host.
bool has_non_finite(const Tensor& t);

// One-process convenience: clips `grads` to max_norm and returns the norm before clipping.
double clip_grad_norm_(const Tensor& grads, double max_norm);

}  // namespace cz
