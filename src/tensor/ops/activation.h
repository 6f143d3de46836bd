// Activations.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))). Any shape.
Tensor gelu(const Tensor& x);

}  // namespace cz
