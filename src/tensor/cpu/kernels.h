// CPU kernels. Callers (ops) have validated shapes, dtypes and devices; kernels take contiguous tensors
// unless a comment says otherwise, and compute in f32 or f64 (f64 exists for gradient checks). Threads: see
// parallel.h.
#pragma once

#include <type_traits>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace cz::cpu {

using cz::BinaryOp;

// Calls f(float{}) or f(double{}) for the kernel's compute type.
template <class F>
decltype(auto) visit_float(DType t, F&& f) {
  if (t == DType::f64) return f(double{});
  CZ_CHECK_DTYPE(t == DType::f32, "CPU kernels compute in f32 or f64, got {}", dtype_name(t));
  return f(float{});
}

// Memory ops (any strides, any dtype).
void fill(Tensor& dst, double value);
void copy(const Tensor& src, Tensor& dst);            // converts dtype
void axpy(const Tensor& x, double alpha, Tensor& y);  // y += alpha * x
void scale(Tensor& x, double factor);                 // x *= factor

// Elementwise.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out);
// out = residual + x * gamma (residual may be undefined: out = x * gamma). x: (..., C), gamma: (C).
void residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma, Tensor& out);
// dx = g * gamma, dgamma = sum over rows of g * x. Either output may be undefined (not needed).
void channel_scale_backward(const Tensor& g, const Tensor& x, const Tensor& gamma, Tensor& dx,
                            Tensor& dgamma);

}  // namespace cz::cpu

namespace cz::cpu {

// GEMM (OpenBLAS). a: (M, K), b: (K, N), out: (M, N).
void matmul(const Tensor& a, const Tensor& b, Tensor& out);
// x: (M, in), w: (out, in), bias: (out) or undefined, y: (M, out).
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
// gy: (M, out). Each of dx, dw, db may be undefined (not needed).
void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db);

}  // namespace cz::cpu

namespace cz::cpu {

// out (scalar) = factor * sum(x), accumulated in f64.
void sum(const Tensor& x, double factor, Tensor& out);
// out[i] = factor * s for every i, where s is the one element of `scalar`.
void broadcast_scalar(const Tensor& scalar, double factor, Tensor& out);

}  // namespace cz::cpu
