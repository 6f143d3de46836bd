// Reductions to a scalar (shape ()).
#pragma once

#include "tensor/tensor.h"

namespace cz {

Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

}  // namespace cz
