// Pooling.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// Mean over H and W. x: (N, H, W, C) -> (N, C).
Tensor global_avg_pool(const Tensor& x);

}  // namespace cz
