// One description per op drives its tests: the naive reference comparison, the f64 gradient check, and (with
// a GPU) the CPU-vs-CUDA comparison. Adding an op means adding one entry to op_table.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/gradcheck.h"

namespace cz::testing {

struct OpCase {
  std::string name;
  // Inputs in `dtype` on the CPU, from `seed`. Floating inputs that should be gradient-checked come back with
  // requires_grad set; integer inputs (labels) never do.
  std::function<std::vector<Tensor>(DType dtype, uint64_t seed)> inputs;
  TensorFn fn;                              // the op under test
  TensorFn reference;                       // naive loops on f64 host data
  double f32_rtol = 1e-5, f32_atol = 1e-5;  // f32 kernel against the f64 reference
  double grad_atol = 1e-6, grad_rtol = 1e-5;
  double bf16_rtol = 2e-2, bf16_atol = 2e-2;  // CUDA bf16 against CPU f32
};

const std::vector<OpCase>& op_cases();

// Host access for references: contiguous f64 values, and building a result from them.
std::vector<double> host(const Tensor& t);
Tensor make(const std::vector<double>& v, const Shape& shape);
// Inputs helper: a random f64 tensor converted to `dtype`, optionally requiring grad.
Tensor input(const Shape& shape, DType dtype, uint64_t seed, bool grad = true, double lo = -1, double hi = 1);

}  // namespace cz::testing
