// An identity op whose backward calls a function: how module backward hooks observe the backward pass.
#pragma once

#include <functional>

#include "tensor/tensor.h"

namespace cz {

// Returns a tensor equal to `x` (sharing its storage) whose gradient, when it arrives in backward, first runs
// `on_grad` and then flows on to `x` unchanged. With grad mode off or `x` not requiring grad, returns `x`.
Tensor with_backward_callback(const Tensor& x, std::function<void()> on_grad);

}  // namespace cz
