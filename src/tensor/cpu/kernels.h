// CPU kernels. Callers (ops) have validated shapes, dtypes and devices; kernels take contiguous tensors
// unless a comment says otherwise, and compute in f32 or f64 (f64 exists for gradient checks).
#pragma once

#include "tensor/tensor.h"

namespace cz::cpu {

// Threads each kernel may use: the cores this process may run on divided among the ranks sharing the node.
// See parallel.h.

// Basic memory ops (any strides, any dtype).
void fill(Tensor& dst, double value);
void copy(const Tensor& src, Tensor& dst);            // converts dtype
void axpy(const Tensor& x, double alpha, Tensor& y);  // y += alpha * x; y and x same shape, any strides
void scale(Tensor& x, double factor);

}  // namespace cz::cpu
