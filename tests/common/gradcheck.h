// Test helpers shared by every suite: random inputs, closeness assertions, and finite-difference gradient
// checks.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace cz::testing {

// Uniform in [lo, hi), never exactly zero (zeros hide unwritten outputs and wrong indexing).
Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double lo = -1.0,
                     double hi = 1.0);

// Elementwise |a - b| <= atol + rtol * |b|, reporting the worst element.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol);

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks the analytic gradient of `fn` against central differences, for every input that requires grad.
// Inputs should be f64. The output is projected on a random tensor w, so every output element's gradient is
// checked: d<fn(x), w>/dx. Reports the worst element per input.
::testing::AssertionResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
                                     double atol = 1e-6, double rtol = 1e-5);

// fn's output followed by the gradients of <fn(inputs), w> for w a fixed random tensor, for every floating
// input (inputs are cloned; integer inputs such as labels get none).
std::vector<Tensor> output_and_grads(const TensorFn& fn, const std::vector<Tensor>& inputs);

}  // namespace cz::testing
