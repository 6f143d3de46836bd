// Stochastic depth.
#pragma once

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace cz {

// Per-sample drop path: each sample (index along dim 0) is zeroed with probability p, survivors are scaled by
// 1 / (1 - p). p = 0 returns x itself. The mask comes from `gen`, so the same generator state gives the same
// mask on every device. 0 <= p < 1.
Tensor drop_path(const Tensor& x, double p, Generator& gen);

}  // namespace cz
