// Arguments of the optimizer kernels, shared by the CPU kernels (cpu_kernels.h) and the CUDA entry points
// (cuda_kernels.h) so both backends implement exactly the same update.
#pragma once

#include <cstdint>

namespace cz {

// One AdamW step over a shard; per-piece weight_decay and lr_scale come from the ShardPieces.
// With lr_p = lr * lr_scale, wd = the piece's weight_decay, for every element:
//   p *= 1 - lr_p * wd
//   m  = m + (1 - beta1) * (g - m)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= (lr_p / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
struct AdamWStepArgs {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  int64_t step = 1;  // 1-based index of the step being taken (bias correction)
};

// One SGD step (PyTorch semantics), with lr_p = lr * lr_scale and wd = the piece's weight_decay:
//   g' = g + wd * p
//   momentum != 0: buf = first_step ? g' : momentum * buf + (1 - dampening) * g'
//                  g' = nesterov ? g' + momentum * buf : buf
//   p -= lr_p * g'
struct SgdStepArgs {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the buffer is initialised to g' (PyTorch's clone) instead of being updated
};

}  // namespace cz
